package lbmap

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/maglev"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// newLBMaps creates the real LB maps, unpinned.
func newLBMaps(t testing.TB) *maps.LBMaps {
	t.Helper()
	testutil.Privileged(t)
	spec, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	mk := func(name string) *ebpf.Map {
		ms := spec.Maps[name].Copy()
		ms.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		return m
	}
	m := &maps.LBMaps{Services4: mk(maps.LB4ServicesMapName), Services6: mk(maps.LB6ServicesMapName), Slots: mk(maps.LBSlotsMapName),
		Backends: mk(maps.LBBackendsMapName), RevNAT: mk(maps.LBRevNATMapName), Affinity: mk(maps.LBAffinityMapName),
		Maglev: mk(maps.LBMaglevMapName), SockRevNAT: mk(maps.LBSockRevNATMapName), SrcRange4: mk(maps.LB4SrcRangeMapName),
		SrcRange6: mk(maps.LB6SrcRangeMapName), Skip4: mk(maps.LB4SkipMapName), Skip6: mk(maps.LB6SkipMapName), SkipSrc: mk(maps.LBSkipSrcMapName)}
	t.Cleanup(m.Close)
	return m
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func fe(addr string, proto uint8, backends ...loadbalancer.FrontendBackend) *loadbalancer.Frontend {
	return &loadbalancer.Frontend{Key: loadbalancer.FrontendKey{Addr: netip.MustParseAddrPort(addr), Proto: proto},
		Service: loadbalancer.ServiceName{Namespace: "ns", Name: "s"}, Backends: backends}
}

func act(addr string) loadbalancer.FrontendBackend {
	return loadbalancer.FrontendBackend{Backend: &loadbalancer.Backend{Addr: netip.MustParseAddrPort(addr)}, Active: true}
}

func slotsOf(t *testing.T, m *maps.LBMaps, f *loadbalancer.Frontend) (maps.Service, []netip.AddrPort) {
	t.Helper()
	s, ok, err := m.ServiceMap().Lookup(maps.Frontend{Addr: f.Key.Addr.Addr(), Port: f.Key.Addr.Port(), Proto: f.Key.Proto})
	if err != nil || !ok {
		t.Fatalf("frontend %s not in the map (%v)", f.Key, err)
	}
	ids, err := m.SlotMap().Get(s.ID, int(s.Count))
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.AddrPort
	for _, id := range ids {
		b, ok, err := m.BackendMap().Lookup(id)
		if err != nil || !ok {
			t.Fatalf("slot backend %d missing (%v)", id, err)
		}
		out = append(out, b.AddrPort())
	}
	return s, out
}

// TestPrivilegedOpsWriteRestorePrune: frontends written with their slots,
// flags and Maglev table; a backend leaving is deleted once unused; a new
// Ops restored from the same maps keeps every ID and allocates none of
// them again; prune removes what the table no longer has.
func TestPrivilegedOpsWriteRestorePrune(t *testing.T) {
	m := newLBMaps(t)
	ctx := context.Background()
	o := New(m, maglev.DefaultConfig(), quiet())
	if _, err := o.Restore(); err != nil {
		t.Fatal(err)
	}
	web := fe("10.96.0.10:80", loadbalancer.TCP, act("10.0.0.1:8080"), act("10.0.0.2:8080"),
		loadbalancer.FrontendBackend{Backend: &loadbalancer.Backend{Addr: netip.MustParseAddrPort("10.0.0.3:8080")}, Terminating: true})
	web.Affinity, web.AffinityTimeout = true, 30
	dns := fe("10.96.0.53:53", loadbalancer.UDP, act("10.0.0.1:8080"))
	dns.Maglev = true
	for _, f := range []*loadbalancer.Frontend{web, dns} {
		if err := o.Update(ctx, nil, 0, f); err != nil {
			t.Fatal(err)
		}
	}
	s, got := slotsOf(t, m, web)
	if len(got) != 2 || got[0].String() != "10.0.0.1:8080" || got[1].String() != "10.0.0.2:8080" {
		t.Fatalf("web slots %v", got)
	}
	if s.Flags != maps.SvcFlagAffinity || s.AffinityTimeout != 30 || s.RevNATID != s.ID {
		t.Fatalf("web service %+v", s)
	}
	ids, _ := o.FrontendIDs(web.Key)
	term, ok, _ := m.BackendMap().Lookup(ids.Backends[netip.MustParseAddrPort("10.0.0.3:8080")])
	if !ok || term.State != maps.BackendStateTerminating {
		t.Fatalf("terminating backend %+v %v", term, ok)
	}
	ds, _ := slotsOf(t, m, dns)
	table, ok, err := m.MaglevMap().Lookup(ds.ID)
	if err != nil || !ok || ds.Flags&maps.SvcFlagMaglev == 0 {
		t.Fatalf("dns Maglev table %v %v flags %x", ok, err, ds.Flags)
	}
	shared := ids.Backends[netip.MustParseAddrPort("10.0.0.1:8080")]
	for i, id := range table {
		if id != shared {
			t.Fatalf("Maglev entry %d = %d, want the only backend %d", i, id, shared)
		}
	}
	if dsIDs, _ := o.FrontendIDs(dns.Key); dsIDs.Backends[netip.MustParseAddrPort("10.0.0.1:8080")] != shared {
		t.Fatal("a backend of two services must have one ID")
	}

	// Scale down: 10.0.0.2 leaves web and, used by nothing else, the map.
	gone := ids.Backends[netip.MustParseAddrPort("10.0.0.2:8080")]
	web2 := fe("10.96.0.10:80", loadbalancer.TCP, act("10.0.0.1:8080"))
	if err := o.Update(ctx, nil, 0, web2); err != nil {
		t.Fatal(err)
	}
	if _, got := slotsOf(t, m, web2); len(got) != 1 {
		t.Fatalf("web slots after scale-down %v", got)
	}
	if _, ok, _ := m.BackendMap().Lookup(gone); ok {
		t.Fatalf("backend %d still in the map after leaving its only service", gone)
	}

	// A restart: a new Ops over the same maps keeps the IDs.
	before := o.ServiceIDs()
	o2 := New(m, maglev.DefaultConfig(), quiet())
	r, err := o2.Restore()
	if err != nil {
		t.Fatal(err)
	}
	if r.Services != 2 || r.RevNAT != 2 {
		t.Fatalf("restored %+v, want 2 services and 2 reverse NAT entries", r)
	}
	if err := o2.Update(ctx, nil, 0, web2); err != nil {
		t.Fatal(err)
	}
	if got, _ := o2.FrontendIDs(web2.Key); got.Service != before[0].ID && got.Service != before[1].ID {
		t.Fatalf("web's ID %d after restore, before %v", got.Service, before)
	}
	// A new frontend gets an ID no restored one has.
	other := fe("10.96.0.99:80", loadbalancer.TCP, act("10.0.0.9:80"))
	if err := o2.Update(ctx, nil, 0, other); err != nil {
		t.Fatal(err)
	}
	oid, _ := o2.FrontendIDs(other.Key)
	for _, b := range before {
		if b.ID == oid.Service {
			t.Fatalf("new frontend reused restored ID %d", oid.Service)
		}
	}
	if oid.Backends[netip.MustParseAddrPort("10.0.0.9:80")] == shared {
		t.Fatal("new backend reused a restored backend ID")
	}
	// Prune with only web and other in the table: dns goes, the shared
	// backend stays (web uses it), dns's reverse NAT goes.
	all := func(yield func(*loadbalancer.Frontend, statedb.Revision) bool) {
		for _, f := range []*loadbalancer.Frontend{web2, other} {
			if !yield(f, 0) {
				return
			}
		}
	}
	if err := o2.Prune(ctx, nil, all); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := m.ServiceMap().Lookup(maps.Frontend{Addr: dns.Key.Addr.Addr(), Port: 53, Proto: loadbalancer.UDP}); ok {
		t.Fatal("dns frontend not pruned")
	}
	if _, ok, _ := m.MaglevMap().Lookup(ds.ID); ok {
		t.Fatal("dns Maglev table not pruned")
	}
	if _, ok, _ := m.RevNATMap().Lookup(ds.RevNATID); ok {
		t.Fatal("dns reverse NAT not pruned")
	}
	if _, ok, _ := m.BackendMap().Lookup(shared); !ok {
		t.Fatal("shared backend pruned while web uses it")
	}
	if err := o2.Delete(ctx, nil, 0, other); err != nil {
		t.Fatal(err)
	}
	if n, _ := m.BackendMap().Count(); n != 1 {
		t.Fatalf("%d backends left, want web's one", n)
	}
}

// TestPrivilegedBackendLeavesAndReturnsAcrossRestart: a backend that left
// and came back has a new ID; a restart keeps that one.
func TestPrivilegedBackendLeavesAndReturnsAcrossRestart(t *testing.T) {
	m := newLBMaps(t)
	ctx := context.Background()
	o := New(m, maglev.DefaultConfig(), quiet())
	if _, err := o.Restore(); err != nil {
		t.Fatal(err)
	}
	term := loadbalancer.FrontendBackend{Backend: &loadbalancer.Backend{Addr: netip.MustParseAddrPort("10.0.0.2:80")}, Terminating: true, Active: true}
	steps := []*loadbalancer.Frontend{
		fe("10.96.0.1:80", loadbalancer.TCP, act("10.0.0.1:80"), act("10.0.0.2:80")),
		fe("10.96.0.1:80", loadbalancer.TCP, term),
		fe("10.96.0.1:80", loadbalancer.TCP, act("10.0.0.1:80"), act("10.0.0.2:80")),
	}
	for _, f := range steps {
		if err := o.Update(ctx, nil, 0, f); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := o.FrontendIDs(steps[2].Key)
	n, _ := m.BackendMap().Count()
	if n != 2 {
		t.Fatalf("%d backends in the map, want 2", n)
	}
	o2 := New(m, maglev.DefaultConfig(), quiet())
	if _, err := o2.Restore(); err != nil {
		t.Fatal(err)
	}
	if err := o2.Update(ctx, nil, 0, steps[2]); err != nil {
		t.Fatal(err)
	}
	after, _ := o2.FrontendIDs(steps[2].Key)
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("IDs before %+v, after the restart %+v", before, after)
	}
}

// TestPrivilegedOpsReportRemovedBackends: an Update that takes a backend
// out of a frontend reports it (with the frontend's reverse NAT ID) once
// the frontend is written without it; one that only marks a backend
// terminating, or adds one, reports nothing (terminating backends drain).
func TestPrivilegedOpsReportRemovedBackends(t *testing.T) {
	m := newLBMaps(t)
	o := New(m, maglev.Config{Size: maglev.DefaultSize}, quiet())
	var got [][]RemovedBackend
	o.OnBackendsRemoved(func(r []RemovedBackend) {
		// Called once the frontend is written: its slots no longer hold
		// what is reported.
		for _, rb := range r {
			f := fe(rb.Frontend.Addr.String(), rb.Frontend.Proto)
			_, slots := slotsOf(t, m, f)
			for _, s := range slots {
				if s == rb.Backend {
					t.Errorf("removed backend %s still in the slots when reported", s)
				}
			}
		}
		got = append(got, r)
	})
	ctx := context.Background()
	dns := func(bs ...loadbalancer.FrontendBackend) *loadbalancer.Frontend {
		return fe("10.96.0.10:53", maps.ProtoUDP, bs...)
	}
	term := act("10.0.0.2:53")
	term.Active, term.Terminating = false, true
	for _, f := range []*loadbalancer.Frontend{
		dns(act("10.0.0.1:53"), act("10.0.0.2:53")),
		dns(act("10.0.0.1:53"), term),
		dns(act("10.0.0.1:53"), term, act("10.0.0.3:53")),
	} {
		if err := o.Update(ctx, nil, 0, f); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 0 {
		t.Fatalf("nothing left a frontend yet, reported %+v", got)
	}
	if err := o.Update(ctx, nil, 0, dns(act("10.0.0.3:53"))); err != nil {
		t.Fatal(err)
	}
	ids, _ := o.FrontendIDs(dns().Key)
	if len(got) != 1 || len(got[0]) != 2 {
		t.Fatalf("want one report of two backends, got %+v", got)
	}
	seen := map[string]bool{}
	for _, rb := range got[0] {
		if rb.RevNATID != ids.RevNAT || rb.Frontend != dns().Key {
			t.Errorf("report %+v: want frontend %s, reverse NAT %d", rb, dns().Key, ids.RevNAT)
		}
		seen[rb.Backend.String()] = true
	}
	if !seen["10.0.0.1:53"] || !seen["10.0.0.2:53"] {
		t.Errorf("reported %+v, want 10.0.0.1:53 and 10.0.0.2:53", got[0])
	}
}

// flowsUsing is a FlowUse that reports the given backends in use.
type flowsUsing map[netip.AddrPort]bool

func (f flowsUsing) InUse() (map[uint32]bool, map[netip.AddrPort]bool, error) {
	return map[uint32]bool{}, f, nil
}

// A backend that leaves its frontend while flows use it drains (kept in
// the map as removed); when the frontend takes it back it is active in
// the map again, although the writer skips backend writes that change
// nothing (it once skipped this one: the frontend's second backend stayed
// "removed" after a scale down and up).
func TestPrivilegedDrainedBackendReturnsActive(t *testing.T) {
	m := newLBMaps(t)
	o := New(m, maglev.Config{Size: maglev.DefaultSize}, quiet())
	o.KeepWhileFlows(flowsUsing{netip.MustParseAddrPort("10.0.0.1:80"): true})
	ctx := context.Background()
	web := func(bs ...loadbalancer.FrontendBackend) *loadbalancer.Frontend {
		return fe("10.96.0.20:80", maps.ProtoTCP, bs...)
	}
	state := func() uint8 {
		t.Helper()
		id, ok := o.backendIDs[netip.MustParseAddrPort("10.0.0.1:80")]
		if !ok {
			t.Fatal("backend 10.0.0.1:80 has no ID")
		}
		b, found, err := m.BackendMap().Lookup(id)
		if err != nil || !found {
			t.Fatalf("backend %d: %v %v", id, found, err)
		}
		return b.State
	}
	for _, step := range []struct {
		f    *loadbalancer.Frontend
		want uint8
	}{
		{web(act("10.0.0.1:80"), act("10.0.0.2:80")), maps.BackendStateActive},
		{web(act("10.0.0.2:80")), maps.BackendStateRemoved},
		{web(act("10.0.0.1:80"), act("10.0.0.2:80")), maps.BackendStateActive},
	} {
		if err := o.Update(ctx, nil, 0, step.f); err != nil {
			t.Fatal(err)
		}
		if got := state(); got != step.want {
			t.Fatalf("after %v: backend state %v, want %v", step.f.Backends, got, step.want)
		}
	}
}

// TestPrivilegedOpsExternalScopes: a node port frontend is marked external;
// with externalTrafficPolicy Local this node's ready backends follow the
// in-cluster slots (count them as local_count), and they shrink and grow
// with the frontend; a load-balancer frontend's source ranges are written
// under its reverse NAT ID and replaced; a restarted Ops knows them again,
// and its prune removes those of no frontend.
func TestPrivilegedOpsExternalScopes(t *testing.T) {
	m := newLBMaps(t)
	ctx := context.Background()
	o := New(m, maglev.DefaultConfig(), quiet())
	if _, err := o.Restore(); err != nil {
		t.Fatal(err)
	}
	local := func(addr string) loadbalancer.FrontendBackend { b := act(addr); b.Local = true; return b }
	np := fe("172.30.0.11:30080", loadbalancer.TCP, act("10.0.1.5:8080"), local("10.0.0.2:8080"), local("10.0.0.3:8080"))
	np.Type, np.ExternalTrafficPolicy = loadbalancer.FrontendNodePort, loadbalancer.TrafficPolicyLocal
	check := func(wantCount, wantLocal int) {
		t.Helper()
		s, ok, err := m.ServiceMap().Lookup(maps.Frontend{Addr: np.Key.Addr.Addr(), Port: np.Key.Addr.Port(), Proto: np.Key.Proto})
		if err != nil || !ok {
			t.Fatalf("node port frontend missing (%v)", err)
		}
		if s.Flags != maps.SvcFlagExternal|maps.SvcFlagExtLocal || int(s.Count) != wantCount || int(s.LocalCount) != wantLocal {
			t.Fatalf("service %+v, want external Local with %d + %d slots", s, wantCount, wantLocal)
		}
		ids, err := m.SlotMap().Get(s.ID, wantCount+wantLocal)
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range ids[wantCount:] {
			b, _, _ := m.BackendMap().Lookup(id)
			if b.Addr.String() != fmt.Sprintf("10.0.0.%d", i+2) {
				t.Fatalf("local slot %d holds %s", wantCount+i+1, b.Addr)
			}
		}
		if extra, _ := m.SlotMap().Get(s.ID, wantCount+wantLocal+1); extra[wantCount+wantLocal] != 0 {
			t.Fatalf("slot %d left behind", wantCount+wantLocal+1)
		}
	}
	if err := o.Update(ctx, nil, 0, np); err != nil {
		t.Fatal(err)
	}
	check(3, 2)
	np.Backends = np.Backends[:2]
	if err := o.Update(ctx, nil, 0, np); err != nil {
		t.Fatal(err)
	}
	check(2, 1)

	lb := fe("203.0.113.10:80", loadbalancer.TCP, act("10.0.0.2:8080"))
	lb.Type, lb.ExternalTrafficPolicy = loadbalancer.FrontendLoadBalancer, loadbalancer.TrafficPolicyCluster
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("192.0.2.1/32")}
	if err := o.Update(ctx, nil, 0, lb); err != nil {
		t.Fatal(err)
	}
	ranges := func() int {
		var k bpf.LxcLb4SrcrangeKey
		var v uint8
		n := 0
		it := m.SrcRange4.Iterate()
		for it.Next(&k, &v) {
			n++
		}
		return n
	}
	if s, _ := slotsOf(t, m, lb); s.Flags != maps.SvcFlagExternal|maps.SvcFlagSourceRanges || ranges() != 2 {
		t.Fatalf("load balancer %+v with %d ranges, want external with 2", s, ranges())
	}
	lb.SourceRanges = lb.SourceRanges[:1]
	if err := o.Update(ctx, nil, 0, lb); err != nil {
		t.Fatal(err)
	}
	if ranges() != 1 {
		t.Fatalf("%d ranges after dropping one, want 1", ranges())
	}
	// A restarted agent knows the written ranges again: the frontend
	// losing its ranges while the agent was down drops them at its next
	// write; ranges of no frontend go at the prune.
	o2 := New(m, maglev.DefaultConfig(), quiet())
	if _, err := o2.Restore(); err != nil {
		t.Fatal(err)
	}
	if err := m.SrcRangeMap().Set(999, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, nil); err != nil {
		t.Fatal(err)
	}
	lb.SourceRanges = nil
	if err := o2.Update(ctx, nil, 0, lb); err != nil {
		t.Fatal(err)
	}
	if ranges() != 1 {
		t.Fatalf("%d ranges after the restarted agent's write without ranges, want only the orphan's", ranges())
	}
	all := func(yield func(*loadbalancer.Frontend, statedb.Revision) bool) {
		for _, f := range []*loadbalancer.Frontend{np, lb} {
			if !yield(f, 0) {
				return
			}
		}
	}
	if err := o2.Prune(ctx, nil, all); err != nil {
		t.Fatal(err)
	}
	if ranges() != 0 {
		t.Fatalf("%d ranges after the prune, want none", ranges())
	}
	check(2, 1) // the local slots survive restore and prune
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	if err := o2.Update(ctx, nil, 0, lb); err != nil {
		t.Fatal(err)
	}
	if err := o2.Delete(ctx, nil, 0, lb); err != nil {
		t.Fatal(err)
	}
	if ranges() != 0 {
		t.Fatalf("%d ranges after the frontend's deletion", ranges())
	}
}

// TestPrivilegedOpsExternalIPv6: an IPv6 load-balancer frontend is marked
// external and its IPv6 source ranges go into the IPv6 trie (none into
// the IPv4 one); a restarted Ops lists them again, and the frontend's
// deletion removes them.
func TestPrivilegedOpsExternalIPv6(t *testing.T) {
	m := newLBMaps(t)
	o := New(m, maglev.DefaultConfig(), quiet())
	ctx := context.Background()
	lb := fe("[2001:db8:5::10]:80", loadbalancer.TCP, act("[fd00:10::2]:8080"))
	lb.Type, lb.ExternalTrafficPolicy = loadbalancer.FrontendLoadBalancer, loadbalancer.TrafficPolicyCluster
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48"), netip.MustParsePrefix("2001:db8:2::7/128")}
	if err := o.Update(ctx, nil, 0, lb); err != nil {
		t.Fatal(err)
	}
	// count is the number of ranges of family v6 in the tries.
	count := func(v6 bool) int {
		all, err := m.SrcRangeMap().List()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, rs := range all {
			for _, r := range rs {
				if r.Addr().Is6() == v6 {
					n++
				}
			}
		}
		return n
	}
	s, _ := slotsOf(t, m, lb)
	if s.Flags != maps.SvcFlagExternal|maps.SvcFlagSourceRanges || count(true) != 2 || count(false) != 0 {
		t.Fatalf("IPv6 load balancer %+v with %d IPv6 and %d IPv4 ranges, want external with 2 IPv6", s, count(true), count(false))
	}
	o2 := New(m, maglev.DefaultConfig(), quiet())
	if _, err := o2.Restore(); err != nil {
		t.Fatal(err)
	}
	got, err := m.SrcRangeMap().List()
	if err != nil {
		t.Fatal(err)
	}
	if rs := got[s.RevNATID]; len(rs) != 2 {
		t.Fatalf("ranges listed for reverse NAT ID %d: %v, want the two IPv6 ones", s.RevNATID, rs)
	}
	if err := o2.Delete(ctx, nil, 0, lb); err != nil {
		t.Fatal(err)
	}
	if n := count(true); n != 0 {
		t.Fatalf("%d IPv6 ranges after the frontend's deletion", n)
	}
}
