package maps

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedCopyEntriesAcrossBatches: a slots map of the old capacity
// holding more entries than one batch moves into a larger one, every
// entry with its value.
func TestPrivilegedCopyEntriesAcrossBatches(t *testing.T) {
	testutil.Privileged(t)
	mk := func(n uint32) *ebpf.Map {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: n, Flags: 1 /* BPF_F_NO_PREALLOC */})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	old, dst := mk(3*copyBatch), mk(8*copyBatch)
	const n = 2*copyBatch + 17
	slots := SlotMap{m: old}
	for svc := uint32(1); svc <= n/10+1; svc++ {
		ids := make([]uint32, 10)
		for i := range ids {
			ids[i] = svc*100 + uint32(i)
		}
		if err := slots.Set(svc, ids, 0); err != nil {
			t.Fatal(err)
		}
	}
	want := map[[2]uint32]uint32{}
	if err := slots.Iterate(func(svc, slot, backend uint32) bool { want[[2]uint32{svc, slot}] = backend; return true }); err != nil {
		t.Fatal(err)
	}
	res, err := CopyEntries(old, dst)
	if err != nil {
		t.Fatal(err)
	}
	if res.Read != len(want) || res.Written != len(want) {
		t.Errorf("copied %+v, want %d", res, len(want))
	}
	got := map[[2]uint32]uint32{}
	if err := (SlotMap{m: dst}).Iterate(func(svc, slot, backend uint32) bool { got[[2]uint32{svc, slot}] = backend; return true }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d entries in the new map, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("slot %v: %d, want %d", k, got[k], v)
		}
	}
	other := mk(16)
	small, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	if _, err := CopyEntries(small, other); err == nil {
		t.Error("copy between maps of other key sizes succeeded")
	}
}

// TestPrivilegedMigrateCTFlowV1: conntrack entries of layout v1 (16-bit
// reverse NAT ID) become v2 entries with every field kept; expired ones
// are dropped and an entry the new table already has wins.
func TestPrivilegedMigrateCTFlowV1(t *testing.T) {
	m := newUnpinnedMaps(t)
	v1 := func(keySize uint32) *ebpf.Map {
		old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: keySize, ValueSize: 16, MaxEntries: 64})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { old.Close() })
		return old
	}
	old4, old6 := v1(m.CT4.KeySize()), v1(m.CT6.KeySize())
	now := MonotonicNow()
	live := CTEntry{Proto: ProtoTCP, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 40000, DstPort: 8080,
		SrcEndpoint: 3, DstEndpoint: 4, Expires: now + 60e9, Flags: CTFlagSeenReply, TCPFlags: 0x12, RevNAT: 65000}
	expired := live
	expired.SrcPort, expired.Expires = 40001, now-1
	kept := live
	kept.SrcPort, kept.RevNAT = 40002, 7
	live6 := live
	live6.Src, live6.Dst = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	put := func(old *ebpf.Map, e CTEntry, v6 bool) {
		v := e.value()
		ov := ctEntryFlowV1{Expires: v.Expires, EpA: v.EpA, EpB: v.EpB, Flags: v.Flags, TcpFlags: v.TcpFlags, RevNat: uint16(v.RevNat)}
		var err error
		if v6 {
			err = old.Put(e.key6(), ov)
		} else {
			err = old.Put(e.key4(), ov)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	put(old4, live, false)
	put(old4, expired, false)
	put(old4, kept, false)
	put(old6, live6, true)
	newer := kept
	newer.RevNAT = 9
	if err := m.CTMap().Upsert(newer); err != nil {
		t.Fatal(err)
	}
	res, err := MigrateCTFlowV1(old4, m.CTMap(), false, now)
	if err != nil || res.Read != 3 || res.Written != 1 {
		t.Fatalf("IPv4: %+v, %v", res, err)
	}
	if res, err := MigrateCTFlowV1(old6, m.CTMap(), true, now); err != nil || res.Written != 1 {
		t.Fatalf("IPv6: %+v, %v", res, err)
	}
	for _, c := range []struct {
		e      CTEntry
		ok     bool
		revNAT uint32
	}{{live, true, 65000}, {expired, false, 0}, {newer, true, 9}, {live6, true, 65000}} {
		got, ok, err := m.CTMap().Lookup(c.e)
		if err != nil || ok != c.ok {
			t.Fatalf("%s:%d: found %v (%v), want %v", c.e.Src, c.e.SrcPort, ok, err, c.ok)
		}
		if ok && (got.RevNAT != c.revNAT || got.Expires != c.e.Expires || got.SrcEndpoint != 3 || got.DstEndpoint != 4 ||
			got.Flags != CTFlagSeenReply || got.TCPFlags != 0x12) {
			t.Errorf("%s:%d carried over as %+v", c.e.Src, c.e.SrcPort, got)
		}
	}
	if _, err := MigrateCTFlowV1(m.CT4, m.CTMap(), false, now); err == nil {
		t.Error("a v2 table read as v1")
	}
}

// TestPrivilegedLBSizes: the flags' sizes go into the spec of every LB
// map; an object loaded next to pins of other capacities takes theirs.
func TestPrivilegedLBSizes(t *testing.T) {
	testutil.Privileged(t)
	if err := (LBSizes{MapMax: LBMaxIds}).Validate(); err == nil {
		t.Error("a map larger than the ID space accepted")
	}
	spec, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	if spec.Maps[LBSlotsMapName].MaxEntries != LBSlotsMapMax || spec.Maps[LB4ServicesMapName].MaxEntries != LBMapMax {
		t.Fatalf("defaults: %d slots, %d services", spec.Maps[LBSlotsMapName].MaxEntries, spec.Maps[LB4ServicesMapName].MaxEntries)
	}
	if LBSlotsMapMax < 100_000*10 || LBMapMax < 100_000 {
		t.Fatalf("the defaults do not hold 100,000 services of 10 backends: %d slots, %d services", LBSlotsMapMax, LBMapMax)
	}
	LBSizes{MapMax: 1000, SlotsMapMax: 5000}.Apply(spec)
	for _, name := range []string{LB4ServicesMapName, LB6ServicesMapName, LBBackendsMapName, LBRevNATMapName, LBMaglevMapName} {
		if spec.Maps[name].MaxEntries != 1000 {
			t.Errorf("%s: %d entries", name, spec.Maps[name].MaxEntries)
		}
	}
	if spec.Maps[LBSlotsMapName].MaxEntries != 5000 {
		t.Errorf("slots: %d entries", spec.Maps[LBSlotsMapName].MaxEntries)
	}

	root := filepath.Join("/sys/fs/bpf", "tendril-sizetest-"+t.Name())
	if err := os.MkdirAll(root, 0o750); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	ms := spec.Maps[LBSlotsMapName].Copy()
	ms.Pinning = ebpf.PinNone
	pinned, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatal(err)
	}
	if err := pinned.Pin(filepath.Join(root, LBSlotsMapName)); err != nil {
		t.Fatal(err)
	}
	pinned.Close()
	other, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	AdoptPinnedSizes(other, root)
	if other.Maps[LBSlotsMapName].MaxEntries != 5000 || other.Maps[LBBackendsMapName].MaxEntries != LBMapMax {
		t.Errorf("adopted: %d slots, %d backends", other.Maps[LBSlotsMapName].MaxEntries, other.Maps[LBBackendsMapName].MaxEntries)
	}
}
