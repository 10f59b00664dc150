//go:build linux

package policy

import (
	"runtime"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/identity"
)

// threadCPU is the calling thread's user and system time.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkNewIdentityCPU is BenchmarkNewIdentity with each sample's
// thread CPU time (RUSAGE_THREAD, the goroutine locked to its thread)
// beside its wall-clock time. On a loaded machine the wall-clock p99 of a
// few hundred samples is a sample that waited for a CPU; the CPU time is
// what the code costs (docs/benchmarks.md, Core: new identity).
func BenchmarkNewIdentityCPU(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	repo, u, eps := benchCluster(b)
	cache := NewSelectorCache()
	for _, ep := range eps {
		repo.ResolveCached(ep, u, 1, cache)
	}
	b.ResetTimer()
	wall := make([]time.Duration, 0, b.N)
	cpu := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		begin, c0 := time.Now(), threadCPU()
		nu := append(append(Universe{}, u...), Peer{ID: identity.NumericIdentity(60000 + i%1000), Labels: []string{"k8s:app=app0", NamespaceLabel + "=ns0", "k8s:tier=new"}})
		for _, ep := range eps[:20] {
			repo.ResolveCached(ep, nu, uint64(2+i), cache)
		}
		cpu = append(cpu, threadCPU()-c0)
		wall = append(wall, time.Since(begin))
	}
	b.StopTimer()
	for _, s := range [][]time.Duration{wall, cpu} {
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	}
	b.ReportMetric(float64(wall[len(wall)/2].Microseconds())/1000, "wall-p50-ms")
	b.ReportMetric(float64(wall[len(wall)*99/100].Microseconds())/1000, "wall-p99-ms")
	b.ReportMetric(float64(cpu[len(cpu)/2].Microseconds())/1000, "cpu-p50-ms")
	b.ReportMetric(float64(cpu[len(cpu)*99/100].Microseconds())/1000, "cpu-p99-ms")
}
