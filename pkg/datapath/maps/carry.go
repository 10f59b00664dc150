package maps

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// Carrying entries over into a map of another capacity, and the
// conntrack layout v1 (16-bit reverse NAT IDs) into v2.

// Resizable reports whether a pinned map of this type can be carried over
// entry by entry into a new map of another capacity (CopyEntries): hash
// maps, whose entries are their contents. Arrays, tries of maps and ring
// buffers are replaced as before.
func Resizable(t ebpf.MapType) bool {
	switch t {
	case ebpf.Hash, ebpf.LRUHash:
		return true
	}
	return false
}

// copyBatch is how many entries one batch system call moves.
const copyBatch = 4096

// CopyEntries copies every entry of old into dst (same key and value
// sizes, any capacities): the loader's carry-over when a map's capacity
// changed (a flag such as --bpf-lb-map-max). Entries dst already has are
// overwritten. It moves entries in batches (one system call per 4,096);
// a kernel without batch operations on the map gets them one by one.
func CopyEntries(old, dst *ebpf.Map) (MigrationResult, error) {
	var res MigrationResult
	if old.KeySize() != dst.KeySize() || old.ValueSize() != dst.ValueSize() {
		return res, fmt.Errorf("%w: key %d/%d bytes, value %d/%d bytes", errLayoutMismatch, old.KeySize(), dst.KeySize(), old.ValueSize(), dst.ValueSize())
	}
	keyT := reflect.ArrayOf(int(old.KeySize()), reflect.TypeFor[byte]())
	valT := reflect.ArrayOf(int(old.ValueSize()), reflect.TypeFor[byte]())
	keys := reflect.MakeSlice(reflect.SliceOf(keyT), copyBatch, copyBatch)
	vals := reflect.MakeSlice(reflect.SliceOf(valT), copyBatch, copyBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := old.BatchLookup(&cursor, keys.Interface(), vals.Interface(), nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			return copyOneByOne(old, dst)
		}
		if n > 0 {
			res.Read += n
			w, uerr := dst.BatchUpdate(keys.Slice(0, n).Interface(), vals.Slice(0, n).Interface(), nil)
			res.Written += w
			if uerr != nil {
				return res, fmt.Errorf("write %d entries: %w", n, uerr)
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return res, nil
		}
		if err != nil {
			return res, fmt.Errorf("read entries: %w", err)
		}
	}
}

func copyOneByOne(old, dst *ebpf.Map) (MigrationResult, error) {
	var res MigrationResult
	k := make([]byte, old.KeySize())
	v := make([]byte, old.ValueSize())
	it := old.Iterate()
	for it.Next(&k, &v) {
		res.Read++
		if err := dst.Update(k, v, ebpf.UpdateAny); err != nil {
			return res, fmt.Errorf("write an entry: %w", err)
		}
		res.Written++
	}
	if err := it.Err(); err != nil {
		return res, fmt.Errorf("read entries: %w", err)
	}
	return res, nil
}

// Pinned names of conntrack layout v1 (up to the widening of the reverse
// NAT ID): one entry per flow as now, the reverse NAT ID in 16 bits.
const (
	CT4V1MapName = "tdr_ct4_v1"
	CT6V1MapName = "tdr_ct6_v1"
)

// ctEntryFlowV1 mirrors struct ct_entry of tdr_ct4_v1/tdr_ct6_v1.
type ctEntryFlowV1 struct {
	Expires  uint64
	EpA      uint16
	EpB      uint16
	Flags    uint8
	TcpFlags uint8
	RevNat   uint16
}

// MigrateCTFlowV1 copies the live flows of a conntrack table of layout v1
// (tdr_ct4_v1 or tdr_ct6_v1: keys as now, the reverse NAT ID in 16 bits)
// into the current table of the same family, whose entries are wider.
// Keys and every field keep their values, so a flow continues as
// established and a translated flow's replies keep their frontend.
// Entries that expired before now are dropped; an entry the new table
// already has (the new programs made it) is kept.
func MigrateCTFlowV1(old *ebpf.Map, dst CTMap, v6 bool, now uint64) (MigrationResult, error) {
	if v6 {
		return migrateCTFlowV1[bpf.LxcCt6Key](old, dst.v6, now)
	}
	return migrateCTFlowV1[bpf.LxcCt4Key](old, dst.v4, now)
}

func migrateCTFlowV1[K bpf.LxcCt4Key | bpf.LxcCt6Key](old, dst *ebpf.Map, now uint64) (MigrationResult, error) {
	var res MigrationResult
	var k K
	if err := checkLayout(old, unsafe.Sizeof(k), unsafe.Sizeof(ctEntryFlowV1{})); err != nil {
		return res, err
	}
	var keys []K
	var vals []bpf.LxcCtEntry
	var v ctEntryFlowV1
	it := old.Iterate()
	for it.Next(&k, &v) {
		res.Read++
		if v.Expires <= now {
			continue
		}
		keys = append(keys, k)
		vals = append(vals, bpf.LxcCtEntry{Expires: v.Expires, EpA: v.EpA, EpB: v.EpB, Flags: v.Flags, TcpFlags: v.TcpFlags, RevNat: uint32(v.RevNat)})
	}
	if err := it.Err(); err != nil {
		return res, fmt.Errorf("read %s: %w", old, err)
	}
	for i := range keys {
		err := dst.Update(&keys[i], &vals[i], ebpf.UpdateNoExist)
		if errors.Is(err, ebpf.ErrKeyExist) {
			continue
		}
		if err != nil {
			return res, fmt.Errorf("carry a flow over: %w", err)
		}
		res.Written++
	}
	return res, nil
}

// LBSizes are the capacities of the load-balancing maps, by flag
// (--bpf-lb-map-max, --bpf-lb-slots-map-max). A capacity is not a layout:
// the names stay, and the loader carries a pin of another capacity over
// into a map of the configured one (CopyEntries).
type LBSizes struct {
	// MapMax bounds frontends of each family, backends, reverse NAT
	// entries and Maglev tables; 0: LBMapMax.
	MapMax int
	// SlotsMapMax bounds the backend slots of all services together (a
	// service of n backends takes n); 0: LBSlotsMapMax.
	SlotsMapMax int
}

// Validate checks the sizes.
func (s LBSizes) Validate() error {
	if s.MapMax < 0 || s.MapMax >= LBMaxIds {
		return fmt.Errorf("bpf-lb-map-max %d: must be below %d", s.MapMax, LBMaxIds)
	}
	if s.SlotsMapMax < 0 || s.SlotsMapMax > 1<<28 {
		return fmt.Errorf("bpf-lb-slots-map-max %d: must be at most %d", s.SlotsMapMax, 1<<28)
	}
	return nil
}

// Apply sets the capacities in spec (an object that declares the LB
// maps; maps it does not declare are skipped).
func (s LBSizes) Apply(spec *ebpf.CollectionSpec) {
	mapMax, slots := uint32(LBMapMax), uint32(LBSlotsMapMax)
	if s.MapMax > 0 {
		mapMax = uint32(s.MapMax)
	}
	if s.SlotsMapMax > 0 {
		slots = uint32(s.SlotsMapMax)
	}
	for name, n := range map[string]uint32{
		LB4ServicesMapName: mapMax, LB6ServicesMapName: mapMax, LBBackendsMapName: mapMax, LBRevNATMapName: mapMax,
		LBMaglevMapName: mapMax, LBSlotsMapName: slots,
	} {
		if ms, ok := spec.Maps[name]; ok {
			ms.MaxEntries = n
		}
	}
}

// AdoptPinnedSizes gives every map of spec that is pinned by name and
// already pinned under root the capacity of that pin, when nothing else
// differs: an object loaded next to the pod programs (the socket hooks)
// shares their maps whatever size the loader gave them.
func AdoptPinnedSizes(spec *ebpf.CollectionSpec, root string) {
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(root, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			continue
		}
		if ms.Type == m.Type() && ms.KeySize == m.KeySize() && ms.ValueSize == m.ValueSize() {
			ms.MaxEntries = m.MaxEntries()
		}
		m.Close()
	}
}
