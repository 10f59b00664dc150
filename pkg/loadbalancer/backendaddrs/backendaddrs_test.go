package backendaddrs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

type fixture struct {
	t      *testing.T
	tables *loadbalancer.Tables
	w      *loadbalancer.Writer
	x      *Index
	f      *Follower
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := statedb.New()
	tables, err := loadbalancer.NewTables(db)
	if err != nil {
		t.Fatal(err)
	}
	x := New()
	f, err := NewFollower(x, db, tables.Backends)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.changes.Close)
	return &fixture{t: t, tables: tables, w: loadbalancer.NewWriter(tables, "node-a"), x: x, f: f}
}

func (fx *fixture) set(svc loadbalancer.ServiceName, source string, addrs ...string) {
	fx.t.Helper()
	var bs []*loadbalancer.Backend
	for _, a := range addrs {
		proto := loadbalancer.TCP
		if s, ok := cutSuffix(a, "/udp"); ok {
			a, proto = s, loadbalancer.UDP
		}
		bs = append(bs, &loadbalancer.Backend{Addr: netip.MustParseAddrPort(a), Proto: proto})
	}
	if err := fx.w.SetBackends(svc, source, bs); err != nil {
		fx.t.Fatal(err)
	}
}

func cutSuffix(s, suffix string) (string, bool) { return strings.CutSuffix(s, suffix) }

func (fx *fixture) step() { fx.f.Step(fx.tables.DB.ReadTxn()) }

// expect checks ServiceOf for each address ("" for none).
func (fx *fixture) expect(want map[string]string) {
	fx.t.Helper()
	for q, w := range want {
		addr, proto := q, loadbalancer.TCP
		if a, ok := cutSuffix(q, "/udp"); ok {
			addr, proto = a, loadbalancer.UDP
		}
		got, ok := fx.x.ServiceOf(netip.MustParseAddrPort(addr), proto)
		if s := got.String(); !ok && w != "" || ok && s != w {
			fx.t.Errorf("%s: %q (found %v), want %q", q, s, ok, w)
		}
	}
}

// TestServiceOf: an address names its service, an IPv4 address the same
// as its IPv4-mapped form; another port, protocol or family names none;
// a shared address names the first service by name while two list it,
// and the other once the first stops listing it.
func TestServiceOf(t *testing.T) {
	fx := newFixture(t)
	a := loadbalancer.ServiceName{Namespace: "ns", Name: "a"}
	b := loadbalancer.ServiceName{Namespace: "ns", Name: "b"}
	fx.set(b, "b-1", "10.0.0.1:80", "10.0.0.1:80/udp")
	fx.set(a, "a-1", "10.0.0.1:80", "[fd00::1]:80")
	fx.step()
	fx.expect(map[string]string{
		"10.0.0.1:80": "ns/a", "[::ffff:10.0.0.1]:80": "ns/a", "10.0.0.1:80/udp": "ns/b",
		"10.0.0.1:81": "", "[fd00::1]:80": "ns/a", "[::1]:80": "", "10.0.0.2:80": "",
	})
	if n := fx.x.Len(); n != 3 {
		t.Fatalf("%d addresses, want 3", n)
	}
	fx.set(a, "a-1")
	fx.step()
	fx.expect(map[string]string{"10.0.0.1:80": "ns/b", "[fd00::1]:80": "", "10.0.0.1:80/udp": "ns/b"})
	if err := fx.w.DeleteService(b); err != nil {
		t.Fatal(err)
	}
	fx.set(b, "b-1")
	fx.step()
	fx.expect(map[string]string{"10.0.0.1:80": "", "10.0.0.1:80/udp": ""})
	if n, names, free := fx.x.Len(), len(fx.x.ids), len(fx.x.free); n != 0 || names != 0 || free != 2 || len(fx.x.v4.more) != 0 {
		t.Fatalf("empty index holds %d addresses, %d service numbers, %d free; want 0, 0, 2", n, names, free)
	}
}

// TestTwoSourcesOfOneService: one service's address listed by two
// EndpointSlices stays named while either lists it, also when one goes
// and the other comes within one step.
func TestTwoSourcesOfOneService(t *testing.T) {
	fx := newFixture(t)
	a := loadbalancer.ServiceName{Namespace: "ns", Name: "a"}
	fx.set(a, "a-1", "10.0.0.1:80")
	fx.set(a, "a-2", "10.0.0.1:80")
	fx.step()
	fx.set(a, "a-1")
	fx.step()
	fx.expect(map[string]string{"10.0.0.1:80": "ns/a"})
	fx.set(a, "a-1", "10.0.0.1:80")
	fx.set(a, "a-2")
	fx.step()
	fx.expect(map[string]string{"10.0.0.1:80": "ns/a"})
	fx.set(a, "a-1")
	fx.step()
	fx.expect(map[string]string{"10.0.0.1:80": ""})
}

// TestMatchesTheTable: after random changes, each applied in steps of
// random size, every address names what a scan of the table names (the
// first service by name listing it) and nothing else is named.
func TestMatchesTheTable(t *testing.T) {
	fx := newFixture(t)
	r := rand.New(rand.NewPCG(1, 2))
	var svcs []loadbalancer.ServiceName
	for i := range 6 {
		svcs = append(svcs, loadbalancer.ServiceName{Namespace: "ns", Name: fmt.Sprintf("s%d", i)})
	}
	addrs := []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "[fd00::1]:80", "10.0.0.1:81"}
	for round := range 300 {
		svc := svcs[r.IntN(len(svcs))]
		var picked []string
		for _, a := range addrs {
			if r.IntN(3) == 0 {
				picked = append(picked, a)
			}
		}
		fx.set(svc, fmt.Sprintf("src-%d", r.IntN(2)), picked...)
		if r.IntN(3) == 0 {
			fx.step()
			truth := map[string]string{}
			for _, a := range addrs {
				truth[a] = ""
			}
			for be := range fx.tables.Backends.All(fx.tables.DB.ReadTxn()) {
				a := be.Addr.String()
				if cur := truth[a]; cur == "" || be.Service.String() < cur {
					truth[a] = be.Service.String()
				}
			}
			fx.expect(truth)
			if t.Failed() {
				t.Fatalf("round %d", round)
			}
		}
	}
}

// TestRunFollows: Run picks up a change made after it started and stops
// with its context.
func TestRunFollows(t *testing.T) {
	fx := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); fx.f.Run(ctx) }()
	fx.set(loadbalancer.ServiceName{Namespace: "ns", Name: "a"}, "a-1", "10.0.0.9:80")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s, ok := fx.x.ServiceOf(netip.MustParseAddrPort("10.0.0.9:80"), loadbalancer.TCP); ok && s.Name == "a" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Run did not name the new backend's service")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
}

// BenchmarkIndexMemory: the index's heap at 10,000 services of 10
// backends (the statedb address index it replaced held 12.6 MiB there).
func BenchmarkIndexMemory(b *testing.B) {
	for range b.N {
		x := New()
		base := liveHeap()
		ip := netip.MustParseAddr("10.1.0.0")
		for i := range 10000 {
			svc := loadbalancer.ServiceName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}
			for j := range 10 {
				x.add(netip.AddrPortFrom(ip, uint16(8080+j)), loadbalancer.TCP, svc)
				ip = ip.Next()
			}
		}
		b.ReportMetric(float64(liveHeap()-base)/(1<<20), "heap-MiB")
		runtime.KeepAlive(x)
	}
}

func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
