package lbmap

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/maglev"
)

// benchTables fills the services tables through the writer with n
// services of 10 backends each; shared: every service has the same 10
// backend addresses (as the services benchmark's few listeners behind many
// Service objects), else each its own.
func benchTables(b *testing.B, n int, shared bool) *loadbalancer.Tables {
	b.Helper()
	db := statedb.New()
	t, err := loadbalancer.NewTables(db)
	if err != nil {
		b.Fatal(err)
	}
	w := loadbalancer.NewWriter(t, "node")
	ip := netip.MustParseAddr("10.96.0.1")
	for i := 0; i < n; i++ {
		name := loadbalancer.ServiceName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}
		if err := w.UpsertService(&loadbalancer.Service{Name: name, Type: "ClusterIP", Addresses: []netip.Addr{ip},
			Ports: []loadbalancer.ServicePort{{Name: "http", Port: 80, Proto: loadbalancer.TCP}}}); err != nil {
			b.Fatal(err)
		}
		var backends []*loadbalancer.Backend
		for j := 0; j < 10; j++ {
			a := netip.AddrFrom4([4]byte{10, 244, 0, byte(1 + j)})
			if !shared {
				a = netip.AddrFrom4([4]byte{10, byte(100 + i>>16), byte(i >> 8), byte(i)})
			}
			backends = append(backends, &loadbalancer.Backend{Addr: netip.AddrPortFrom(a, uint16(8080+j)), Proto: loadbalancer.TCP,
				PortName: "http", NodeName: "node", Ready: true, Serving: true})
		}
		if err := w.SetBackends(name, "slice-1", backends); err != nil {
			b.Fatal(err)
		}
		ip = ip.Next()
	}
	return t
}

// BenchmarkPrivilegedProgramServices: the reconciler's operations writing
// every frontend of the table into empty LB maps (what the agent does
// once the caches have synced), for services of 10 backends. Reports the
// time per whole table and per service.
func BenchmarkPrivilegedProgramServices(b *testing.B) {
	for _, c := range []struct {
		services int
		shared   bool
	}{{1000, true}, {10000, true}, {25000, true}, {100000, true}, {1000, false}, {5000, false}} {
		kind := "shared-backends"
		if !c.shared {
			kind = "own-backends"
		}
		b.Run(fmt.Sprintf("%d-services-%s", c.services, kind), func(b *testing.B) {
			base := heapInUse()
			t := benchTables(b, c.services, c.shared)
			var fronts []*loadbalancer.Frontend
			for f := range t.Frontends.All(t.DB.ReadTxn()) {
				fronts = append(fronts, f)
			}
			var total time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				m := newLBMaps(b)
				o := New(m, maglev.Config{Size: maglev.DefaultSize}, quiet())
				b.StartTimer()
				start := time.Now()
				for _, f := range fronts {
					if err := o.Update(context.Background(), nil, 0, f); err != nil {
						b.Fatal(err)
					}
				}
				total += time.Since(start)
				b.StopTimer()
				if n, err := m.ServiceMap().Count(); err != nil || n != c.services {
					b.Fatalf("service map holds %d entries (%v), want %d", n, err, c.services)
				}
				if i == b.N-1 {
					// The tables and the reconciler's state, as the
					// agent holds them (informer caches not included).
					b.ReportMetric(float64(heapInUse()-base)/(1<<20), "heap-MiB")
					runtime.KeepAlive(o)
				}
				m.Close()
				b.StartTimer()
			}
			runtime.KeepAlive(t)
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/table")
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N*c.services), "ns/service")
		})
	}
}

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkPrivilegedChangeOneService: one frontend of 10,000 gets a new
// backend set (one backend replaced), the operation the reconciler runs
// for a changed EndpointSlice.
func BenchmarkPrivilegedChangeOneService(b *testing.B) {
	t := benchTables(b, 10000, true)
	m := newLBMaps(b)
	o := New(m, maglev.Config{Size: maglev.DefaultSize}, quiet())
	var fronts []*loadbalancer.Frontend
	for f := range t.Frontends.All(t.DB.ReadTxn()) {
		if err := o.Update(context.Background(), nil, 0, f); err != nil {
			b.Fatal(err)
		}
		fronts = append(fronts, f)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f := *fronts[i%len(fronts)]
		f.Backends = append([]loadbalancer.FrontendBackend(nil), f.Backends...)
		f.Backends[0].Addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 245, byte(i >> 8), byte(i)}), 8080)
		if err := o.Update(context.Background(), nil, 0, &f); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if n, err := m.ServiceMap().Count(); err != nil || n != len(fronts) {
		b.Fatalf("service map holds %d entries (%v), want %d", n, err, len(fronts))
	}
}
