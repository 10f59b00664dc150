package socklb

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// BenchmarkPrivilegedSocketLBConnect: TCP connect latency through the
// socket load-balancer with 100, 10,000 and 100,000 services of 10
// backends each in the maps, against the same connect to a backend's own
// address (the floor), interleaved in one child process in the hooked
// cgroup; and the connect4 hook's own run time per call (kernel BPF
// statistics). Run with -benchtime 1x: each size is one run of 2,000
// connects of each kind (after 200 warm-up ones). The reported p50/p99 are
// of the connect system call; hook-ns/call is what the translation costs
// of it.
func BenchmarkPrivilegedSocketLBConnect(b *testing.B) {
	for _, n := range []int{100, 10000, 100000} {
		b.Run(fmt.Sprintf("services-%d", n), func(b *testing.B) {
			e := setupWith(b, false)
			// Backends 127.0.0.1..10:8080, one listener (0.0.0.0:8080)
			// behind them; service i at 10.96.0.0 + i, port 80.
			var bids []uint32
			for j := 1; j <= 10; j++ {
				id := uint32(j)
				if err := e.maps.BackendMap().Upsert(id, maps.Backend{Addr: netip.AddrFrom4([4]byte{127, 0, 0, byte(j)}), Port: 8080}); err != nil {
					b.Fatal(err)
				}
				bids = append(bids, id)
			}
			base := netip.MustParseAddr("10.96.0.0").As4()
			feOf := func(i int) netip.AddrPort {
				a := base
				v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + uint32(i) + 1
				return netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 80)
			}
			t0 := time.Now()
			for i := 0; i < n; i++ {
				fe := feOf(i)
				id := uint32(100 + i)
				if err := e.maps.ApplyService(maps.Frontend{Addr: fe.Addr(), Port: 80, Proto: maps.ProtoTCP}, maps.Service{ID: id, RevNATID: id}, bids, 0); err != nil {
					b.Fatal(err)
				}
			}
			b.Logf("%d services written in %s", n, time.Since(t0).Round(time.Millisecond))
			const warm, count = 200, 2000
			req := helperRequest{TCPServers: []helperServer{{Addr: "0.0.0.0:8080", Name: "backend"}},
				Probes: []helperProbe{{Kind: "tcp-connect", Dst: feOf(0).String(), Count: warm + count, Spread: n, Floor: "127.0.0.1:8080"}}}
			prog := connect4Program(b, e.root)
			stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
			if err != nil {
				b.Fatal(err)
			}
			defer stats.Close()
			before, err := prog.Stats()
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			res := runHelper(b, e.cgroup, req)
			b.StopTimer()
			after, err := prog.Stats()
			if err != nil {
				b.Fatal(err)
			}
			var svc, floor []time.Duration
			for i, r := range res[0] {
				if r.Err != "" {
					b.Fatalf("probe %d: %s", i, r.Err)
				}
				if i/2 < warm {
					continue
				}
				d := time.Duration(r.ConnectNanos)
				if i%2 == 0 {
					svc = append(svc, d)
				} else {
					floor = append(floor, d)
				}
			}
			pct := func(d []time.Duration, p float64) float64 {
				slices.Sort(d)
				return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e3
			}
			b.ReportMetric(pct(svc, 0.5), "svc-p50-µs")
			b.ReportMetric(pct(svc, 0.99), "svc-p99-µs")
			b.ReportMetric(pct(floor, 0.5), "floor-p50-µs")
			b.ReportMetric(pct(floor, 0.99), "floor-p99-µs")
			if runs := after.RunCount - before.RunCount; runs > 0 {
				b.ReportMetric(float64(after.Runtime-before.Runtime)/float64(runs), "hook-ns/call")
			}
			// The hook's cost per translated connect and per connect to
			// no service, apart.
			for _, c := range []struct {
				metric string
				probe  helperProbe
			}{
				{"hook-hit-ns", helperProbe{Kind: "tcp-connect", Dst: feOf(0).String(), Count: 1000, Spread: n}},
				{"hook-miss-ns", helperProbe{Kind: "tcp-connect", Dst: "127.0.0.1:8080", Count: 1000}},
			} {
				before, err := prog.Stats()
				if err != nil {
					b.Fatal(err)
				}
				runHelper(b, e.cgroup, helperRequest{TCPServers: req.TCPServers, Probes: []helperProbe{c.probe}})
				after, err := prog.Stats()
				if err != nil {
					b.Fatal(err)
				}
				if runs := after.RunCount - before.RunCount; runs > 0 {
					b.ReportMetric(float64(after.Runtime-before.Runtime)/float64(runs), c.metric)
				}
			}
		})
	}
}

// connect4Program is the program of the pinned connect4 link.
func connect4Program(tb testing.TB, root string) *ebpf.Program {
	tb.Helper()
	lk, err := link.LoadPinnedLink(filepath.Join(root, "socklb", "connect4"), nil)
	if err != nil {
		tb.Fatal(err)
	}
	defer lk.Close()
	info, err := lk.Info()
	if err != nil {
		tb.Fatal(err)
	}
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { prog.Close() })
	return prog
}
