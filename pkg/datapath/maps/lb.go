package maps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// Pinned names of the service load-balancing maps (bpf/lib/lbmaps.h).
const (
	LB4ServicesMapName  = bpf.LxcMapTdrLb4ServicesV1
	LB6ServicesMapName  = bpf.LxcMapTdrLb6ServicesV1
	LBSlotsMapName      = bpf.LxcMapTdrLbSlotsV1
	LBBackendsMapName   = bpf.LxcMapTdrLbBackendsV1
	LBRevNATMapName     = bpf.LxcMapTdrLbRevnatV1
	LBAffinityMapName   = bpf.LxcMapTdrLbAffinityV1
	LBMaglevMapName     = bpf.LxcMapTdrLbMaglevV1
	LBSockRevNATMapName = bpf.LxcMapTdrLbSockRevnatV1
	LB4SrcRangeMapName  = bpf.LxcMapTdrLb4SrcrangeV1
	LB4SkipMapName      = bpf.LxcMapTdrLb4SkipV1
	LB6SkipMapName      = bpf.LxcMapTdrLb6SkipV1
	LBSkipSrcMapName    = bpf.LxcMapTdrLbSkipsrcV1
	LB6SrcRangeMapName  = bpf.LxcMapTdrLb6SrcrangeV1
)

// L4 protocols a frontend may have.
const (
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// LBMaps are the node's service load-balancing maps, shared by the pod
// programs (per-packet translation) and the socket hooks (bpf_sock.c).
type LBMaps struct {
	Services4  *ebpf.Map // IPv4 frontend -> service
	Services6  *ebpf.Map // IPv6 frontend -> service
	Slots      *ebpf.Map // (service ID, slot) -> backend ID
	Backends   *ebpf.Map // backend ID -> backend
	RevNAT     *ebpf.Map // reverse NAT ID -> frontend
	Affinity   *ebpf.Map // (client, service ID) -> backend ID, last use
	Maglev     *ebpf.Map // service ID -> Maglev table
	SockRevNAT *ebpf.Map // (socket cookie, backend) -> frontend
	SrcRange4  *ebpf.Map // (reverse NAT ID, IPv4 client prefix): loadBalancerSourceRanges
	SrcRange6  *ebpf.Map // (reverse NAT ID, IPv6 client prefix)
	Skip4      *ebpf.Map // (netns cookie, IPv4 frontend) -> LBSkip*: skipRedirectFromBackend
	Skip6      *ebpf.Map // (netns cookie, IPv6 frontend) -> LBSkip*
	SkipSrc    *ebpf.Map // (client address, frontend) -> LBSkip*: the per-packet path's
}

// LBFromObjects takes the load-balancing maps of the loaded pod object.
func LBFromObjects(o *bpf.LxcMaps) *LBMaps {
	return &LBMaps{Services4: o.TdrLb4ServicesV1, Services6: o.TdrLb6ServicesV1, Slots: o.TdrLbSlotsV1, Backends: o.TdrLbBackendsV1,
		RevNAT: o.TdrLbRevnatV1, Affinity: o.TdrLbAffinityV1, Maglev: o.TdrLbMaglevV1, SockRevNAT: o.TdrLbSockRevnatV1,
		SrcRange4: o.TdrLb4SrcrangeV1, SrcRange6: o.TdrLb6SrcrangeV1, Skip4: o.TdrLb4SkipV1, Skip6: o.TdrLb6SkipV1, SkipSrc: o.TdrLbSkipsrcV1}
}

func (m *LBMaps) fields() map[string]**ebpf.Map {
	return map[string]**ebpf.Map{
		LB4ServicesMapName: &m.Services4, LB6ServicesMapName: &m.Services6, LBSlotsMapName: &m.Slots, LBBackendsMapName: &m.Backends,
		LBRevNATMapName: &m.RevNAT, LBAffinityMapName: &m.Affinity, LBMaglevMapName: &m.Maglev, LBSockRevNATMapName: &m.SockRevNAT,
		LB4SrcRangeMapName: &m.SrcRange4, LB6SrcRangeMapName: &m.SrcRange6, LB4SkipMapName: &m.Skip4, LB6SkipMapName: &m.Skip6, LBSkipSrcMapName: &m.SkipSrc,
	}
}

// OpenPinnedLB opens the load-balancing maps pinned under root (a node's
// BPF root) without loading any program. The skipRedirectFromBackend maps
// are left nil when absent: an agent of an earlier version, which did not
// have them, may have pinned the rest.
func OpenPinnedLB(root string, readOnly bool) (*LBMaps, error) {
	m := &LBMaps{}
	opts := &ebpf.LoadPinOptions{ReadOnly: readOnly}
	for name, dst := range m.fields() {
		mp, err := ebpf.LoadPinnedMap(filepath.Join(root, name), opts)
		if err != nil && errors.Is(err, os.ErrNotExist) && (name == LB4SkipMapName || name == LB6SkipMapName || name == LBSkipSrcMapName) {
			continue
		}
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("open pinned map %s under %s: %w", name, root, err)
		}
		*dst = mp
	}
	return m, nil
}

// Close releases the handles (pins stay).
func (m *LBMaps) Close() {
	for _, mp := range m.fields() {
		if *mp != nil {
			(*mp).Close()
		}
	}
}

// Frontend is a service's address, port and L4 protocol.
type Frontend struct {
	Addr  netip.Addr
	Port  uint16
	Proto uint8
}

func (f Frontend) String() string {
	return fmt.Sprintf("%s/%d", netip.AddrPortFrom(f.Addr, f.Port), f.Proto)
}

func (f Frontend) validate() error {
	if !f.Addr.IsValid() {
		return fmt.Errorf("frontend %s: no address", f)
	}
	switch f.Proto {
	case ProtoTCP, ProtoUDP, ProtoSCTP:
	default:
		return fmt.Errorf("frontend %s: protocol %d is not TCP, UDP or SCTP", f, f.Proto)
	}
	return nil
}

// Service is what a frontend maps to.
type Service struct {
	// ID keys the service's slots, Maglev table and affinity entries
	// (1..LBMaxIds-1).
	ID uint32
	// RevNATID keys the frontend in the reverse NAT map.
	RevNATID uint32
	// Count is the number of active backends, in slots 1..Count; 0 drops
	// (refuses) the service's new flows.
	Count uint16
	// Flags are SvcFlag*.
	Flags uint8
	// LocalCount is, with SvcFlagExtLocal, the number of this node's
	// active backends that serve clients from outside
	// (externalTrafficPolicy Local), in slots Count+1..Count+LocalCount.
	LocalCount uint8
	// AffinityTimeout is the ClientIP affinity timeout in seconds
	// (SvcFlagAffinity).
	AffinityTimeout uint32
}

func checkID(what string, id uint32) error {
	if id == 0 || id >= LBMaxIds {
		return fmt.Errorf("%s ID %d out of range 1..%d", what, id, LBMaxIds-1)
	}
	return nil
}

func (s Service) raw() (bpf.LxcLbService, error) {
	if err := checkID("service", s.ID); err != nil {
		return bpf.LxcLbService{}, err
	}
	if err := checkID("reverse NAT", s.RevNATID); err != nil {
		return bpf.LxcLbService{}, err
	}
	return bpf.LxcLbService{SvcId: s.ID, RevNatId: s.RevNATID, Count: s.Count, Flags: s.Flags, LocalCount: s.LocalCount, AffinityTimeout: s.AffinityTimeout}, nil
}

func fromRawService(v bpf.LxcLbService) Service {
	return Service{ID: v.SvcId, RevNATID: v.RevNatId, Count: v.Count, Flags: v.Flags, LocalCount: v.LocalCount, AffinityTimeout: v.AffinityTimeout}
}

// ServiceMap is the frontends of both families.
type ServiceMap struct{ v4, v6 *ebpf.Map }

// ServiceMap is the typed service map.
func (m *LBMaps) ServiceMap() ServiceMap { return ServiceMap{v4: m.Services4, v6: m.Services6} }

func (m ServiceMap) key(f Frontend) (*ebpf.Map, any, error) {
	if err := f.validate(); err != nil {
		return nil, nil, err
	}
	a := f.Addr.Unmap()
	if a.Is4() {
		return m.v4, &bpf.LxcLb4Key{Addr: a.As4(), Port: Htons(f.Port), Proto: f.Proto}, nil
	}
	return m.v6, &bpf.LxcLb6Key{Addr: a.As16(), Port: Htons(f.Port), Proto: f.Proto}, nil
}

// Upsert maps frontend f to service s.
func (m ServiceMap) Upsert(f Frontend, s Service) error {
	mp, k, err := m.key(f)
	if err != nil {
		return err
	}
	v, err := s.raw()
	if err != nil {
		return fmt.Errorf("service of %s: %w", f, err)
	}
	if err := mp.Put(k, &v); err != nil {
		return fmt.Errorf("write service %s: %w", f, err)
	}
	return nil
}

// Delete removes a frontend; a missing one is fine.
func (m ServiceMap) Delete(f Frontend) error {
	mp, k, err := m.key(f)
	if err != nil {
		return err
	}
	if err := ignoreMissing(mp.Delete(k)); err != nil {
		return fmt.Errorf("delete service %s: %w", f, err)
	}
	return nil
}

// Lookup returns frontend f's service.
func (m ServiceMap) Lookup(f Frontend) (Service, bool, error) {
	mp, k, err := m.key(f)
	if err != nil {
		return Service{}, false, err
	}
	var v bpf.LxcLbService
	if err := mp.Lookup(k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Service{}, false, nil
		}
		return Service{}, false, fmt.Errorf("look up service %s: %w", f, err)
	}
	return fromRawService(v), true, nil
}

// Iterate calls fn for every frontend, IPv4 first, until fn returns false.
func (m ServiceMap) Iterate(fn func(Frontend, Service) bool) error {
	var k4 bpf.LxcLb4Key
	var v bpf.LxcLbService
	it := m.v4.Iterate()
	for it.Next(&k4, &v) {
		if !fn(Frontend{Addr: netip.AddrFrom4(k4.Addr), Port: Ntohs(k4.Port), Proto: k4.Proto}, fromRawService(v)) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate IPv4 services: %w", err)
	}
	var k6 bpf.LxcLb6Key
	it = m.v6.Iterate()
	for it.Next(&k6, &v) {
		if !fn(Frontend{Addr: netip.AddrFrom16(k6.Addr), Port: Ntohs(k6.Port), Proto: k6.Proto}, fromRawService(v)) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate IPv6 services: %w", err)
	}
	return nil
}

// Count is the number of frontends of both families.
func (m ServiceMap) Count() (int, error) {
	n4, err := countKeys(m.v4)
	if err != nil {
		return 0, err
	}
	n6, err := countKeys(m.v6)
	return n4 + n6, err
}

// Capacity is the number of frontends each family can hold.
func (m ServiceMap) Capacity() int { return int(m.v4.MaxEntries()) }

// Backend is one backend: its address, port and state (BackendState*).
type Backend struct {
	Addr  netip.Addr
	Port  uint16
	State uint8
}

// AddrPort is the backend's address and port.
func (b Backend) AddrPort() netip.AddrPort { return netip.AddrPortFrom(b.Addr, b.Port) }

func (b Backend) raw() (bpf.LxcLbBackend, error) {
	if !b.Addr.IsValid() {
		return bpf.LxcLbBackend{}, errors.New("backend has no address")
	}
	if _, ok := BackendStateNames()[b.State]; !ok {
		return bpf.LxcLbBackend{}, fmt.Errorf("backend %s: unknown state %d", b.AddrPort(), b.State)
	}
	fam, addr := addrBytes(b.Addr)
	return bpf.LxcLbBackend{Addr: addr, Port: Htons(b.Port), Family: fam, State: b.State}, nil
}

func fromRawBackend(v bpf.LxcLbBackend) Backend {
	return Backend{Addr: bytesAddr(v.Family, v.Addr), Port: Ntohs(v.Port), State: v.State}
}

// BackendMap holds backends by ID.
type BackendMap struct{ m *ebpf.Map }

// BackendMap is the typed backend map.
func (m *LBMaps) BackendMap() BackendMap { return BackendMap{m: m.Backends} }

// Upsert writes backend id.
func (m BackendMap) Upsert(id uint32, b Backend) error {
	if err := checkID("backend", id); err != nil {
		return err
	}
	v, err := b.raw()
	if err != nil {
		return err
	}
	if err := m.m.Put(id, &v); err != nil {
		return fmt.Errorf("write backend %d (%s): %w", id, b.AddrPort(), err)
	}
	return nil
}

// UpsertBatch writes many backends in one system call.
func (m BackendMap) UpsertBatch(backends map[uint32]Backend) error {
	keys := make([]uint32, 0, len(backends))
	vals := make([]bpf.LxcLbBackend, 0, len(backends))
	for id, b := range backends {
		if err := checkID("backend", id); err != nil {
			return err
		}
		v, err := b.raw()
		if err != nil {
			return fmt.Errorf("backend %d: %w", id, err)
		}
		keys = append(keys, id)
		vals = append(vals, v)
	}
	if len(keys) == 0 {
		return nil
	}
	if _, err := m.m.BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("write %d backends: %w", len(keys), err)
	}
	return nil
}

// Delete removes backend id; a missing one is fine.
func (m BackendMap) Delete(id uint32) error {
	if err := ignoreMissing(m.m.Delete(id)); err != nil {
		return fmt.Errorf("delete backend %d: %w", id, err)
	}
	return nil
}

// Lookup returns backend id.
func (m BackendMap) Lookup(id uint32) (Backend, bool, error) {
	var v bpf.LxcLbBackend
	if err := m.m.Lookup(id, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Backend{}, false, nil
		}
		return Backend{}, false, fmt.Errorf("look up backend %d: %w", id, err)
	}
	return fromRawBackend(v), true, nil
}

// Iterate calls fn for every backend until fn returns false.
func (m BackendMap) Iterate(fn func(uint32, Backend) bool) error {
	var k uint32
	var v bpf.LxcLbBackend
	it := m.m.Iterate()
	for it.Next(&k, &v) {
		if !fn(k, fromRawBackend(v)) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate backends: %w", err)
	}
	return nil
}

// Count is the number of backends.
func (m BackendMap) Count() (int, error) { return countKeys(m.m) }

// SlotMap holds each service's backend slots 1..count.
type SlotMap struct{ m *ebpf.Map }

// SlotMap is the typed slot map.
func (m *LBMaps) SlotMap() SlotMap { return SlotMap{m: m.Slots} }

// Set writes service svc's slots 1..len(backendIDs) in one batch and
// deletes slots len(backendIDs)+1..prevCount. Write the slots before a
// service entry whose count grows, and shrink the count before the slots
// it no longer covers are deleted (LBMaps.ApplyService does both).
func (m SlotMap) Set(svc uint32, backendIDs []uint32, prevCount int) error {
	if err := checkID("service", svc); err != nil {
		return err
	}
	if len(backendIDs) > 0 {
		keys := make([]bpf.LxcLbSlotKey, len(backendIDs))
		for i, id := range backendIDs {
			if err := checkID("backend", id); err != nil {
				return fmt.Errorf("slot %d of service %d: %w", i+1, svc, err)
			}
			keys[i] = bpf.LxcLbSlotKey{SvcId: svc, Slot: uint32(i + 1)}
		}
		if _, err := m.m.BatchUpdate(keys, backendIDs, nil); err != nil {
			return fmt.Errorf("write %d slots of service %d: %w", len(keys), svc, err)
		}
	}
	return m.deleteFrom(svc, len(backendIDs)+1, prevCount)
}

func (m SlotMap) deleteFrom(svc uint32, from, to int) error {
	for slot := from; slot <= to; slot++ {
		k := bpf.LxcLbSlotKey{SvcId: svc, Slot: uint32(slot)}
		if err := ignoreMissing(m.m.Delete(&k)); err != nil {
			return fmt.Errorf("delete slot %d of service %d: %w", slot, svc, err)
		}
	}
	return nil
}

// Delete removes service svc's slots 1..count.
func (m SlotMap) Delete(svc uint32, count int) error { return m.deleteFrom(svc, 1, count) }

// Get returns service svc's slots 1..count (0 for a missing slot).
func (m SlotMap) Get(svc uint32, count int) ([]uint32, error) {
	out := make([]uint32, count)
	for i := range out {
		k := bpf.LxcLbSlotKey{SvcId: svc, Slot: uint32(i + 1)}
		if err := m.m.Lookup(&k, &out[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, fmt.Errorf("look up slot %d of service %d: %w", i+1, svc, err)
		}
	}
	return out, nil
}

// Iterate calls fn for every slot until fn returns false.
func (m SlotMap) Iterate(fn func(svc, slot, backend uint32) bool) error {
	var k bpf.LxcLbSlotKey
	var v uint32
	it := m.m.Iterate()
	for it.Next(&k, &v) {
		if !fn(k.SvcId, k.Slot, v) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate backend slots: %w", err)
	}
	return nil
}

// RevNATMap holds the frontends replies are translated back to.
type RevNATMap struct{ m *ebpf.Map }

// RevNATMap is the typed reverse NAT map.
func (m *LBMaps) RevNATMap() RevNATMap { return RevNATMap{m: m.RevNAT} }

// Upsert maps reverse NAT ID id to frontend address and port fe.
func (m RevNATMap) Upsert(id uint32, fe netip.AddrPort) error {
	if err := checkID("reverse NAT", id); err != nil {
		return err
	}
	if !fe.IsValid() {
		return fmt.Errorf("reverse NAT %d: invalid frontend", id)
	}
	fam, addr := addrBytes(fe.Addr())
	v := bpf.LxcLbRevnat{Addr: addr, Port: Htons(fe.Port()), Family: fam}
	if err := m.m.Put(id, &v); err != nil {
		return fmt.Errorf("write reverse NAT %d (%s): %w", id, fe, err)
	}
	return nil
}

// Delete removes reverse NAT id; a missing one is fine.
func (m RevNATMap) Delete(id uint32) error {
	if err := ignoreMissing(m.m.Delete(id)); err != nil {
		return fmt.Errorf("delete reverse NAT %d: %w", id, err)
	}
	return nil
}

func fromRawRevNAT(v bpf.LxcLbRevnat) netip.AddrPort {
	return netip.AddrPortFrom(bytesAddr(v.Family, v.Addr), Ntohs(v.Port))
}

// Lookup returns reverse NAT id's frontend.
func (m RevNATMap) Lookup(id uint32) (netip.AddrPort, bool, error) {
	var v bpf.LxcLbRevnat
	if err := m.m.Lookup(id, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return netip.AddrPort{}, false, nil
		}
		return netip.AddrPort{}, false, fmt.Errorf("look up reverse NAT %d: %w", id, err)
	}
	return fromRawRevNAT(v), true, nil
}

// Iterate calls fn for every reverse NAT entry until fn returns false.
func (m RevNATMap) Iterate(fn func(uint32, netip.AddrPort) bool) error {
	var k uint32
	var v bpf.LxcLbRevnat
	it := m.m.Iterate()
	for it.Next(&k, &v) {
		if !fn(k, fromRawRevNAT(v)) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate reverse NAT: %w", err)
	}
	return nil
}

// AffinityKey is a client of a service: its address (per-packet
// translation) or, at the socket, its network namespace cookie (Addr
// invalid).
type AffinityKey struct {
	Client      netip.Addr
	NetnsCookie uint64
	ServiceID   uint32
	// Original: the client is one a local redirect skips
	// (skipRedirectFromBackend), its affinity to the original Service's
	// backends (AFFINITY_ORIGINAL).
	Original bool
}

func (k AffinityKey) raw() bpf.LxcLbAffinityKey {
	r := bpf.LxcLbAffinityKey{SvcId: k.ServiceID}
	if k.Client.IsValid() {
		fam, addr := addrBytes(k.Client)
		r.Client, r.Kind = addr, AffinityByV4
		if fam == FamilyV6 {
			r.Kind = AffinityByV6
		}
	} else {
		binary.NativeEndian.PutUint64(r.Client[:8], k.NetnsCookie)
		r.Kind = AffinityByNetns
	}
	if k.Original {
		r.Kind |= AffinityOriginal
	}
	return r
}

func fromRawAffinityKey(r bpf.LxcLbAffinityKey) AffinityKey {
	k := AffinityKey{ServiceID: r.SvcId, Original: r.Kind&AffinityOriginal != 0}
	switch r.Kind &^ AffinityOriginal {
	case AffinityByV4:
		k.Client = bytesAddr(FamilyV4, r.Client)
	case AffinityByV6:
		k.Client = bytesAddr(FamilyV6, r.Client)
	default:
		k.NetnsCookie = binary.NativeEndian.Uint64(r.Client[:8])
	}
	return k
}

// Affinity is a client's backend and when it last used it
// (CLOCK_MONOTONIC_COARSE ns, as MonotonicNow).
type Affinity struct {
	BackendID uint32
	LastUsed  uint64
}

// AffinityMap holds ClientIP session affinity (an LRU hash).
type AffinityMap struct{ m *ebpf.Map }

// AffinityMap is the typed affinity map.
func (m *LBMaps) AffinityMap() AffinityMap { return AffinityMap{m: m.Affinity} }

// Lookup returns client k's affinity.
func (m AffinityMap) Lookup(k AffinityKey) (Affinity, bool, error) {
	r := k.raw()
	var v bpf.LxcLbAffinity
	if err := m.m.Lookup(&r, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Affinity{}, false, nil
		}
		return Affinity{}, false, fmt.Errorf("look up affinity of service %d: %w", k.ServiceID, err)
	}
	return Affinity{BackendID: v.BackendId, LastUsed: v.LastUsed}, true, nil
}

// Upsert writes client k's affinity (a restore, a test).
func (m AffinityMap) Upsert(k AffinityKey, a Affinity) error {
	r := k.raw()
	v := bpf.LxcLbAffinity{BackendId: a.BackendID, LastUsed: a.LastUsed}
	if err := m.m.Put(&r, &v); err != nil {
		return fmt.Errorf("write affinity of service %d: %w", k.ServiceID, err)
	}
	return nil
}

// Iterate calls fn for every entry until fn returns false.
func (m AffinityMap) Iterate(fn func(AffinityKey, Affinity) bool) error {
	var k bpf.LxcLbAffinityKey
	var v bpf.LxcLbAffinity
	it := m.m.Iterate()
	for it.Next(&k, &v) {
		if !fn(fromRawAffinityKey(k), Affinity{BackendID: v.BackendId, LastUsed: v.LastUsed}) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate affinity: %w", err)
	}
	return nil
}

// DeleteMatching deletes the entries of service svc (any service when 0)
// that name backend (any backend when 0): a backend that leaves a service
// must not keep its clients. It returns how many it deleted.
func (m AffinityMap) DeleteMatching(svc, backend uint32) (int, error) {
	var doomed []bpf.LxcLbAffinityKey
	var k bpf.LxcLbAffinityKey
	var v bpf.LxcLbAffinity
	it := m.m.Iterate()
	for it.Next(&k, &v) {
		if (svc == 0 || k.SvcId == svc) && (backend == 0 || v.BackendId == backend) {
			doomed = append(doomed, k)
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("iterate affinity: %w", err)
	}
	n := 0
	for i := range doomed {
		err := m.m.Delete(&doomed[i])
		if err == nil {
			n++
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("delete affinity of service %d: %w", doomed[i].SvcId, err)
		}
	}
	return n, nil
}

// MaglevMap holds each Maglev service's lookup table.
type MaglevMap struct{ m *ebpf.Map }

// MaglevMap is the typed Maglev map.
func (m *LBMaps) MaglevMap() MaglevMap { return MaglevMap{m: m.Maglev} }

// Upsert replaces service svc's table in one update (the datapath sees
// the old table or the new one). The table has LBMaglevTableSize backend
// IDs (pkg/loadbalancer/maglev computes it).
func (m MaglevMap) Upsert(svc uint32, table []uint32) error {
	if err := checkID("service", svc); err != nil {
		return err
	}
	if len(table) != LBMaglevTableSize {
		return fmt.Errorf("Maglev table of service %d has %d entries, the datapath's has %d", svc, len(table), LBMaglevTableSize)
	}
	v := new(bpf.LxcLbMaglev)
	copy(v.BackendIds[:], table)
	if err := m.m.Put(svc, v); err != nil {
		return fmt.Errorf("write Maglev table of service %d: %w", svc, err)
	}
	return nil
}

// Lookup returns service svc's table.
func (m MaglevMap) Lookup(svc uint32) ([]uint32, bool, error) {
	v := new(bpf.LxcLbMaglev)
	if err := m.m.Lookup(svc, v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("look up Maglev table of service %d: %w", svc, err)
	}
	return v.BackendIds[:], true, nil
}

// Delete removes service svc's table; a missing one is fine.
func (m MaglevMap) Delete(svc uint32) error {
	if err := ignoreMissing(m.m.Delete(svc)); err != nil {
		return fmt.Errorf("delete Maglev table of service %d: %w", svc, err)
	}
	return nil
}

// SockRevNAT is what a socket hook recorded: the frontend the application
// named for a backend it was sent to.
type SockRevNAT struct {
	Cookie   uint64
	Backend  netip.AddrPort
	Frontend netip.AddrPort
	RevNATID uint32
}

// SockRevNATMap is the socket hooks' reverse NAT (an LRU hash).
type SockRevNATMap struct{ m *ebpf.Map }

// SockRevNATMap is the typed socket reverse NAT map.
func (m *LBMaps) SockRevNATMap() SockRevNATMap { return SockRevNATMap{m: m.SockRevNAT} }

// Lookup returns what socket cookie recorded for backend.
func (m SockRevNATMap) Lookup(cookie uint64, backend netip.AddrPort) (SockRevNAT, bool, error) {
	fam, addr := addrBytes(backend.Addr())
	k := bpf.LxcLbSockKey{Cookie: cookie, Addr: addr, Port: Htons(backend.Port()), Family: fam}
	var v bpf.LxcLbSockRevnat
	if err := m.m.Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return SockRevNAT{}, false, nil
		}
		return SockRevNAT{}, false, fmt.Errorf("look up socket reverse NAT of %d: %w", cookie, err)
	}
	return fromRawSock(k, v), true, nil
}

func fromRawSock(k bpf.LxcLbSockKey, v bpf.LxcLbSockRevnat) SockRevNAT {
	return SockRevNAT{Cookie: k.Cookie, Backend: netip.AddrPortFrom(bytesAddr(k.Family, k.Addr), Ntohs(k.Port)),
		Frontend: netip.AddrPortFrom(bytesAddr(v.Family, v.Addr), Ntohs(v.Port)), RevNATID: v.RevNatId}
}

// Iterate calls fn for every entry until fn returns false.
func (m SockRevNATMap) Iterate(fn func(SockRevNAT) bool) error {
	var k bpf.LxcLbSockKey
	var v bpf.LxcLbSockRevnat
	it := m.m.Iterate()
	for it.Next(&k, &v) {
		if !fn(fromRawSock(k, v)) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate socket reverse NAT: %w", err)
	}
	return nil
}

// ApplyService writes frontend f's service s with backends (IDs already
// written to the backend map), in the order that keeps every packet
// consistent: the reverse NAT entry and the new slots first, then the
// service entry with its new count (a lookup never reads a slot beyond the
// ones written), then the slots beyond the new count go. prevCount is the
// count the service had (0 for a new one). s.Count is set from backends.
func (m *LBMaps) ApplyService(f Frontend, s Service, backends []uint32, prevCount int) error {
	if len(backends) >= 1<<16 {
		return fmt.Errorf("service %s: %d backends, at most %d", f, len(backends), 1<<16-1)
	}
	if int(s.LocalCount) > len(backends) {
		return fmt.Errorf("service %s: %d local backends of %d", f, s.LocalCount, len(backends))
	}
	s.Count = uint16(len(backends) - int(s.LocalCount))
	if err := m.RevNATMap().Upsert(s.RevNATID, netip.AddrPortFrom(f.Addr, f.Port)); err != nil {
		return err
	}
	slots := m.SlotMap()
	if err := slots.Set(s.ID, backends, 0); err != nil {
		return err
	}
	if err := m.ServiceMap().Upsert(f, s); err != nil {
		return err
	}
	return slots.deleteFrom(s.ID, len(backends)+1, prevCount)
}

// RemoveService deletes frontend f's service and what only it used: the
// service entry first (no new flow finds it), then its slots, Maglev
// table and affinity entries. The reverse NAT entry stays: flows and
// sockets translated earlier still need it (delete it with RevNATMap once
// they are gone).
func (m *LBMaps) RemoveService(f Frontend, s Service) error {
	if err := m.ServiceMap().Delete(f); err != nil {
		return err
	}
	if err := m.SlotMap().Delete(s.ID, int(s.Count)+int(s.LocalCount)); err != nil {
		return err
	}
	if err := m.MaglevMap().Delete(s.ID); err != nil {
		return err
	}
	_, err := m.AffinityMap().DeleteMatching(s.ID, 0)
	return err
}

// LBHashSeed and LBHash mirror the datapath's flow hash (bpf/lib/lb.h):
// each 32-bit word is folded in with the murmur3 finalizer.
const LBHashSeed uint32 = 0x7d5b3c1f

func lbMix(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// LBHash folds words into the datapath's flow hash.
func LBHash(words ...uint32) uint32 {
	h := LBHashSeed
	for _, w := range words {
		h = lbMix(h ^ w)
	}
	return h
}

// LBHashCookie is the hash the socket hooks use for a socket (its
// SO_COOKIE): its Maglev entry is LBHashCookie(cookie) % LBMaglevTableSize.
func LBHashCookie(cookie uint64) uint32 { return LBHash(uint32(cookie), uint32(cookie>>32)) }

// LBHashTuple is the hash the pod programs use for a packet from src to
// dst (the frontend) of L4 protocol proto: its Maglev entry is
// LBHashTuple(...) % LBMaglevTableSize. The words are the datapath's
// bytes read in host order: each address, then the two ports (network
// byte order) as one word, then the protocol.
func LBHashTuple(src, dst netip.AddrPort, proto uint8) uint32 {
	var words []uint32
	for _, a := range []netip.Addr{src.Addr().Unmap(), dst.Addr().Unmap()} {
		b := a.AsSlice()
		for i := 0; i < len(b); i += 4 {
			words = append(words, binary.NativeEndian.Uint32(b[i:]))
		}
	}
	words = append(words, uint32(Htons(src.Port()))<<16|uint32(Htons(dst.Port())), uint32(proto))
	return LBHash(words...)
}

// SrcRangeMap is loadBalancerSourceRanges: the client prefixes each
// frontend with SvcFlagSourceRanges admits from outside, keyed by the
// frontend's reverse NAT ID and the prefix, one LPM trie per family
// (bpf/lib/lbmaps.h tdr_lb4_srcrange_v1, tdr_lb6_srcrange_v1). A frontend
// checks the clients of its own family only.
type SrcRangeMap struct{ m4, m6 *ebpf.Map }

// SrcRangeMap is the typed source range map.
func (m *LBMaps) SrcRangeMap() SrcRangeMap { return SrcRangeMap{m4: m.SrcRange4, m6: m.SrcRange6} }

// beID is a reverse NAT ID as the tries' keys hold it: part of the
// prefix, so big-endian, as the datapath writes it (bpf_htonl).
func beID(revNAT uint32) uint32 {
	return binary.NativeEndian.Uint32(binary.BigEndian.AppendUint32(nil, revNAT))
}

// srcRangeEntry is one key of either trie.
type srcRangeEntry struct {
	k4 bpf.LxcLb4SrcrangeKey
	k6 bpf.LxcLb6SrcrangeKey
	v6 bool
}

func srcRangeKey(revNAT uint32, p netip.Prefix) srcRangeEntry {
	a := p.Addr()
	if a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	p = p.Masked()
	if p.Addr().Is4() {
		return srcRangeEntry{k4: bpf.LxcLb4SrcrangeKey{Prefixlen: 32 + uint32(p.Bits()), RevNatId: beID(revNAT), Addr: p.Addr().As4()}}
	}
	return srcRangeEntry{v6: true, k6: bpf.LxcLb6SrcrangeKey{Prefixlen: 32 + uint32(p.Bits()), RevNatId: beID(revNAT), Addr: p.Addr().As16()}}
}

func (m SrcRangeMap) put(e srcRangeEntry) error {
	var one uint8 = 1
	if e.v6 {
		return m.m6.Put(&e.k6, &one)
	}
	return m.m4.Put(&e.k4, &one)
}

func (m SrcRangeMap) delete(e srcRangeEntry) error {
	if e.v6 {
		return ignoreMissing(m.m6.Delete(&e.k6))
	}
	return ignoreMissing(m.m4.Delete(&e.k4))
}

// Set makes want the ranges of frontend revNAT, deleting those of prev
// not in want.
func (m SrcRangeMap) Set(revNAT uint32, want, prev []netip.Prefix) error {
	keep := map[srcRangeEntry]bool{}
	for _, p := range want {
		e := srcRangeKey(revNAT, p)
		keep[e] = true
		if err := m.put(e); err != nil {
			return fmt.Errorf("write source range %s of reverse NAT ID %d: %w", p, revNAT, err)
		}
	}
	for _, p := range prev {
		e := srcRangeKey(revNAT, p)
		if keep[e] {
			continue
		}
		if err := m.delete(e); err != nil {
			return fmt.Errorf("delete source range %s of reverse NAT ID %d: %w", p, revNAT, err)
		}
	}
	return nil
}

// List returns every frontend's source ranges (both families), by
// reverse NAT ID.
func (m SrcRangeMap) List() (map[uint32][]netip.Prefix, error) {
	out := map[uint32][]netip.Prefix{}
	idOf := func(k uint32) uint32 { return binary.BigEndian.Uint32(binary.NativeEndian.AppendUint32(nil, k)) }
	var k4 bpf.LxcLb4SrcrangeKey
	var v uint8
	it := m.m4.Iterate()
	for it.Next(&k4, &v) {
		if bits := int(k4.Prefixlen) - 32; bits >= 0 && bits <= 32 {
			out[idOf(k4.RevNatId)] = append(out[idOf(k4.RevNatId)], netip.PrefixFrom(netip.AddrFrom4(k4.Addr), bits))
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate IPv4 source ranges: %w", err)
	}
	if m.m6 == nil {
		return out, nil
	}
	var k6 bpf.LxcLb6SrcrangeKey
	it = m.m6.Iterate()
	for it.Next(&k6, &v) {
		if bits := int(k6.Prefixlen) - 32; bits >= 0 && bits <= 128 {
			out[idOf(k6.RevNatId)] = append(out[idOf(k6.RevNatId)], netip.PrefixFrom(netip.AddrFrom16(k6.Addr), bits))
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate IPv6 source ranges: %w", err)
	}
	return out, nil
}
