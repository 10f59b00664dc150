package cni_test

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// BenchmarkPrivilegedConcurrentAdd50 measures CNI ADD from exec to result
// with 50 ADDs started at once on one node, as a node does when 50 pods are
// scheduled together. Each iteration adds 50 pods (timed, each on its own)
// and deletes them (not timed). The latency includes what a runtime pays:
// exec of the plugin (through nsenter), the agent's IPAM and endpoint
// calls, the veth and the pod's addresses and routes.
func BenchmarkPrivilegedConcurrentAdd50(b *testing.B) {
	testutil.Privileged(b)
	benchmarkConcurrentAdd(b, 50)
}

// BenchmarkPrivilegedSerialAdd is the same with one ADD at a time: the
// baseline the concurrent numbers compare against (same machine, same run).
func BenchmarkPrivilegedSerialAdd(b *testing.B) {
	testutil.Privileged(b)
	benchmarkConcurrentAdd(b, 1)
}

func benchmarkConcurrentAdd(b *testing.B, pods int) {
	// TENDRIL_BENCH_AGENT_ARGS adds agent flags, e.g. to profile the agent
	// (--pprof-serve-addr) or to take the eBPF datapath out of the
	// measurement (--enable-datapath=false).
	n := startNode(b, strings.Fields(os.Getenv("TENDRIL_BENCH_AGENT_ARGS"))...)
	list := n.confList("tendril-cni", "1.1.0", nil)
	ps := make([]*pod, pods)
	for i := range ps {
		ps[i] = n.newPod(fmt.Sprintf("bench-%d", i))
	}
	var lat []time.Duration
	b.ResetTimer()
	for range b.N {
		durs := make([]time.Duration, pods)
		errs := make([]error, pods)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, p := range ps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				_, errs[i] = n.add(list, p)
				durs[i] = time.Since(t0)
			}()
		}
		close(start)
		wg.Wait()
		b.StopTimer()
		for i, err := range errs {
			if err != nil {
				b.Fatalf("ADD %s: %v", ps[i].name, err)
			}
		}
		lat = append(lat, durs...)
		for _, p := range ps {
			if err := n.del(list, p); err != nil {
				b.Fatalf("DEL %s: %v", p.name, err)
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(q float64) float64 {
		return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(float64(len(lat)), "adds")
}
