// Package heaptrim returns the Go heap's idle memory to the kernel once a
// burst of allocation (the agent's start, a resync of every Service) is
// over.
//
// With GOGC 100 the heap grows to twice what is live before a collection;
// after it, the freed spans stay mapped and resident. The runtime's
// background scavenger returns only what lies above the next heap goal
// (plus about 10 %), so after a burst an idle agent keeps about twice its
// live heap resident for as long as it stays idle: at 10,000 Services that
// was ≈ 100 MiB of RSS holding nothing (docs/benchmarks.md, "Memory
// (issue 31)"). A Trimmer checks every Interval and, when what a
// collection would give back (the resident heap less what was live at the
// last collection) is both a quarter of the heap and at least MinIdle,
// and the process allocated less than QuietRate per second since the last
// check, calls debug.FreeOSMemory: one forced collection and every free
// page returned, and the binary's read-only pages unmapped. It does so at
// most once per MinGap, so a busy agent is not collected over and over;
// while the agent allocates it does nothing.
package heaptrim

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/pkg/binpages"
)

// Stats is what a decision needs, in bytes.
type Stats struct {
	// Idle is what a collection and a release would return: the
	// resident heap less the live heap of the last collection. An idle
	// process may not have collected since its peak, so its garbage
	// still counts as objects, not free spans: free spans alone would
	// never cross the threshold (a first version read only those and
	// never fired in the services benchmark).
	Idle uint64
	// Heap is the heap's resident total: objects (live and dead), the
	// unused parts of their spans, and the free spans not returned.
	Heap uint64
	// Allocated is the bytes allocated since the process started.
	Allocated uint64
}

// Config sets the thresholds; DefaultConfig gives the agent's.
type Config struct {
	Interval     time.Duration
	MinIdle      uint64
	IdleFraction float64 // of Heap
	// QuietRate is the allocation rate (bytes/s) under which the
	// process counts as idle.
	QuietRate float64
	MinGap    time.Duration
}

// DefaultConfig: every 5 s; at least 16 MiB and a quarter of the heap
// idle; under 1 MiB/s allocated; at most once per 2 minutes.
func DefaultConfig() Config {
	return Config{Interval: 5 * time.Second, MinIdle: 16 << 20, IdleFraction: 0.25, QuietRate: 1 << 20, MinGap: 2 * time.Minute}
}

// Trimmer decides and releases. Now, Read and Release default to the
// clock, the runtime's metrics and debug.FreeOSMemory; tests replace them.
type Trimmer struct {
	Config  Config
	Log     *slog.Logger
	Now     func() time.Time
	Read    func() Stats
	Release func()

	releases prometheus.Counter
	released prometheus.Counter

	last      time.Time // last release (zero: none yet)
	prevAt    time.Time // last check
	prevAlloc uint64
}

// New is a Trimmer on the process's runtime.
func New(cfg Config, log *slog.Logger) *Trimmer {
	return &Trimmer{Config: cfg, Log: log, Now: time.Now, Read: ReadRuntime, Release: release,
		releases: prometheus.NewCounter(prometheus.CounterOpts{Name: "tendril_heaptrim_releases_total",
			Help: "Times the idle Go heap was returned to the kernel after allocation went quiet"}),
		released: prometheus.NewCounter(prometheus.CounterOpts{Name: "tendril_heaptrim_released_bytes_total",
			Help: "Idle Go heap bytes (resident, not yet returned) found at each release"}),
	}
}

// release returns the idle heap and unmaps the binary's read-only pages
// (pkg/binpages: what a burst ran and will not run again leaves the
// resident set; the agent's steady work maps its own pages back).
func release() {
	debug.FreeOSMemory()
	_, _ = binpages.Release()
}

// Collectors are the Trimmer's metrics, to register.
func (t *Trimmer) Collectors() []prometheus.Collector {
	return []prometheus.Collector{t.releases, t.released}
}

// Check reads the stats once and releases if the thresholds say so; it
// reports whether it did. The first check only records the allocation
// count: a rate needs two.
func (t *Trimmer) Check() bool {
	now, s := t.Now(), t.Read()
	prevAt, prevAlloc := t.prevAt, t.prevAlloc
	t.prevAt, t.prevAlloc = now, s.Allocated
	if prevAt.IsZero() || !now.After(prevAt) {
		return false
	}
	rate := float64(s.Allocated-prevAlloc) / now.Sub(prevAt).Seconds()
	switch {
	case s.Idle < t.Config.MinIdle, float64(s.Idle) < t.Config.IdleFraction*float64(s.Heap):
		return false
	case rate >= t.Config.QuietRate:
		return false
	case !t.last.IsZero() && now.Sub(t.last) < t.Config.MinGap:
		return false
	}
	t.Release()
	t.last = now
	// The release forced a collection, which allocates nothing worth
	// counting towards the next rate, but read again so that its own
	// bookkeeping does not either.
	t.prevAlloc = t.Read().Allocated
	if t.releases != nil {
		t.releases.Inc()
		t.released.Add(float64(s.Idle))
	}
	if t.Log != nil {
		t.Log.Info("Returned the idle heap to the kernel", "idleMiB", s.Idle>>20, "heapMiB", s.Heap>>20,
			"allocRateKiBps", int(rate/1024))
	}
	return true
}

// Run checks every Config.Interval until ctx ends.
func (t *Trimmer) Run(ctx context.Context) error {
	tick := time.NewTicker(t.Config.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			t.Check()
		}
	}
}

// The runtime/metrics names read: unlike runtime.ReadMemStats they do not
// stop the world.
var runtimeNames = []string{
	"/memory/classes/heap/free:bytes",    // free spans, resident
	"/memory/classes/heap/objects:bytes", // live and not yet swept objects
	"/memory/classes/heap/unused:bytes",  // the rest of their spans
	"/gc/heap/allocs:bytes",              // cumulative
	"/gc/heap/live:bytes",                // marked live by the last collection
}

// ReadRuntime reads Stats from runtime/metrics.
func ReadRuntime() Stats {
	samples := make([]metrics.Sample, len(runtimeNames))
	for i, n := range runtimeNames {
		samples[i].Name = n
	}
	metrics.Read(samples)
	v := func(i int) uint64 {
		if samples[i].Value.Kind() != metrics.KindUint64 {
			return 0 // a name this runtime does not know
		}
		return samples[i].Value.Uint64()
	}
	heap, live := v(0)+v(1)+v(2), v(4)
	idle := uint64(0)
	if heap > live {
		idle = heap - live
	}
	return Stats{Idle: idle, Heap: heap, Allocated: v(3)}
}
