package maps

import (
	"net/netip"
	"sort"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// TestPrivilegedNATTable: the NAT table's mappings, either family, read
// back as written (the service flag IPv4's only), halves listed as
// orphans, and the GC: a mapping whose flow has no conntrack entry goes
// with both halves, a live one stays, an old orphan goes, a young one
// stays, and an orphan's other key held by another mapping is left.
func TestPrivilegedNATTable(t *testing.T) {
	m := newUnpinnedMaps(t)
	spec, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	create := func(name string) *ebpf.Map {
		ms := spec.Maps[name].Copy()
		ms.Pinning = ebpf.PinNone
		mp, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		t.Cleanup(func() { mp.Close() })
		return mp
	}
	nat := (&NATMaps{NAT4: create(NAT4MapName), NAT6: create(NAT6MapName)}).NATMap()
	ct := m.CTMap()
	now := MonotonicNow()
	old := now - uint64(NATMinAge.Nanoseconds()) - 1e9
	a := netip.MustParseAddr
	live4 := NATMapping{Proto: 6, Pod: a("10.0.0.2"), PodPort: 40000, Remote: a("198.51.100.1"), RemotePort: 80, Node: a("172.30.0.11"), NodePort: 61000, Created: old}
	dead4 := NATMapping{Proto: 17, Pod: a("10.0.0.2"), PodPort: 40001, Remote: a("198.51.100.1"), RemotePort: 53, Node: a("172.30.0.11"), NodePort: 61001, Created: old}
	svc4 := NATMapping{Proto: 6, Pod: a("203.0.113.9"), PodPort: 50000, Remote: a("10.0.1.7"), RemotePort: 8080, Node: a("172.30.0.11"), NodePort: 61002, Created: old, Service: true}
	live6 := NATMapping{Proto: 6, Pod: a("fd00:10::2"), PodPort: 40000, Remote: a("2001:db8::1"), RemotePort: 443, Node: a("fd00:ff::11"), NodePort: 61000, Created: old}
	dead6 := NATMapping{Proto: 58, Pod: a("fd00:10::2"), PodPort: 7, Remote: a("2001:db8::1"), Node: a("fd00:ff::11"), NodePort: 61003, Created: old}
	svc6 := NATMapping{Proto: 6, Pod: a("2001:db8:9::9"), PodPort: 50000, Remote: a("fd00:10:1::7"), RemotePort: 8080, Node: a("fd00:ff::11"), NodePort: 61002, Created: old, Service: true}
	young6 := NATMapping{Proto: 17, Pod: a("fd00:10::3"), PodPort: 40002, Remote: a("2001:db8::1"), RemotePort: 53, Node: a("fd00:ff::11"), NodePort: 61004, Created: now}
	for _, n := range []NATMapping{live4, dead4, svc4, live6, svc6, dead6, young6} {
		if err := nat.Upsert(n); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []NATMapping{live4, svc4, live6, svc6} {
		if err := ct.Upsert(CTEntry{Proto: n.Proto, Src: n.Pod, SrcPort: n.PodPort, Dst: n.Remote, DstPort: n.RemotePort, Expires: now + 60e9}); err != nil {
			t.Fatal(err)
		}
	}
	// Orphans: an old forward half (IPv4), an old reverse half (IPv6), and
	// an old forward half whose reverse key another mapping holds.
	orphanFwd := NATMapping{Proto: 6, Pod: a("10.0.0.5"), PodPort: 40005, Remote: a("198.51.100.1"), RemotePort: 80, Node: a("172.30.0.11"), NodePort: 61005, Created: old}
	fwd, _ := orphanFwd.keys()
	if err := nat.put(fwd, natValue{Addr: orphanFwd.Node, Port: orphanFwd.NodePort, Created: old}); err != nil {
		t.Fatal(err)
	}
	orphanRev := NATMapping{Proto: 17, Pod: a("fd00:10::5"), PodPort: 40006, Remote: a("2001:db8::1"), RemotePort: 53, Node: a("fd00:ff::11"), NodePort: 61006, Created: old}
	_, rev := orphanRev.keys()
	if err := nat.put(rev, natValue{Addr: orphanRev.Pod, Port: orphanRev.PodPort, Created: old}); err != nil {
		t.Fatal(err)
	}
	stale := NATMapping{Proto: 6, Pod: a("10.0.0.6"), PodPort: 40007, Remote: a("198.51.100.1"), RemotePort: 80, Node: a("172.30.0.11"), NodePort: 61000, Created: old}
	fwd, _ = stale.keys()
	if err := nat.put(fwd, natValue{Addr: stale.Node, Port: stale.NodePort, Created: old}); err != nil {
		t.Fatal(err)
	}

	list, err := nat.List()
	if err != nil {
		t.Fatal(err)
	}
	key := func(n NATMapping) string {
		return netip.AddrPortFrom(n.Pod, n.PodPort).String() + "/" + n.Remote.String()
	}
	sort.Slice(list, func(i, j int) bool { return key(list[i]) < key(list[j]) })
	want := []NATMapping{live4, dead4, svc4, live6, svc6, dead6, young6, orphanFwd, orphanRev, stale}
	for i := range want[7:] {
		want[7+i].Orphan = true
	}
	sort.Slice(want, func(i, j int) bool { return key(want[i]) < key(want[j]) })
	if len(list) != len(want) {
		t.Fatalf("listed %d mappings, want %d: %+v", len(list), len(want), list)
	}
	for i := range want {
		if list[i] != want[i] {
			t.Errorf("mapping %d: got %+v, want %+v", i, list[i], want[i])
		}
	}
	if c, _ := nat.Count(); c != 2*7+3 {
		t.Errorf("%d entries, want %d", c, 2*7+3)
	}

	res, err := nat.CollectNAT(ct, now)
	if err != nil {
		t.Fatal(err)
	}
	// dead4 and dead6 with both halves; orphanFwd and orphanRev; stale's
	// forward half (its reverse key is live4's).
	if res.Seen != 10 || res.Deleted != 2 || res.Orphans != 3 {
		t.Errorf("sweep %+v, want 10 seen, 2 deleted, 3 orphans", res)
	}
	list, _ = nat.List()
	left := map[string]bool{}
	for _, n := range list {
		if n.Orphan {
			t.Errorf("orphan left: %+v", n)
		}
		left[key(n)] = true
	}
	for _, n := range []NATMapping{live4, svc4, live6, svc6, young6} {
		if !left[key(n)] {
			t.Errorf("mapping %+v collected", n)
		}
	}
	if len(list) != 5 {
		t.Errorf("%d mappings left, want 5: %+v", len(list), list)
	}
}
