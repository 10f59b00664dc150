package observer

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/hubble/flowmetrics"
)

// benchEvents is a mix like a busy node's: per connection a verdict,
// SYN, SYN-ACK, FIN and RST traces, and a drop now and then; every flow
// between two known pods, over many source ports.
func benchEvents(n int) []loader.Event {
	evs := make([]loader.Event, 0, n)
	for i := 0; len(evs) < n; i++ {
		port := uint16(1024 + i%60000)
		v := loader.Event{Type: maps.EventPolicyVerdict, Direction: maps.DirIngress, EndpointID: 2, Proto: 6, Allowed: true, Cookie: 7,
			Src: webIP, Dst: dbIP, SrcPort: port, DstPort: 5432, SrcIdentity: 1000, DstIdentity: 1001, MatchType: maps.PolicyMatchL3L4, Monotonic: at(0)}
		evs = append(evs, v,
			traceEvent(webIP, dbIP, 6, port, 5432, 0x02, maps.DirEgress, maps.ReasonForwarded, 0),
			traceEvent(dbIP, webIP, 6, 5432, port, 0x12, maps.DirIngress, maps.ReasonCTReply, 0),
			traceEvent(webIP, dbIP, 6, port, 5432, 0x11, maps.DirEgress, maps.ReasonCTEstablished, 0),
			traceEvent(dbIP, webIP, 6, 5432, port, 0x04, maps.DirIngress, maps.ReasonCTReply, 0))
		if i%10 == 0 {
			evs = append(evs, dropEvent(worldA, dbIP, 22, maps.ReasonPolicyDenied, 0))
		}
	}
	return evs[:n]
}

// BenchmarkObserve is the decode rate on one core: events decoded into
// the ring, without and with every flow metric; events/s is the number to
// read (docs/benchmarks.md compares the two, measured in the same run).
func BenchmarkObserve(b *testing.B) {
	evs := benchEvents(4096)
	for _, withMetrics := range []bool{false, true} {
		name := "decode"
		if withMetrics {
			name = "decode+metrics"
		}
		b.Run(name, func(b *testing.B) {
			cfg := Config{Clock: fixedClock}
			if withMetrics {
				m, err := flowmetrics.New(flowmetrics.Config{Metrics: flowmetrics.All}, prometheus.NewRegistry())
				if err != nil {
					b.Fatal(err)
				}
				cfg.Consumers = append(cfg.Consumers, m.Observe)
			}
			o := New(cfg, fakeNode{}, nil)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if err := o.Observe(evs[i%len(evs)]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkRingMemory is the heap a full ring holds: the ring at its
// default size and at 65,535, filled with decoded flows of the mix above
// (each flow its own allocation, as the observer keeps them).
func BenchmarkRingMemory(b *testing.B) {
	for _, size := range []int{DefaultRingCapacity, 65535} {
		b.Run(fmt.Sprintf("flows=%d", size), func(b *testing.B) {
			evs := benchEvents(size)
			var perRing float64
			for range b.N {
				before := heapInUse()
				o := New(Config{Capacity: size, Clock: fixedClock}, fakeNode{}, nil)
				for _, ev := range evs {
					if err := o.Observe(ev); err != nil {
						b.Fatal(err)
					}
				}
				after := heapInUse()
				perRing = float64(after - before)
				runtime.KeepAlive(o)
			}
			b.ReportMetric(perRing/(1<<20), "MiB/ring")
			b.ReportMetric(perRing/float64(size), "B/flow")
		})
	}
}

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
