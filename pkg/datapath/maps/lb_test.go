package maps

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// newUnpinnedLBMaps creates the load-balancing maps as the pod object
// declares them, without pins.
func newUnpinnedLBMaps(t *testing.T) *LBMaps {
	t.Helper()
	testutil.Privileged(t)
	spec, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	m := &LBMaps{}
	for name, dst := range m.fields() {
		ms := spec.Maps[name].Copy()
		ms.Pinning = ebpf.PinNone
		mp, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		*dst = mp
	}
	t.Cleanup(m.Close)
	return m
}

func TestLBHashMatchesDefinition(t *testing.T) {
	// murmur3's finalizer of (seed ^ word), word by word, as lb.h does;
	// the expected values are computed by hand from that definition.
	fmix := func(h uint32) uint32 {
		h ^= h >> 16
		h *= 0x85ebca6b
		h ^= h >> 13
		h *= 0xc2b2ae35
		return h ^ h>>16
	}
	if got, want := LBHash(), LBHashSeed; got != want {
		t.Errorf("LBHash() = %#x, want the seed %#x", got, want)
	}
	if got, want := LBHashCookie(0x0000000500000007), fmix(fmix(LBHashSeed^7)^5); got != want {
		t.Errorf("LBHashCookie = %#x, want %#x", got, want)
	}
	if LBHashCookie(1) == LBHashCookie(2) {
		t.Error("cookies 1 and 2 hash alike")
	}
}

func TestFrontendValidation(t *testing.T) {
	for name, f := range map[string]Frontend{
		"no address":   {Port: 80, Proto: ProtoTCP},
		"ICMP service": {Addr: netip.MustParseAddr("10.96.0.1"), Port: 0, Proto: 1},
	} {
		if err := f.validate(); err == nil {
			t.Errorf("%s: %s accepted", name, f)
		}
	}
	if _, err := (Service{ID: 0, RevNATID: 1}).raw(); err == nil {
		t.Error("service ID 0 accepted")
	}
	if _, err := (Service{ID: 1, RevNATID: LBMaxIds}).raw(); err == nil {
		t.Error("reverse NAT ID beyond the maps accepted")
	}
	if _, err := (Backend{Addr: netip.MustParseAddr("10.0.0.1"), State: 9}).raw(); err == nil {
		t.Error("unknown backend state accepted")
	}
}

func TestPrivilegedLBServicesAndBackends(t *testing.T) {
	m := newUnpinnedLBMaps(t)
	fe4 := Frontend{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: ProtoUDP}
	fe4tcp := Frontend{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: ProtoTCP}
	fe6 := Frontend{Addr: netip.MustParseAddr("fd00:96::a"), Port: 443, Proto: ProtoTCP}
	// A v4-mapped address is the IPv4 frontend.
	mapped := Frontend{Addr: netip.MustParseAddr("::ffff:10.96.0.10"), Port: 53, Proto: ProtoUDP}

	backends := map[uint32]Backend{
		1: {Addr: netip.MustParseAddr("10.0.1.5"), Port: 5353},
		2: {Addr: netip.MustParseAddr("10.0.2.5"), Port: 5353, State: BackendStateTerminating},
		3: {Addr: netip.MustParseAddr("fd00:1::5"), Port: 8443},
	}
	bm := m.BackendMap()
	if err := bm.UpsertBatch(backends); err != nil {
		t.Fatal(err)
	}
	for id, want := range backends {
		got, ok, err := bm.Lookup(id)
		if err != nil || !ok || got != want {
			t.Errorf("backend %d = %+v, %v, %v; want %+v", id, got, ok, err, want)
		}
	}
	if n, _ := bm.Count(); n != 3 {
		t.Errorf("%d backends, want 3", n)
	}

	if err := m.ApplyService(fe4, Service{ID: 7, RevNATID: 7, Flags: SvcFlagAffinity, AffinityTimeout: 10800}, []uint32{1, 2}, 0); err != nil {
		t.Fatal(err)
	}
	if err := m.ApplyService(fe6, Service{ID: 8, RevNATID: 8, Flags: SvcFlagMaglev}, []uint32{3}, 0); err != nil {
		t.Fatal(err)
	}
	sm := m.ServiceMap()
	got, ok, err := sm.Lookup(mapped)
	if err != nil || !ok || got != (Service{ID: 7, RevNATID: 7, Count: 2, Flags: SvcFlagAffinity, AffinityTimeout: 10800}) {
		t.Errorf("IPv4 service = %+v, %v, %v", got, ok, err)
	}
	if _, ok, _ := sm.Lookup(fe4tcp); ok {
		t.Error("the TCP frontend of the same address and port was found: the protocol is part of the key")
	}
	if got, ok, _ := sm.Lookup(fe6); !ok || got.Count != 1 || got.Flags != SvcFlagMaglev {
		t.Errorf("IPv6 service = %+v, %v", got, ok)
	}
	seen := map[Frontend]Service{}
	if err := sm.Iterate(func(f Frontend, s Service) bool { seen[f] = s; return true }); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || seen[fe4].ID != 7 || seen[fe6].ID != 8 {
		t.Errorf("iterated %v", seen)
	}
	if fe, ok, _ := m.RevNATMap().Lookup(8); !ok || fe != netip.MustParseAddrPort("[fd00:96::a]:443") {
		t.Errorf("reverse NAT 8 = %s, %v", fe, ok)
	}
	if slots, _ := m.SlotMap().Get(7, 3); !slices.Equal(slots, []uint32{1, 2, 0}) {
		t.Errorf("slots of service 7 = %v", slots)
	}

	// Shrinking to one backend rewrites slot 1 and deletes slot 2.
	if err := m.ApplyService(fe4, Service{ID: 7, RevNATID: 7}, []uint32{2}, 2); err != nil {
		t.Fatal(err)
	}
	if slots, _ := m.SlotMap().Get(7, 2); !slices.Equal(slots, []uint32{2, 0}) {
		t.Errorf("slots of service 7 after shrinking = %v", slots)
	}
	if s, _, _ := sm.Lookup(fe4); s.Count != 1 {
		t.Errorf("count after shrinking = %d", s.Count)
	}

	// Affinity: entries are deleted by service and backend.
	am := m.AffinityMap()
	ka := AffinityKey{Client: netip.MustParseAddr("10.0.3.4"), ServiceID: 7}
	kb := AffinityKey{NetnsCookie: 0x1234567890, ServiceID: 7}
	kc := AffinityKey{Client: netip.MustParseAddr("fd00:3::4"), ServiceID: 8}
	// A skipped client's affinity to the original backends is its own
	// entry beside its affinity as a redirected client.
	kd := AffinityKey{NetnsCookie: 0x1234567890, ServiceID: 7, Original: true}
	for k, b := range map[AffinityKey]uint32{ka: 1, kb: 2, kc: 3, kd: 4} {
		if err := am.Upsert(k, Affinity{BackendID: b, LastUsed: 42}); err != nil {
			t.Fatal(err)
		}
	}
	if a, ok, _ := am.Lookup(kb); !ok || a.BackendID != 2 || a.LastUsed != 42 {
		t.Errorf("affinity by netns = %+v, %v", a, ok)
	}
	keys := map[AffinityKey]bool{}
	_ = am.Iterate(func(k AffinityKey, _ Affinity) bool { keys[k] = true; return true })
	if a, ok, _ := am.Lookup(kd); !ok || a.BackendID != 4 {
		t.Errorf("affinity to the original backends = %+v, %v", a, ok)
	}
	if !keys[ka] || !keys[kb] || !keys[kc] || !keys[kd] || len(keys) != 4 {
		t.Errorf("iterated affinity keys %v", keys)
	}
	if n, err := am.DeleteMatching(7, 1); err != nil || n != 1 {
		t.Errorf("DeleteMatching(7, 1) = %d, %v", n, err)
	}
	if _, ok, _ := am.Lookup(ka); ok {
		t.Error("the affinity to backend 1 survived")
	}
	if _, ok, _ := am.Lookup(kb); !ok {
		t.Error("the affinity to backend 2 was deleted")
	}

	// Maglev tables are replaced whole.
	mm := m.MaglevMap()
	table := make([]uint32, LBMaglevTableSize)
	for i := range table {
		table[i] = uint32(i%3) + 1
	}
	if err := mm.Upsert(8, table[:100]); err == nil {
		t.Error("a table of the wrong size accepted")
	}
	if err := mm.Upsert(8, table); err != nil {
		t.Fatal(err)
	}
	if back, ok, err := mm.Lookup(8); err != nil || !ok || !slices.Equal(back, table) {
		t.Errorf("Maglev table read back: ok %v, err %v, equal %v", ok, err, slices.Equal(back, table))
	}

	// Removing a service leaves its reverse NAT entry for the flows it
	// translated, and nothing else of it.
	if err := m.RemoveService(fe6, Service{ID: 8, RevNATID: 8, Count: 1}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := sm.Lookup(fe6); ok {
		t.Error("removed service still found")
	}
	if _, ok, _ := mm.Lookup(8); ok {
		t.Error("removed service's Maglev table still there")
	}
	if _, ok, _ := am.Lookup(kc); ok {
		t.Error("removed service's affinity still there")
	}
	if slots, _ := m.SlotMap().Get(8, 1); slots[0] != 0 {
		t.Error("removed service's slot still there")
	}
	if _, ok, _ := m.RevNATMap().Lookup(8); !ok {
		t.Error("reverse NAT entry removed with the service")
	}
	if n, _ := sm.Count(); n != 1 {
		t.Errorf("%d services, want 1", n)
	}
}

// TestPrivilegedLBMapsPinnedWithPodObject: loading the pod object pins the
// load-balancing maps under the BPF root, and OpenPinnedLB finds them
// there with what was written through the object's handles.
func TestPrivilegedLBMapsPinnedWithPodObject(t *testing.T) {
	testutil.Privileged(t)
	if _, err := bpffs.EnsureMounted(); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/sys/fs/bpf", "tendril-lb-maps-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var objs bpf.LxcObjects
	if err := bpf.LoadLxcObjects(&objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}); err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	lb := FromObjects(&objs.LxcMaps).LB
	fe := Frontend{Addr: netip.MustParseAddr("10.96.0.1"), Port: 443, Proto: ProtoTCP}
	if err := lb.BackendMap().Upsert(1, Backend{Addr: netip.MustParseAddr("10.0.0.9"), Port: 6443}); err != nil {
		t.Fatal(err)
	}
	if err := lb.ApplyService(fe, Service{ID: 1, RevNATID: 1}, []uint32{1}, 0); err != nil {
		t.Fatal(err)
	}
	pinned, err := OpenPinnedLB(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if s, ok, err := pinned.ServiceMap().Lookup(fe); err != nil || !ok || s.Count != 1 {
		t.Errorf("pinned service = %+v, %v, %v", s, ok, err)
	}
	if b, ok, _ := pinned.BackendMap().Lookup(1); !ok || b.AddrPort() != netip.MustParseAddrPort("10.0.0.9:6443") {
		t.Errorf("pinned backend = %+v, %v", b, ok)
	}
	if pinned.Skip4 == nil || pinned.SkipSrc == nil {
		t.Error("the skip maps were pinned but not opened")
	}
	// An earlier agent's pins, without the skipRedirectFromBackend maps:
	// the others still open.
	for _, name := range []string{LB4SkipMapName, LB6SkipMapName, LBSkipSrcMapName} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	older, err := OpenPinnedLB(dir, true)
	if err != nil {
		t.Fatalf("pins without the skip maps: %v", err)
	}
	defer older.Close()
	if older.Skip4 != nil {
		t.Error("a skip map opened that is not pinned")
	}
	if s, ok, err := older.ServiceMap().Lookup(fe); err != nil || !ok || s.Count != 1 {
		t.Errorf("pinned service without the skip maps = %+v, %v, %v", s, ok, err)
	}
}
