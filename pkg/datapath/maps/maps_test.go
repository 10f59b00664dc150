package maps

import (
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/testutil"
)

func TestPolicyKeyEncoding(t *testing.T) {
	keys := []PolicyKey{
		{EndpointID: 3, Direction: DirIngress, Identity: 1000},
		{EndpointID: 3, Direction: DirEgress, Identity: 0, Proto: 17},
		{EndpointID: 3, Direction: DirEgress, Identity: 7, Proto: 6, Port: 8080, PortPrefixLen: 16},
		{EndpointID: 3, Direction: DirIngress, Identity: 7, Proto: 6, Port: 8192, PortPrefixLen: 6},
	}
	for _, k := range keys {
		r, err := k.raw()
		if err != nil {
			t.Fatalf("%+v: %v", k, err)
		}
		if back := fromRawPolicyKey(k.slot(), r); back != k {
			t.Errorf("round trip %+v -> %+v", k, back)
		}
	}
	// Bits past the prefix are masked, so equal prefixes are equal keys.
	a, _ := PolicyKey{Proto: 6, Port: 9030, PortPrefixLen: 6}.raw()
	b, _ := PolicyKey{Proto: 6, Port: 9024, PortPrefixLen: 6}.raw()
	if a != b {
		t.Errorf("unmasked port bits: %+v vs %+v", a, b)
	}
	for _, bad := range []PolicyKey{{Port: 80, PortPrefixLen: 16}, {Proto: 6, PortPrefixLen: 17}, {Direction: 2}} {
		if _, err := bad.raw(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestPolicyKeyString(t *testing.T) {
	for k, want := range map[PolicyKey]string{
		{EndpointID: 3, Direction: DirIngress, Identity: 1000}:                                      "ep=3 ingress identity=1000 proto=any",
		{EndpointID: 3, Direction: DirEgress, Proto: 17}:                                            "ep=3 egress identity=any proto=17 port=any",
		{EndpointID: 3, Direction: DirEgress, Identity: 7, Proto: 6, Port: 8080, PortPrefixLen: 16}: "ep=3 egress identity=7 proto=6 port=8080",
		{EndpointID: 3, Direction: DirIngress, Identity: 7, Proto: 6, Port: 8192, PortPrefixLen: 6}: "ep=3 ingress identity=7 proto=6 port=8192-9215",
		// Bits past the prefix do not shift the range (they are masked in
		// the map too).
		{EndpointID: 3, Direction: DirIngress, Identity: 7, Proto: 6, Port: 9030, PortPrefixLen: 6}: "ep=3 ingress identity=7 proto=6 port=8192-9215",
	} {
		if got := k.String(); got != want {
			t.Errorf("%+v: %q, want %q", k, got, want)
		}
	}
}

func TestEndpointValidation(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	good := Endpoint{ID: 1, IfIndex: 4, IPv4: netip.MustParseAddr("10.0.0.1"), IPv6: netip.MustParseAddr("fd00::1"),
		Flags: FlagDeliverDirect | FlagEnforceIngress, MAC: mac, HostMAC: mac}
	v, err := good.raw()
	if err != nil {
		t.Fatal(err)
	}
	if v.Flags != FlagDeliverDirect|FlagEnforceIngress|FlagHasIPv4|FlagHasIPv6 {
		t.Errorf("flags %#x", v.Flags)
	}
	if back := fromRawEndpoint(v); back.IPv4 != good.IPv4 || back.IPv6 != good.IPv6 || !back.EnforceIngress() || back.EnforceEgress() {
		t.Errorf("round trip %+v", back)
	}
	for name, bad := range map[string]Endpoint{
		"IPv6 as IPv4":        {ID: 1, IPv4: netip.MustParseAddr("fd00::1")},
		"IPv4 as IPv6":        {ID: 1, IPv6: netip.MustParseAddr("10.0.0.1")},
		"direct without MACs": {ID: 1, Flags: FlagDeliverDirect, MAC: mac},
	} {
		if _, err := bad.raw(); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

// newUnpinnedMaps creates the datapath's maps as the object declares them,
// without pins.
func newUnpinnedMaps(t *testing.T) *Maps {
	t.Helper()
	testutil.Privileged(t)
	spec, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	create := func(name string) *ebpf.Map {
		ms := spec.Maps[name].Copy()
		ms.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	return &Maps{Endpoints: create(EndpointsMapName), EndpointsIfx: create(EndpointIfxName), EndpointsID: create(EndpointIDName),
		EndpointsIP4: create(EndpointIP4Name), EndpointsIP6: create(EndpointIP6Name),
		IPCache: create(IPCacheMapName), Policy: create(PolicyMapName),
		CT4: create(CT4MapName), CT6: create(CT6MapName), Metrics: create(MetricsMapName)}
}

func TestPrivilegedIPCacheAndPolicyLookups(t *testing.T) {
	m := newUnpinnedMaps(t)
	ipc := m.IPCacheMap()
	for p, id := range map[string]uint32{"0.0.0.0/0": 2, "10.0.0.0/8": 100, "10.1.0.5/32": 200, "::/0": 2, "fd00::/64": 300} {
		if err := ipc.Upsert(netip.MustParsePrefix(p), IPCacheEntry{Identity: id, TunnelIP: netip.MustParseAddr("fd00:1::1")}); err != nil {
			t.Fatal(err)
		}
	}
	for addr, want := range map[string]uint32{"10.1.0.5": 200, "10.1.0.6": 100, "192.0.2.1": 2, "::ffff:10.1.0.5": 200, "fd00::9": 300, "fd01::1": 2} {
		e, ok, err := ipc.LookupAddr(netip.MustParseAddr(addr))
		if err != nil || !ok || e.Identity != want {
			t.Errorf("%s: identity %d (found %v, %v), want %d", addr, e.Identity, ok, err, want)
		}
	}
	if e, ok, _ := ipc.Lookup(netip.MustParsePrefix("10.0.0.0/8")); !ok || e.Identity != 100 || e.TunnelIP != netip.MustParseAddr("fd00:1::1") {
		t.Errorf("exact lookup of 10.0.0.0/8: %+v %v", e, ok)
	}
	if _, ok, _ := ipc.Lookup(netip.MustParsePrefix("10.1.0.0/16")); ok {
		t.Error("exact lookup found a prefix that is not stored")
	}

	pm := m.PolicyMap()
	for _, pr := range PortRangePrefixes(9000, 9100) {
		if err := pm.Upsert(PolicyKey{EndpointID: 1, Direction: DirIngress, Proto: 6, Port: pr.Port, PortPrefixLen: pr.PrefixLen}, PolicyValue{Cookie: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pm.Upsert(PolicyKey{EndpointID: 1, Direction: DirIngress, Identity: 66}, PolicyValue{Deny: true, Cookie: 2}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id          uint32
		port        uint16
		found, deny bool
	}{{7, 9050, true, false}, {7, 9101, false, false}, {66, 9050, true, true}} {
		v, found, err := pm.Decide(1, DirIngress, tc.id, 6, tc.port)
		if err != nil || found != tc.found || v.Deny != tc.deny {
			t.Errorf("identity %d port %d: %+v found=%v err=%v", tc.id, tc.port, v, found, err)
		}
	}
	if err := pm.DeleteEndpoint(1); err != nil {
		t.Fatal(err)
	}
	if n, _ := pm.Count(); n != 0 {
		t.Errorf("%d policy entries after deleting the endpoint's", n)
	}
}

// TestPrivilegedIPCacheUpsertBatch: a batch is written in one call, in
// order; an invalid prefix stops it there with the count written before
// it, as a kernel failure of one element does.
func TestPrivilegedIPCacheUpsertBatch(t *testing.T) {
	ipc := newUnpinnedMaps(t).IPCacheMap()
	ps := []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16"), netip.MustParsePrefix("fd00:2::/64"), netip.MustParsePrefix("10.2.3.4/32")}
	es := []IPCacheEntry{{Identity: 400}, {Identity: 401, TunnelIP: netip.MustParseAddr("192.0.2.9")}, {Identity: 402, Flags: IPCacheFlagRemoteNode}}
	if n, err := ipc.UpsertBatch(ps, es); n != 3 || err != nil {
		t.Fatalf("batch of 3: wrote %d, %v", n, err)
	}
	got, err := ipc.Dump()
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range ps {
		if got[p] != es[i] {
			t.Errorf("%s: %+v, want %+v", p, got[p], es[i])
		}
	}
	n, err := ipc.UpsertBatch([]netip.Prefix{netip.MustParsePrefix("10.3.0.0/16"), {}, netip.MustParsePrefix("10.4.0.0/16")}, es)
	if n != 1 || err == nil {
		t.Fatalf("batch with an invalid second prefix: wrote %d, %v; want 1 and an error", n, err)
	}
	if _, ok, _ := ipc.Lookup(netip.MustParsePrefix("10.4.0.0/16")); ok {
		t.Error("the batch went on past the invalid prefix")
	}
	if _, err := ipc.UpsertBatch(ps[:2], es); err == nil {
		t.Error("a batch of 2 prefixes for 3 entries was taken")
	}
}

// TestPrivilegedPolicyTriesPerEndpoint: each endpoint's entries live in
// tries of its own, one per direction and identity kind, created with the
// first entry of the kind; a lookup never sees another endpoint's entries,
// and deleting an endpoint leaves the others whole.
func TestPrivilegedPolicyTriesPerEndpoint(t *testing.T) {
	m := newUnpinnedMaps(t)
	pm := m.PolicyMap()
	entries := map[PolicyKey]PolicyValue{
		{EndpointID: 1, Direction: DirIngress, Identity: 100, Proto: 6, Port: 80, PortPrefixLen: 16}: {Cookie: 1},
		{EndpointID: 1, Direction: DirEgress, Identity: 200}:                                         {Cookie: 2},
		{EndpointID: 2, Direction: DirIngress, Identity: 0, Proto: 17, Port: 53, PortPrefixLen: 16}:  {Cookie: 3},
		{EndpointID: 2, Direction: DirIngress, Identity: 100, Proto: 6}:                              {Deny: true, Cookie: 4},
		{EndpointID: 4095, Direction: DirEgress, Identity: 7}:                                        {Cookie: 5},
	}
	for k, v := range entries {
		if err := pm.Upsert(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := pm.Tries(); err != nil || n != 5 {
		t.Errorf("%d tries (%v), want 5: one per endpoint, direction and identity kind in use", n, err)
	}
	all, err := pm.DumpEndpoint(0)
	if err != nil || len(all) != len(entries) {
		t.Fatalf("dump of every endpoint: %d entries (%v), want %d", len(all), err, len(entries))
	}
	for k, v := range entries {
		if all[k] != v {
			t.Errorf("%+v: %+v, want %+v", k, all[k], v)
		}
	}
	for _, tc := range []struct {
		ep          uint16
		dir         uint8
		id          uint32
		proto       uint8
		port        uint16
		found, deny bool
		cookie      uint32
	}{
		{1, DirIngress, 100, 6, 80, true, false, 1},
		{1, DirIngress, 100, 6, 81, false, false, 0},
		{1, DirIngress, 200, 6, 80, false, false, 0}, // 200 is allowed on 1's egress only
		{1, DirEgress, 200, 17, 9, true, false, 2},
		{2, DirIngress, 300, 17, 53, true, false, 3}, // any identity
		{2, DirIngress, 100, 6, 80, true, true, 4},   // 1's allow of 100/TCP 80 is not 2's
		{2, DirIngress, 100, 17, 53, true, false, 3},
		{3, DirIngress, 100, 6, 80, false, false, 0},
		{4095, DirEgress, 7, 1, 8, true, false, 5},
	} {
		v, found, err := pm.Decide(tc.ep, tc.dir, tc.id, tc.proto, tc.port)
		if err != nil || found != tc.found || v.Deny != tc.deny || v.Cookie != tc.cookie {
			t.Errorf("endpoint %d dir %d identity %d %d/%d: %+v found=%v err=%v", tc.ep, tc.dir, tc.id, tc.proto, tc.port, v, found, err)
		}
	}
	// A second handle on the same maps (the agent after a restart, the
	// CLI) finds the tries through the outer map.
	again := newPolicyMap(m.Policy, nil)
	defer again.Close()
	if got, err := again.DumpEndpoint(2); err != nil || len(got) != 2 {
		t.Errorf("endpoint 2 through a new handle: %v %v", got, err)
	}
	if err := again.Upsert(PolicyKey{EndpointID: 9, Identity: 1}, PolicyValue{}); err == nil {
		t.Error("a handle without the datapath spec created a trie")
	}
	if err := pm.DeleteEndpoint(2); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := pm.Decide(2, DirIngress, 300, 17, 53); found {
		t.Error("endpoint 2's entries outlived it")
	}
	if n, _ := pm.Count(); n != 3 {
		t.Errorf("%d entries left, want endpoint 1's and 4095's 3", n)
	}
	if err := pm.Delete(PolicyKey{EndpointID: 3, Identity: 5}); err != nil {
		t.Errorf("deleting from an endpoint without tries: %v", err)
	}
}

func TestPrivilegedMigratePolicyV1(t *testing.T) {
	m := newUnpinnedMaps(t)
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LPMTrie, KeySize: 16, ValueSize: 8, MaxEntries: 16, Flags: unix.BPF_F_NO_PREALLOC})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	for k, v := range map[policyKeyV1]policyEntryV1{
		{Prefixlen: 96, EpID: 1, Dir: DirIngress, Identity: 100, Proto: 6, Dport: Htons(80)}:      {Cookie: 1},
		{Prefixlen: 64, EpID: 1, Dir: DirEgress, Identity: 0}:                                     {Deny: 1, Cookie: 2},
		{Prefixlen: 80 + 6, EpID: 2, Dir: DirIngress, Identity: 0, Proto: 17, Dport: Htons(8192)}: {Cookie: 3},
	} {
		if err := old.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	res, err := MigratePolicyV1(old, m.PolicyMap())
	if err != nil || res.Read != 3 || res.Written != 3 {
		t.Fatalf("migration: %+v %v", res, err)
	}
	for _, tc := range []struct {
		ep     uint16
		dir    uint8
		id     uint32
		proto  uint8
		port   uint16
		deny   bool
		cookie uint32
	}{{1, DirIngress, 100, 6, 80, false, 1}, {1, DirEgress, 5, 6, 1, true, 2}, {2, DirIngress, 9, 17, 9000, false, 3}} {
		v, found, err := m.PolicyMap().Decide(tc.ep, tc.dir, tc.id, tc.proto, tc.port)
		if err != nil || !found || v.Deny != tc.deny || v.Cookie != tc.cookie {
			t.Errorf("%+v: %+v found=%v err=%v", tc, v, found, err)
		}
	}
	if _, found, _ := m.PolicyMap().Decide(2, DirIngress, 9, 17, 9300); found {
		t.Error("the migrated port range grew")
	}
}

func TestCTCanonicalOrder(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	fwd := CTEntry{Proto: 6, Src: a, SrcPort: 40000, Dst: b, DstPort: 80, SrcEndpoint: 1, Expires: 9}
	rev := CTEntry{Proto: 6, Src: b, SrcPort: 80, Dst: a, DstPort: 40000}
	if fwd.key4() != rev.key4() {
		t.Fatalf("a flow and its reply build different keys: %+v %+v", fwd.key4(), rev.key4())
	}
	// Stored and read back, the entry keeps who started the flow.
	k := fwd.key4()
	back := fromKey4(k, fwd.value())
	if back != fwd {
		t.Fatalf("round trip %+v -> %+v", fwd, back)
	}
	// Same address (different ports): ports decide.
	self := CTEntry{Proto: 17, Src: a, SrcPort: 9, Dst: a, DstPort: 5}
	if !(CTEntry{Proto: 17, Src: a, SrcPort: 5, Dst: a, DstPort: 9}).srcIsA() || self.srcIsA() {
		t.Error("ports do not order equal addresses")
	}
	if got := fromKey4(self.key4(), self.value()); got.Src != a || got.SrcPort != 9 {
		t.Errorf("orientation lost: %+v", got)
	}
}

func TestPrivilegedConntrackSweep(t *testing.T) {
	m := newUnpinnedMaps(t)
	ct := m.CTMap()
	now := MonotonicNow()
	pod, peer := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	pod6, peer6 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	entries := []CTEntry{
		// 1's connection out, live.
		{Proto: 6, Src: pod, SrcPort: 1000, Dst: peer, DstPort: 80, SrcEndpoint: 1, Expires: now + 1e12},
		// Expired.
		{Proto: 6, Src: pod, SrcPort: 1001, Dst: peer, DstPort: 80, SrcEndpoint: 1, Expires: now - 1},
		// From a remote side to endpoint 2.
		{Proto: 17, Src: peer6, SrcPort: 5000, Dst: pod6, DstPort: 53, DstEndpoint: 2, Expires: now + 1e12},
		// To endpoint 3, which is gone.
		{Proto: 17, Src: peer6, SrcPort: 5001, Dst: pod6, DstPort: 53, DstEndpoint: 3, Expires: now + 1e12},
		// Between endpoints 1 (live) and 3 (gone).
		{Proto: 6, Src: pod, SrcPort: 1002, Dst: peer, DstPort: 443, SrcEndpoint: 1, DstEndpoint: 3, Expires: now + 1e12},
	}
	for _, e := range entries {
		if err := ct.Upsert(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := ct.Upsert(CTEntry{Src: pod, Dst: peer6}); err == nil {
		t.Error("an entry of mixed families accepted")
	}
	got, ok, err := ct.Lookup(CTEntry{Proto: 17, Src: pod6, SrcPort: 53, Dst: peer6, DstPort: 5000})
	if err != nil || !ok || got.Src != peer6 || got.DstEndpoint != 2 {
		t.Fatalf("IPv6 lookup by the reply's tuple: %+v %v %v", got, ok, err)
	}
	res, err := ct.DeleteExpired(now, func(id uint16) bool { return id != 3 })
	if err != nil || res.Seen != 5 || res.Deleted != 2 || res.Forgotten != 1 {
		t.Fatalf("sweep: %+v %v", res, err)
	}
	shared, ok, _ := ct.Lookup(entries[4])
	if !ok || shared.SrcEndpoint != 1 || shared.DstEndpoint != 0 {
		t.Errorf("the entry shared with a deleted endpoint: %+v %v", shared, ok)
	}
	if n, _ := ct.Count(); n != 3 {
		t.Errorf("%d entries left, want 3", n)
	}
	if res, err := ct.DeleteEndpoint(1); err != nil || res.Deleted != 2 {
		t.Errorf("forget endpoint 1: %+v %v", res, err)
	}
}

func TestPrivilegedMigrateCTV1(t *testing.T) {
	m := newUnpinnedMaps(t)
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 44, ValueSize: 32, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	now := MonotonicNow()
	a, b, x := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("192.0.2.7")
	key := func(s, d netip.Addr, sp, dp uint16, dir uint8, ep uint16) ctKeyV1 {
		_, sa := addrBytes(s)
		_, da := addrBytes(d)
		return ctKeyV1{Saddr: sa, Daddr: da, Sport: Htons(sp), Dport: Htons(dp), Proto: 6, Family: FamilyV4, Dir: dir, EpID: ep}
	}
	for k, v := range map[ctKeyV1]ctEntryV1{
		// Endpoint 1 (at a) connected to endpoint 2 (at b): 1's entry,
		// its reply-direction entry, and 2's entry.
		key(a, b, 40000, 80, DirEgress, 1):  {Expires: now + 1e12, SeenReply: 1},
		key(b, a, 80, 40000, DirIngress, 1): {Expires: now + 1e12, SeenReply: 1, IsReply: 1},
		key(a, b, 40000, 80, DirIngress, 2): {Expires: now + 2e12, Closing: 1},
		// A remote peer connected to endpoint 2.
		key(x, b, 5555, 22, DirIngress, 2): {Expires: now + 1e12},
		// Expired.
		key(a, b, 40001, 80, DirEgress, 1): {Expires: now - 1},
	} {
		if err := old.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	res, err := MigrateCTV1(old, m.CTMap(), now)
	if err != nil || res.Read != 5 || res.Written != 2 {
		t.Fatalf("migration: %+v %v", res, err)
	}
	local, ok, _ := m.CTMap().Lookup(CTEntry{Proto: 6, Src: b, SrcPort: 80, Dst: a, DstPort: 40000})
	if !ok || local.Src != a || local.SrcEndpoint != 1 || local.DstEndpoint != 2 || !local.SeenReply() || !local.Closing() || local.Expires != now+2e12 {
		t.Errorf("the local flow: %+v %v", local, ok)
	}
	remote, ok, _ := m.CTMap().Lookup(CTEntry{Proto: 6, Src: x, SrcPort: 5555, Dst: b, DstPort: 22})
	if !ok || remote.Src != x || remote.SrcEndpoint != 0 || remote.DstEndpoint != 2 {
		t.Errorf("the remote peer's flow: %+v %v", remote, ok)
	}
	// A map of another shape under the v1 name is not read.
	wrong, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 40, ValueSize: 32, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if _, err := MigrateCTV1(wrong, m.CTMap(), now); err == nil {
		t.Error("a map of another layout was read as v1")
	}
}

func TestPrivilegedEndpointMaps(t *testing.T) {
	m := newUnpinnedMaps(t)
	em := m.EndpointMap()
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	a := Endpoint{ID: 7, IfIndex: 40, Identity: 1000, IPv4: netip.MustParseAddr("10.0.0.7"), IPv6: netip.MustParseAddr("fd00::7"),
		Flags: FlagEnforceIngress | FlagDeliverDirect, MAC: mac, HostMAC: mac}
	if err := em.Upsert(a); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []netip.Addr{a.IPv4, netip.MustParseAddr("::ffff:10.0.0.7"), a.IPv6} {
		e, ok, err := em.LookupAddr(ip)
		if err != nil || !ok || e.ID != 7 || e.IfIndex != 40 || !e.EnforceIngress() {
			t.Errorf("lookup %s: %+v %v %v", ip, e, ok, err)
		}
	}
	if e, ok, err := em.LookupID(7); err != nil || !ok || e.IPv6 != a.IPv6 {
		t.Errorf("lookup by ID: %+v %v %v", e, ok, err)
	}
	// The veth is recreated: the interface entry moves, the old one goes
	// (found through the address entries).
	a.IfIndex = 41
	if err := em.Upsert(a); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := em.Lookup(40); ok {
		t.Error("stale interface entry kept")
	}
	if n, _ := em.Count(); n != 3 {
		t.Errorf("%d entries, want 3", n)
	}
	// Another endpoint took a's IPv4 address meanwhile: deleting a must
	// not remove the new owner's entry.
	b := Endpoint{ID: 8, IfIndex: 50, IPv4: a.IPv4}
	if err := em.Upsert(b); err != nil {
		t.Fatal(err)
	}
	if err := em.DeleteID(7); err != nil {
		t.Fatal(err)
	}
	if e, ok, _ := em.LookupAddr(a.IPv4); !ok || e.ID != 8 {
		t.Errorf("the new owner's address entry: %+v %v", e, ok)
	}
	if list, _ := em.List(); len(list) != 1 || list[0].ID != 8 {
		t.Errorf("endpoints left: %+v", list)
	}
	// The array slots follow: 8 at its ifindex and ID, 7 nowhere.
	slot := func(arr *ebpf.Map, k uint32) uint16 {
		var v bpf.LxcEndpointInfo
		if err := arr.Lookup(k, &v); err != nil {
			t.Fatal(err)
		}
		return v.EpId
	}
	if slot(m.EndpointsIfx, 50) != 8 || slot(m.EndpointsID, 8) != 8 || slot(m.EndpointsIfx, 41) != 0 || slot(m.EndpointsID, 7) != 0 {
		t.Errorf("slots: ifindex 50 → %d, ID 8 → %d, ifindex 41 → %d, ID 7 → %d", slot(m.EndpointsIfx, 50), slot(m.EndpointsID, 8),
			slot(m.EndpointsIfx, 41), slot(m.EndpointsID, 7))
	}
	// An ifindex beyond the array lives in the hash only.
	c := Endpoint{ID: 9, IfIndex: m.EndpointsIfx.MaxEntries() + 5, IPv4: netip.MustParseAddr("10.0.0.9")}
	if err := em.Upsert(c); err != nil {
		t.Fatal(err)
	}
	if e, ok, _ := em.Lookup(c.IfIndex); !ok || e.ID != 9 || slot(m.EndpointsID, 9) != 9 {
		t.Errorf("endpoint with a large ifindex: %+v %v", e, ok)
	}
	// Slots lost or left behind (an upgrade from a datapath without
	// arrays, a crash between writes) are rebuilt from the hash.
	if err := m.EndpointsID.Put(uint32(8), &bpf.LxcEndpointInfo{}); err != nil {
		t.Fatal(err)
	}
	if err := m.EndpointsIfx.Put(uint32(77), &bpf.LxcEndpointInfo{EpId: 77}); err != nil {
		t.Fatal(err)
	}
	if err := em.RebuildSlots(); err != nil {
		t.Fatal(err)
	}
	if slot(m.EndpointsID, 8) != 8 || slot(m.EndpointsIfx, 50) != 8 || slot(m.EndpointsIfx, 77) != 0 || slot(m.EndpointsID, 9) != 9 {
		t.Errorf("after the rebuild: ID 8 → %d, ifindex 50 → %d, ifindex 77 → %d, ID 9 → %d", slot(m.EndpointsID, 8),
			slot(m.EndpointsIfx, 50), slot(m.EndpointsIfx, 77), slot(m.EndpointsID, 9))
	}
}

// TestPrivilegedCTRevoke: revoking an endpoint's admission unnames it on
// its side of the entry and marks that side, whichever side of the key it
// is; the other endpoint keeps its admission; a second revoke, or one for
// an endpoint the entry does not name, changes nothing.
func TestPrivilegedCTRevoke(t *testing.T) {
	m := newUnpinnedMaps(t)
	ct := m.CTMap()
	for _, e := range []CTEntry{
		{Proto: 6, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 40000, DstPort: 80, SrcEndpoint: 1, DstEndpoint: 2, Expires: 1 << 40},
		{Proto: 6, Src: netip.MustParseAddr("10.0.0.9"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 40000, DstPort: 80, SrcEndpoint: 3, DstEndpoint: 2, Expires: 1 << 40},
		{Proto: 17, Src: netip.MustParseAddr("fd00::9"), Dst: netip.MustParseAddr("fd00::2"), SrcPort: 5353, DstPort: 53, SrcEndpoint: 3, DstEndpoint: 2, Expires: 1 << 40},
	} {
		if err := ct.Upsert(e); err != nil {
			t.Fatal(err)
		}
		if ok, err := ct.Revoke(e, 7); err != nil || ok {
			t.Fatalf("%v: revoke of an endpoint it does not name = %v %v", e, ok, err)
		}
		if ok, err := ct.Revoke(e, 2); err != nil || !ok {
			t.Fatalf("%v: revoke = %v %v", e, ok, err)
		}
		got, found, err := ct.Lookup(e)
		if err != nil || !found {
			t.Fatalf("%v: entry gone after revoke: %v", e, err)
		}
		want := e
		want.DstEndpoint, want.DstRevoked = 0, true
		if got != want {
			t.Errorf("after revoke: %+v, want %+v", got, want)
		}
		if ok, err := ct.Revoke(e, 2); err != nil || ok {
			t.Errorf("%v: second revoke = %v %v", e, ok, err)
		}
	}
	if ok, err := ct.Revoke(CTEntry{Proto: 6, Src: netip.MustParseAddr("10.9.9.9"), Dst: netip.MustParseAddr("10.9.9.8"), SrcPort: 1, DstPort: 2}, 2); err != nil || ok {
		t.Errorf("revoke of a missing entry = %v %v", ok, err)
	}
}

// TestPrivilegedConntrackSweepKeepsHostFirewallFlows: the host firewall
// names the node's side of the flows it admitted HostFirewallCTID, no
// endpoint's ID; a sweep that keeps only live endpoints' flows keeps
// those (deleted, the next reply of the node's own connection would be
// checked as a new flow and denied under an ingress host policy).
func TestPrivilegedConntrackSweepKeepsHostFirewallFlows(t *testing.T) {
	m := newUnpinnedMaps(t)
	ct := m.CTMap()
	now := MonotonicNow()
	node, world := netip.MustParseAddr("172.30.0.11"), netip.MustParseAddr("198.51.100.1")
	host := CTEntry{Proto: 6, Src: node, SrcPort: 50000, Dst: world, DstPort: 443, SrcEndpoint: HostFirewallCTID, Expires: now + 1e12}
	expired := CTEntry{Proto: 6, Src: node, SrcPort: 50001, Dst: world, DstPort: 443, SrcEndpoint: HostFirewallCTID, Expires: now - 1}
	for _, e := range []CTEntry{host, expired} {
		if err := ct.Upsert(e); err != nil {
			t.Fatal(err)
		}
	}
	res, err := ct.DeleteExpired(now, func(uint16) bool { return false })
	if err != nil || res.Deleted != 1 {
		t.Fatalf("sweep: %+v %v, want the expired entry deleted", res, err)
	}
	if got, ok, _ := ct.Lookup(host); !ok || got.SrcEndpoint != HostFirewallCTID {
		t.Fatalf("the host firewall's live flow after a sweep: %+v %v", got, ok)
	}
}

// TestPrivilegedConntrackDeletePeerFlows: the flows of a remote pod that
// left go (either direction, either family); a local endpoint's side
// with the same address, and other peers' flows, stay.
func TestPrivilegedConntrackDeletePeerFlows(t *testing.T) {
	m := newUnpinnedMaps(t)
	ct := m.CTMap()
	now := MonotonicNow()
	gone, other, local := netip.MustParseAddr("10.9.1.5"), netip.MustParseAddr("10.9.1.6"), netip.MustParseAddr("10.9.0.3")
	gone6, local6 := netip.MustParseAddr("fd00:9:1::5"), netip.MustParseAddr("fd00:9::3")
	entries := []CTEntry{
		{Proto: 6, Src: gone, SrcPort: 32972, Dst: local, DstPort: 80, DstEndpoint: 4, Expires: now + 1e12},   // the gone pod's connection in
		{Proto: 6, Src: local, SrcPort: 40000, Dst: gone, DstPort: 443, SrcEndpoint: 4, Expires: now + 1e12},  // the local pod's to it
		{Proto: 17, Src: gone6, SrcPort: 5000, Dst: local6, DstPort: 53, DstEndpoint: 4, Expires: now + 1e12}, // IPv6
		{Proto: 6, Src: other, SrcPort: 32972, Dst: local, DstPort: 80, DstEndpoint: 4, Expires: now + 1e12},  // another peer
		{Proto: 6, Src: gone, SrcPort: 1, Dst: local, DstPort: 2, SrcEndpoint: 9, Expires: now + 1e12},        // gone's address, a local endpoint's side
	}
	for _, e := range entries {
		if err := ct.Upsert(e); err != nil {
			t.Fatal(err)
		}
	}
	res, err := ct.DeletePeerFlows(map[netip.Addr]bool{gone: true, gone6: true})
	if err != nil || res.Seen != 5 || res.Deleted != 3 {
		t.Fatalf("sweep: %+v %v", res, err)
	}
	for i, e := range entries {
		_, ok, err := ct.Lookup(e)
		if err != nil {
			t.Fatal(err)
		}
		if want := i >= 3; ok != want {
			t.Errorf("entry %d (%s -> %s) present %v, want %v", i, e.Src, e.Dst, ok, want)
		}
	}
}
