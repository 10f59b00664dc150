package startgc

import (
	"runtime/debug"
	"testing"
)

// currentPercent reads the collector's target (SetGCPercent returns the
// one it replaces).
func currentPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// TestInitAndDone: the package's init raised the target of this test
// binary to StartPercent (unless its GOGC is higher or off), and Done
// puts back the configured one.
func TestInitAndDone(t *testing.T) {
	// Put back init's target for the next run (-count > 1).
	before := currentPercent()
	t.Cleanup(func() { debug.SetGCPercent(before) })
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
