package loader

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// testdata/lxc_v1_bpfel.o is the datapath object of the first map layout,
// as committed up to 435eb53: endpoints keyed by address only, ipcache
// with an IPv4 tunnel address, one conntrack table with an entry per
// direction plus a reply entry per flow. These structs mirror its layout,
// as the old agent wrote it.
//
// testdata/lxc_v2_bpfel.o is the datapath object of the second layout, as
// committed up to d679259: endpoints by ifindex and by address, conntrack
// and ipcache as now, no endpoint arrays, and, like v1, one policy trie
// for every endpoint (policyKeyV1).
type v1EndpointKey struct {
	Family uint8
	Pad    [3]uint8
	Addr   [16]uint8
}

type v1EndpointInfo struct {
	Ifindex  uint32
	Identity uint32
	EpID     uint16
	Flags    uint8
	Pad      uint8
	MAC      [6]uint8
	HostMAC  [6]uint8
}

type v1IPCacheKey struct {
	Prefixlen uint32
	Family    uint8
	Pad       [3]uint8
	Addr      [16]uint8
}

type v1IPCacheInfo struct {
	Identity  uint32
	TunnelIP4 [4]uint8
	Flags     uint8
	Pad       [3]uint8
}

type policyKeyV1 struct {
	Prefixlen uint32
	EpID      uint16
	Dir       uint8
	Pad       uint8
	Identity  uint32
	Proto     uint8
	Pad2      uint8
	Dport     uint16
}

type policyEntryV1 struct {
	Deny   uint8
	Pad    [3]uint8
	Cookie uint32
}

func v1Addr(ip netip.Addr) (uint8, [16]uint8) {
	var a [16]uint8
	if ip.Is4() {
		b := ip.As4()
		copy(a[:], b[:])
		return 4, a
	}
	return 6, ip.As16()
}

// startOldDatapath runs the datapath of an earlier layout (1 or 2) as its
// agent left it: maps and links pinned under the lab's root, endpoints,
// identities and policy written, the process's own handles closed.
func startOldDatapath(t *testing.T, layout int, lab *podLab, eps []EndpointInfo, policy map[maps.PolicyKey]maps.PolicyValue) {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpec(fmt.Sprintf("testdata/lxc_v%d_bpfel.o", layout))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(lab.root, "links"), 0o750); err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: lab.root}})
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()
	for _, ep := range eps {
		var flags uint8
		if ep.EnforceIngress {
			flags |= maps.FlagEnforceIngress
		}
		if layout == 2 {
			// The second layout's agent wrote endpoints as the maps
			// package still does (same struct), and the ipcache too.
			old := &maps.Maps{Endpoints: coll.Maps["tdr_endpoints_v2"], EndpointsIP4: coll.Maps["tdr_endpoint_ip4_v1"],
				EndpointsIP6: coll.Maps["tdr_endpoint_ip6_v1"], IPCache: coll.Maps["tdr_ipcache_v2"]}
			e := maps.Endpoint{ID: ep.ID, IfIndex: uint32(ep.IfIndex), Identity: ep.Identity, Flags: flags | maps.FlagDeliverDirect,
				MAC: ep.MAC, HostMAC: ep.HostMAC, IPv4: ep.Addresses[0], IPv6: ep.Addresses[1]}
			if err := old.EndpointMap().Upsert(e); err != nil {
				t.Fatal(err)
			}
			for _, ip := range ep.Addresses {
				if err := old.IPCacheMap().Upsert(netip.PrefixFrom(ip, ip.BitLen()), maps.IPCacheEntry{Identity: ep.Identity, TunnelIP: netip.MustParseAddr("192.0.2.1")}); err != nil {
					t.Fatal(err)
				}
			}
			continue
		}
		v := v1EndpointInfo{Ifindex: uint32(ep.IfIndex), Identity: ep.Identity, EpID: ep.ID, Flags: flags}
		copy(v.MAC[:], ep.MAC)
		copy(v.HostMAC[:], ep.HostMAC)
		for _, ip := range ep.Addresses {
			fam, addr := v1Addr(ip)
			if err := coll.Maps["tdr_endpoints_v1"].Put(v1EndpointKey{Family: fam, Addr: addr}, v); err != nil {
				t.Fatal(err)
			}
			if err := coll.Maps["tdr_ipcache_v1"].Put(v1IPCacheKey{Prefixlen: 32 + uint32(ip.BitLen()), Family: fam, Addr: addr},
				v1IPCacheInfo{Identity: ep.Identity, TunnelIP4: [4]uint8{192, 0, 2, 1}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for k, v := range policy {
		ok := policyKeyV1{Prefixlen: 64, EpID: k.EndpointID, Dir: k.Direction, Identity: k.Identity}
		if k.Proto != 0 {
			ok.Prefixlen += 16 + uint32(k.PortPrefixLen)
			ok.Proto, ok.Dport = k.Proto, maps.Htons(k.Port)
		}
		ov := policyEntryV1{Cookie: v.Cookie}
		if v.Deny {
			ov.Deny = 1
		}
		if err := coll.Maps["tdr_policy_v1"].Put(ok, ov); err != nil {
			t.Fatal(err)
		}
	}
	for _, ep := range eps {
		for dir, prog := range map[string]*ebpf.Program{"ingress": coll.Programs["from_pod"], "egress": coll.Programs["to_pod"]} {
			attach := ebpf.AttachTCXIngress
			if dir == "egress" {
				attach = ebpf.AttachTCXEgress
			}
			lk, err := link.AttachTCX(link.TCXOptions{Interface: ep.IfIndex, Program: prog, Attach: attach})
			if err != nil {
				t.Fatal(err)
			}
			if err := lk.Pin(filepath.Join(lab.root, "links", linkName(ep.ID, dir))); err != nil {
				t.Fatal(err)
			}
			lk.Close()
		}
	}
}

// TestPrivilegedUpgradeFromOldLayouts: the agent starts over a running
// datapath of an earlier map layout. The old maps are not read as new
// ones: their entries are carried over into the new maps and their pins
// removed, and the pinned links switch to the new programs. A ping running
// across the upgrade loses nothing, a pod denied before stays denied
// before and after its endpoint is regenerated, and the flow the ping uses
// continues as an established one.
func TestPrivilegedUpgradeFromOldLayouts(t *testing.T) {
	for _, layout := range []int{1, 2} {
		t.Run(fmt.Sprintf("v%d", layout), func(t *testing.T) { testUpgradeFrom(t, layout) })
	}
}

func testUpgradeFrom(t *testing.T, layout int) {
	lab := newPodLab(t)
	a, b, c := lab.addPod("a", 0), lab.addPod("b", 1), lab.addPod("c", 2)
	const idA, idB, idC = 3001, 3002, 3003
	eps := []EndpointInfo{a.endpoint(1, idA, false), b.endpoint(2, idB, true), c.endpoint(3, idC, false)}
	// b admits echo requests from a only.
	policy := map[maps.PolicyKey]maps.PolicyValue{
		{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 1, Port: 8, PortPrefixLen: 16}:    {Cookie: 1},
		{EndpointID: 2, Direction: maps.DirIngress, Identity: idA, Proto: 58, Port: 128, PortPrefixLen: 16}: {Cookie: 1},
	}
	startOldDatapath(t, layout, lab, eps, policy)
	if sent, got := a.ping(t, b.IPv4, 5); got != sent {
		t.Fatalf("old datapath: a to b %d of %d", got, sent)
	}
	if _, got := c.ping(t, b.IPv4, 2); got != 0 {
		t.Fatal("old datapath: c reached b")
	}

	// A 100/s ping from a to b across the upgrade; the new datapath starts
	// once the old one has carried part of it.
	const count = 400
	done := make(chan [2]int, 1)
	go func() {
		s, r := a.ping(t, b.IPv4, count)
		done <- [2]int{s, r}
	}()
	old, err := ebpf.LoadPinnedMap(filepath.Join(lab.root, "tdr_metrics_v2"), nil)
	if err != nil {
		t.Fatal(err)
	}
	established := func() uint64 {
		row, err := (&maps.Maps{Metrics: old}).MetricsMap().Lookup(maps.ReasonCTEstablished, maps.DirEgress)
		if err != nil {
			t.Fatal(err)
		}
		return row.Packets
	}
	start := established()
	for i := 0; established() < start+50; i++ {
		// Bounds a broken old datapath only; the ping needs 0.5 s.
		if i == 1000 {
			t.Fatal("the old datapath carried no echo requests")
		}
		time.Sleep(10 * time.Millisecond)
	}
	old.Close()

	l := lab.loader()
	// Before any regeneration the new maps already hold what the old ones
	// did.
	for _, name := range []string{"tdr_endpoints_v1", "tdr_ipcache_v1", "tdr_ct_v1", "tdr_ratelimit_v1", "tdr_policy_v1"} {
		if _, err := os.Stat(filepath.Join(lab.root, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin of the old layout %s still there (%v)", name, err)
		}
	}
	em := l.Maps().EndpointMap()
	for _, ep := range eps {
		e, ok, err := em.Lookup(uint32(ep.IfIndex))
		if err != nil || !ok || e.ID != ep.ID || e.Identity != ep.Identity || e.IPv4 != ep.Addresses[0] || e.IPv6 != ep.Addresses[1] ||
			e.EnforceIngress() != ep.EnforceIngress || e.Flags&maps.FlagDeliverDirect == 0 {
			t.Errorf("endpoint %d carried over as %+v (found %v, %v)", ep.ID, e, ok, err)
		}
	}
	if v, ok, err := l.Maps().IPCacheMap().LookupAddr(c.IPv6); err != nil || !ok || v.Identity != idC || v.TunnelIP != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("ipcache entry of c carried over as %+v (found %v, %v)", v, ok, err)
	}
	var pingFlows []maps.CTEntry
	ct, err := l.Maps().CTMap().List()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ct {
		if e.Proto == 1 && e.Src == a.IPv4 && e.Dst == b.IPv4 {
			pingFlows = append(pingFlows, e)
		}
	}
	// The two endpoints' v1 entries of each ping flow became one.
	if len(pingFlows) == 0 {
		t.Errorf("conntrack of the running ping not carried over (all: %d entries)", len(ct))
	}
	for _, e := range pingFlows {
		if e.SrcEndpoint != 1 || e.DstEndpoint != 2 || !e.SeenReply() {
			t.Errorf("ping flow carried over as %+v", e)
		}
	}
	if st := l.Status(); st.ReusedLinks != 6 {
		t.Errorf("%d pinned links reused, want 6", st.ReusedLinks)
	}
	if got, err := l.Maps().PolicyMap().DumpEndpoint(2); err != nil || len(got) != len(policy) {
		t.Errorf("policy of b carried over as %v (%v), want %v", got, err, policy)
	}
	var slot bpf.LxcEndpointInfo
	if err := l.Maps().EndpointsID.Lookup(uint32(2), &slot); err != nil || slot.Ifindex != uint32(b.HostIfIndex) {
		t.Errorf("ID slot of b: %+v %v", slot, err)
	}
	if _, got := c.ping(t, b.IPv4, 2); got != 0 {
		t.Error("c reached b after the upgrade, before regeneration")
	}
	// The agent regenerates its endpoints.
	for _, ep := range eps {
		if err := l.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	res := <-done
	t.Logf("ping across the upgrade: %d sent, %d received", res[0], res[1])
	if res[0] != count || res[1] != count {
		t.Errorf("lost %d of %d echo requests across the upgrade", res[0]-res[1], res[0])
	}
	if _, got := c.ping(t, b.IPv6, 2); got != 0 {
		t.Error("c reached b after regeneration")
	}
	if sent, got := a.ping(t, b.IPv6, 5); got != sent {
		t.Errorf("a to b over IPv6 after the upgrade: %d of %d", got, sent)
	}
	if st := l.Status(); st.Links != 6 {
		t.Errorf("%d links after regeneration, want 6", st.Links)
	}
}

// TestPrivilegedIncompatiblePinReplaced: a pin under a current name but
// with another shape is replaced by an empty map of the right shape; the
// compatible pins keep their entries.
func TestPrivilegedIncompatiblePinReplaced(t *testing.T) {
	n := newTestNode(t)
	m := n.l.Maps()
	k := maps.PolicyKey{EndpointID: 9, Direction: maps.DirIngress, Identity: 42, Proto: 6, Port: 80, PortPrefixLen: 16}
	if err := m.PolicyMap().Upsert(k, maps.PolicyValue{Cookie: 5}); err != nil {
		t.Fatal(err)
	}
	root := n.l.cfg.BPFRoot
	if err := n.l.Close(); err != nil {
		t.Fatal(err)
	}
	// A development build's conntrack table of another value size.
	ctPin := filepath.Join(root, maps.CT4MapName)
	if err := os.Remove(ctPin); err != nil {
		t.Fatal(err)
	}
	odd, err := ebpf.NewMap(&ebpf.MapSpec{Name: "odd", Type: ebpf.Hash, KeySize: 16, ValueSize: 8, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := odd.Pin(ctPin); err != nil {
		t.Fatal(err)
	}
	odd.Close()

	l := New(Config{BPFRoot: root, DirectDelivery: true}, nil)
	if err := l.Start(); err != nil {
		t.Fatalf("start over an incompatible pin: %v", err)
	}
	defer l.Close()
	ct, err := ebpf.LoadPinnedMap(ctPin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	if ct.ValueSize() == 8 || ct.Type() != ebpf.LRUHash {
		t.Fatalf("incompatible pin kept: %s value size %d", ct.Type(), ct.ValueSize())
	}
	if v, ok, err := l.Maps().PolicyMap().Lookup(k); err != nil || !ok || v.Cookie != 5 {
		t.Fatalf("compatible policy pin lost its entry: %+v %v %v", v, ok, err)
	}
}
