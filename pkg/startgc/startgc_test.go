package startgc

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

// currentPercent reads the collector's target (without setting it, which
// would race with checkHeap on the finalizer goroutine).
func currentPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// TestInitAndDone: the package's init raised the target of this test
// binary to StartPercent (unless its GOGC is higher or off), and Done
// puts back the configured one.
func TestInitAndDone(t *testing.T) {
	configured := ConfiguredPercent()
	want := StartPercent
	if configured < 0 || configured >= StartPercent {
		want = configured
	}
	if got := currentPercent(); got != want {
		t.Fatalf("after init: GC percent %d, want %d (GOGC %d)", got, want, configured)
	}
	Done()
	if got := currentPercent(); got != configured {
		t.Fatalf("after Done: GC percent %d, want %d", got, configured)
	}
}

// TestStartTargetEndsAtHeapLimit: once the live heap reaches
// StartHeapLimit, the start target gives way to the configured one
// without Done (a process loading its data before it is ready).
func TestStartTargetEndsAtHeapLimit(t *testing.T) {
	configured := ConfiguredPercent()
	if configured < 0 || configured >= StartPercent {
		t.Skipf("GOGC %d: no start target to end", configured)
	}
	debug.SetGCPercent(StartPercent)
	afterNextGC(checkHeap)
	runtime.GC()
	time.Sleep(100 * time.Millisecond) // the finalizer goroutine runs checkHeap
	if got := currentPercent(); got != StartPercent {
		t.Fatalf("below the limit: GC percent %d, want %d", got, StartPercent)
	}
	held := make([][]byte, 0, 64)
	for range StartHeapLimit / (1 << 20) {
		held = append(held, make([]byte, 1<<20))
	}
	for deadline := time.Now().Add(30 * time.Second); currentPercent() != configured; {
		if time.Now().After(deadline) {
			t.Fatalf("live heap past %d bytes: GC percent still %d, want %d", StartHeapLimit, currentPercent(), configured)
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(held)
}

func TestConfiguredPercent(t *testing.T) {
	for _, c := range []struct {
		env  string
		want int
	}{
		{"", 100},
		{"off", -1},
		{"50", 50},
		{"800", 800},
		{"not-a-number", 100},
		{"+50", 100},
		{"-1", -1},
		{"99999999999", 100},
	} {
		t.Setenv("GOGC", c.env)
		if got := ConfiguredPercent(); got != c.want {
			t.Errorf("GOGC=%q: %d, want %d", c.env, got, c.want)
		}
	}
}
