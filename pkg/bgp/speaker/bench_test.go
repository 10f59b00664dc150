package speaker

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	gobgpapi "github.com/osrg/gobgp/v3/api"

	"github.com/tendril-net/tendril/pkg/bgp"
	"github.com/tendril-net/tendril/pkg/freeport"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkAddressToPeerRIB: 100 LoadBalancer addresses, one at a time,
// from the Apply that adds one to its best path in the peer's table (a
// gobgp router on loopback, told by its own watch): p50 and p99.
func BenchmarkAddressToPeerRIB(b *testing.B) {
	port, err := freeport.Loopback()
	if err != nil {
		b.Fatal(err)
	}
	r := router(b, port, 65001)
	pool, err := bgp.ParsePool(&v1alpha1.TendrilLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: "lb"},
		Spec: v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{CIDR: "172.31.0.0/16"}}}})
	if err != nil {
		b.Fatal(err)
	}
	allowed := bgp.NewAllowed(nil, []bgp.Pool{pool})
	learned := make(chan string, 1024)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := r.WatchEvent(ctx, &gobgpapi.WatchEventRequest{Table: &gobgpapi.WatchEventRequest_Table{
		Filters: []*gobgpapi.WatchEventRequest_Table_Filter{{Type: gobgpapi.WatchEventRequest_Table_Filter_BEST}}}},
		func(ev *gobgpapi.WatchEventResponse) {
			for _, p := range ev.GetTable().GetPaths() {
				if !p.IsWithdraw && p.NeighborIp == "127.0.0.1" {
					if n, err := p.Nlri.UnmarshalNew(); err == nil {
						if pre, ok := n.(*gobgpapi.IPAddressPrefix); ok {
							learned <- fmt.Sprintf("%s/%d", pre.Prefix, pre.PrefixLen)
						}
					}
				}
			}
		}); err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := New(slog.New(slog.DiscardHandler), -1)
		d := desired(port, 65000)
		if _, err := s.Apply(ctx, d, netip.MustParseAddr("10.0.0.1"), allowed); err != nil {
			b.Fatal(err)
		}
		// The session first: what is measured is an address's way to
		// the peer's table, not the session's setup.
		up := time.Now()
		for {
			if ps, _ := s.Peers(ctx); len(ps) == 1 && ps[0].SessionState == "established" {
				break
			}
			if time.Since(up) > time.Minute {
				b.Fatal("no session")
			}
			time.Sleep(10 * time.Millisecond)
		}
		for j := range 100 {
			prefix := netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 31, byte(j / 250), byte(1 + j%250)}), 32)
			d.Adverts = append(d.Adverts, bgp.Advert{Prefix: prefix, Source: "bench"})
			start := time.Now()
			if _, err := s.Apply(ctx, d, netip.MustParseAddr("10.0.0.1"), allowed); err != nil {
				b.Fatal(err)
			}
			for got := range learned {
				if got == prefix.String() {
					break
				}
			}
			lat = append(lat, time.Since(start))
		}
		s.Stop(ctx)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkSpeakerMemory1000Prefixes: the heap the speaker holds for
// 1,000 announced prefixes (a started speaker with no session: its own
// RIB), after a GC.
func BenchmarkSpeakerMemory1000Prefixes(b *testing.B) {
	pool, err := bgp.ParsePool(&v1alpha1.TendrilLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: "lb"},
		Spec: v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{CIDR: "172.31.0.0/16"}}}})
	if err != nil {
		b.Fatal(err)
	}
	allowed := bgp.NewAllowed(nil, []bgp.Pool{pool})
	ctx := context.Background()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var perPrefix, total float64
	for i := 0; i < b.N; i++ {
		s := New(slog.New(slog.DiscardHandler), -1)
		d := bgp.Desired{Config: "bench", LocalASN: 65001}
		if _, err := s.Apply(ctx, d, netip.MustParseAddr("10.0.0.1"), allowed); err != nil {
			b.Fatal(err)
		}
		before := heap()
		for j := range 1000 {
			d.Adverts = append(d.Adverts, bgp.Advert{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 31, byte(j / 250), byte(1 + j%250)}), 32)})
		}
		if _, err := s.Apply(ctx, d, netip.MustParseAddr("10.0.0.1"), allowed); err != nil {
			b.Fatal(err)
		}
		after := heap()
		total = float64(after) - float64(before)
		perPrefix = total / 1000
		s.Stop(ctx)
	}
	b.ReportMetric(total/1024, "KiB-per-1000")
	b.ReportMetric(perPrefix, "B/prefix")
}
