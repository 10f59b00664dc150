package heaptrim

import (
	"runtime/debug"
	"testing"
	"time"
)

// fake is an injectable clock and stats source.
type fake struct {
	now      time.Time
	stats    Stats
	releases int
}

func newFake(t *testing.T) (*fake, *Trimmer) {
	f := &fake{now: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)}
	tr := New(DefaultConfig(), nil)
	tr.Now = func() time.Time { return f.now }
	tr.Read = func() Stats { return f.stats }
	tr.Release = func() {
		f.releases++
		f.stats.Heap -= f.stats.Idle
		f.stats.Idle = 0
	}
	return f, tr
}

// step advances the clock by one interval, during which allocated bytes
// were allocated, then checks.
func (f *fake) step(tr *Trimmer, allocated uint64) bool {
	f.now = f.now.Add(tr.Config.Interval)
	f.stats.Allocated += allocated
	return tr.Check()
}

const mib = 1 << 20

func TestReleasesOnlyWhenIdleEnoughAndQuiet(t *testing.T) {
	f, tr := newFake(t)
	f.stats = Stats{Idle: 100 * mib, Heap: 200 * mib}
	if tr.Check() {
		t.Fatal("released at the first check, without an allocation rate")
	}
	// Busy: 10 MiB/s.
	if f.step(tr, 50*mib) {
		t.Fatal("released while allocating 10 MiB/s")
	}
	// Quiet: 100 KiB/s.
	if !f.step(tr, 500<<10) {
		t.Fatal("did not release 100 MiB idle of 200 while quiet")
	}
	if f.releases != 1 {
		t.Fatalf("%d releases, want 1", f.releases)
	}
	// Idle again soon after: within MinGap nothing happens.
	f.stats.Idle, f.stats.Heap = 80*mib, 180*mib
	for i := 0; i < 10; i++ {
		if f.step(tr, 0) {
			t.Fatalf("released again %s after the last", time.Duration(i+1)*tr.Config.Interval)
		}
	}
	f.now = f.now.Add(tr.Config.MinGap)
	if !f.step(tr, 0) || f.releases != 2 {
		t.Fatalf("no second release after MinGap (%d releases)", f.releases)
	}
}

func TestThresholds(t *testing.T) {
	for _, c := range []struct {
		name       string
		idle, heap uint64
		want       bool
	}{
		{"a quarter and 16 MiB", 25 * mib, 100 * mib, true},
		{"under a quarter", 24 * mib, 100 * mib, false},
		{"a quarter but under 16 MiB", 15 * mib, 40 * mib, false},
		{"nothing idle", 0, 100 * mib, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, tr := newFake(t)
			f.stats = Stats{Idle: c.idle, Heap: c.heap}
			tr.Check()
			if got := f.step(tr, 0); got != c.want {
				t.Fatalf("released %v, want %v", got, c.want)
			}
		})
	}
}

// garbage keeps the compiler from dropping the test's allocations.
var garbage []byte

// TestReadRuntime: the runtime's metrics are all known to this Go, and
// the heap holds what was just allocated.
func TestReadRuntime(t *testing.T) {
	keep := make([]byte, 8*mib)
	s := ReadRuntime()
	if s.Heap < 8*mib || s.Allocated < 8*mib || s.Idle > s.Heap {
		t.Fatalf("implausible runtime stats %+v", s)
	}
	// Garbage counts as idle before any collection frees it (none runs
	// meanwhile: GOGC off for the test).
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	debug.FreeOSMemory() // a collection, and the free spans returned: not resident, not idle
	before := ReadRuntime().Idle
	for i := 0; i < 64; i++ {
		garbage = make([]byte, mib)
	}
	if after := ReadRuntime().Idle; after < before+32*mib {
		t.Fatalf("64 MiB of garbage: idle %d → %d MiB", before>>20, after>>20)
	}
	keep[0] = 1
	_ = keep[len(keep)-1]
}
