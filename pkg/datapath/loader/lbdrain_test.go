package loader

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/lbmap"
	"github.com/tendril-net/tendril/pkg/loadbalancer/maglev"
)

// TestPrivilegedServiceFlowOutlivesBackendAndService: the LB maps written
// by the reconciler's operations (lbmap.Ops, draining on the node's
// conntrack) under a per-packet translated TCP flow. The flow's backend
// leaves the service: the flow keeps going to it and its replies still
// come from the frontend; the service is deleted: replies are still
// reverse translated. Neither entry goes while the flow's conntrack entry
// lives; once it is gone (the flow ended and conntrack GC removed it),
// both are deleted and their IDs freed.
func TestPrivilegedServiceFlowOutlivesBackendAndService(t *testing.T) {
	n := newTestNode(t)
	n.addEndpoints(false, false)
	from, to := n.l.Programs()
	ops := lbmap.New(n.l.Maps().LB, maglev.DefaultConfig(), slog.New(slog.DiscardHandler))
	ct := n.l.Maps().CTMap()
	ops.KeepWhileFlows(lbmap.CTFlows{CT: ct})
	ctx := context.Background()
	fe := netip.MustParseAddrPort("10.96.0.40:80")
	b1, b2 := netip.MustParseAddrPort("10.2.0.41:8080"), netip.MustParseAddrPort("10.2.0.42:8080")
	frontend := func(backends ...netip.AddrPort) *loadbalancer.Frontend {
		f := &loadbalancer.Frontend{Key: loadbalancer.FrontendKey{Addr: fe, Proto: loadbalancer.TCP}, Service: loadbalancer.ServiceName{Namespace: "ns", Name: "s"}}
		for _, b := range backends {
			f.Backends = append(f.Backends, loadbalancer.FrontendBackend{Backend: &loadbalancer.Backend{Addr: b}, Active: true})
		}
		return f
	}
	if err := ops.Update(ctx, nil, 0, frontend(b1)); err != nil {
		t.Fatal(err)
	}
	ids, _ := ops.FrontendIDs(frontend().Key)
	client := netip.AddrPortFrom(podA, 40100)
	send := func(what string, flags uint8, want netip.AddrPort) {
		t.Helper()
		verdict, out := n.runOut(from, n.ifidx, withL4Checksum(packet(podA, fe.Addr(), l4{proto: 6, sport: client.Port(), dport: 80, tcpFlags: flags})))
		if _, dst := frameTuple(out); verdict != actOK || dst != want {
			t.Fatalf("%s: verdict %d to %s, want pass to %s", what, verdict, dst, want)
		}
	}
	reply := func(what string) {
		t.Helper()
		verdict, out := n.runOut(to, n.ifidx, withL4Checksum(packet(b1.Addr(), podA, l4{proto: 6, sport: b1.Port(), dport: client.Port(), tcpFlags: 0x10, payload: []byte("data")})))
		if src, _ := frameTuple(out); verdict != actOK || src != fe {
			t.Fatalf("%s: reply verdict %d from %s, want pass from the frontend %s", what, verdict, src, fe)
		}
		checkChecksums(t, what, out)
	}
	send("SYN", 0x02, b1)
	reply("SYN-ACK")

	// b1 leaves (b2 replaces it): the flow stays on b1, replies are
	// translated; a new flow goes to b2.
	if err := ops.Update(ctx, nil, 0, frontend(b2)); err != nil {
		t.Fatal(err)
	}
	send("established packet after b1 left", 0x10, b1)
	reply("reply after b1 left")
	if _, dst := frameTuple(func() []byte {
		_, out := n.runOut(from, n.ifidx, withL4Checksum(packet(podA, fe.Addr(), l4{proto: 6, sport: 40101, dport: 80, tcpFlags: 0x02})))
		return out
	}()); dst != b2 {
		t.Fatalf("a new flow went to %s, want b2 %s", dst, b2)
	}

	// A UDP "flow" (a reused source port) to a removed backend is not a
	// connection to keep: it picks a live backend.
	dnsFE := netip.MustParseAddrPort("10.96.0.53:53")
	dns := func(b netip.AddrPort) *loadbalancer.Frontend {
		return &loadbalancer.Frontend{Key: loadbalancer.FrontendKey{Addr: dnsFE, Proto: loadbalancer.UDP}, Service: loadbalancer.ServiceName{Namespace: "ns", Name: "dns"},
			Backends: []loadbalancer.FrontendBackend{{Backend: &loadbalancer.Backend{Addr: b}, Active: true}}}
	}
	query := func() netip.AddrPort {
		t.Helper()
		verdict, out := n.runOut(from, n.ifidx, withL4Checksum(packet(podA, dnsFE.Addr(), l4{proto: 17, sport: 40200, dport: 53, payload: []byte("q")})))
		_, dst := frameTuple(out)
		if verdict != actOK {
			t.Fatalf("UDP query: verdict %d", verdict)
		}
		return dst
	}
	d1, d2 := netip.MustParseAddrPort("10.2.0.51:5353"), netip.MustParseAddrPort("10.2.0.52:5353")
	if err := ops.Update(ctx, nil, 0, dns(d1)); err != nil {
		t.Fatal(err)
	}
	if got := query(); got != d1 {
		t.Fatalf("UDP query went to %s, want %s", got, d1)
	}
	if err := ops.Update(ctx, nil, 0, dns(d2)); err != nil {
		t.Fatal(err)
	}
	if got := query(); got != d2 {
		t.Fatalf("UDP query on the same source port after %s left went to %s, want %s", d1, got, d2)
	}
	if err := ops.Delete(ctx, nil, 0, dns(d2)); err != nil {
		t.Fatal(err)
	}

	// The service goes.
	if err := ops.Delete(ctx, nil, 0, frontend()); err != nil {
		t.Fatal(err)
	}
	reply("reply after the service was deleted")
	if released, err := ops.ReleaseDrained(); err != nil || released != 0 {
		t.Fatalf("released %d (%v) while the flow lives", released, err)
	}
	if rv, bk := ops.Draining(); rv != 2 || bk != 4 {
		t.Fatalf("draining %d reverse NAT, %d backends; want 2 (both services) and 4 (b1, b2, d1, d2)", rv, bk)
	}
	b1ID := ids.Backends[b1]
	if b, ok, _ := n.l.Maps().LB.BackendMap().Lookup(b1ID); !ok || b.State != maps.BackendStateRemoved {
		t.Fatalf("b1 while draining: %+v %v, want removed", b, ok)
	}

	// The flows end: conntrack GC removes their entries.
	entries, err := ct.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.RevNAT != 0 {
			if e.Proto == 6 && e.RevNAT != ids.RevNAT {
				t.Errorf("conntrack entry %+v: reverse NAT %d, want %d", e, e.RevNAT, ids.RevNAT)
			}
			if err := ct.Delete(e); err != nil {
				t.Fatal(err)
			}
		}
	}
	if released, err := ops.ReleaseDrained(); err != nil || released != 6 {
		t.Fatalf("released %d (%v) after the flows ended, want 6", released, err)
	}
	if _, ok, _ := n.l.Maps().LB.RevNATMap().Lookup(ids.RevNAT); ok {
		t.Error("reverse NAT entry still there after the flows ended")
	}
	if _, ok, _ := n.l.Maps().LB.BackendMap().Lookup(b1ID); ok {
		t.Error("b1 still there after the flows ended")
	}
}
