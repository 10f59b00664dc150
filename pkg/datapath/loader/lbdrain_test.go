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
			f.Backends = append(f.Backends, loadbalancer.FrontendBackend{Addr: b, Active: true})
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

	// The service goes.
	if err := ops.Delete(ctx, nil, 0, frontend()); err != nil {
		t.Fatal(err)
	}
	reply("reply after the service was deleted")
	if released, err := ops.ReleaseDrained(); err != nil || released != 0 {
		t.Fatalf("released %d (%v) while the flow lives", released, err)
	}
	if rv, bk := ops.Draining(); rv != 1 || bk != 2 {
		t.Fatalf("draining %d reverse NAT, %d backends; want 1 and 2 (b1, b2)", rv, bk)
	}
	b1ID := ids.Backends[b1]
	if b, ok, _ := n.l.Maps().LB.BackendMap().Lookup(b1ID); !ok || b.State != maps.BackendStateTerminating {
		t.Fatalf("b1 while draining: %+v %v, want terminating", b, ok)
	}

	// The flows end: conntrack GC removes their entries.
	entries, err := ct.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.RevNAT != 0 {
			if e.RevNAT != uint16(ids.RevNAT) {
				t.Errorf("conntrack entry %+v: reverse NAT %d, want %d", e, e.RevNAT, ids.RevNAT)
			}
			if err := ct.Delete(e); err != nil {
				t.Fatal(err)
			}
		}
	}
	if released, err := ops.ReleaseDrained(); err != nil || released != 3 {
		t.Fatalf("released %d (%v) after the flows ended, want 3", released, err)
	}
	if _, ok, _ := n.l.Maps().LB.RevNATMap().Lookup(ids.RevNAT); ok {
		t.Error("reverse NAT entry still there after the flows ended")
	}
	if _, ok, _ := n.l.Maps().LB.BackendMap().Lookup(b1ID); ok {
		t.Error("b1 still there after the flows ended")
	}
}
