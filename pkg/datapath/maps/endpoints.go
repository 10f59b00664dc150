package maps

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// Endpoint is one local endpoint's datapath facts.
type Endpoint struct {
	ID       uint16
	IfIndex  uint32 // host-side veth
	Identity uint32
	// Flags holds FlagEnforce*, FlagDeliverDirect (it needs MAC and
	// HostMAC); FlagHasIPv4/6 follow the addresses.
	Flags uint8
	// Flags2 holds Flag2* (Flag2L7Egress).
	Flags2  uint8
	MAC     net.HardwareAddr // the pod's interface
	HostMAC net.HardwareAddr // the host-side veth
	IPv4    netip.Addr
	IPv6    netip.Addr
}

// EnforceIngress reports the ingress enforcement flag.
func (e Endpoint) EnforceIngress() bool { return e.Flags&FlagEnforceIngress != 0 }

// EnforceEgress reports the egress enforcement flag.
func (e Endpoint) EnforceEgress() bool { return e.Flags&FlagEnforceEgress != 0 }

// EndpointMap holds, for each endpoint, an entry keyed by its host veth's
// ifindex (what the programs look up first), one under its ID (the local
// peer a conntrack entry names) and one per address (what from_pod looks
// up to find a local destination of a new flow), all with the same value.
// The ifindex entry is in a hash (every endpoint) and, for ifindexes below
// the array's size, in an array slot the programs read first; the ID entry
// is an array slot. Empty array slots have ID 0.
type EndpointMap struct{ byIfindex, ifindexSlots, byID, byIPv4, byIPv6 *ebpf.Map }

// addrMap is the map of ip's family and ip's key in it.
func (m EndpointMap) addrMap(ip netip.Addr) (*ebpf.Map, any) {
	ip = ip.Unmap()
	if ip.Is4() {
		k := ip.As4()
		return m.byIPv4, &k
	}
	k := ip.As16()
	return m.byIPv6, &k
}

func (e Endpoint) raw() (bpf.LxcEndpointInfo, error) {
	v := bpf.LxcEndpointInfo{Ifindex: e.IfIndex, Identity: e.Identity, EpId: e.ID, Flags: e.Flags &^ (FlagHasIPv4 | FlagHasIPv6), Flags2: e.Flags2}
	if e.IPv4.IsValid() {
		if !e.IPv4.Unmap().Is4() {
			return v, fmt.Errorf("endpoint %d: IPv4 %s is not an IPv4 address", e.ID, e.IPv4)
		}
		v.Flags |= FlagHasIPv4
		v.Ipv4 = e.IPv4.Unmap().As4()
	}
	if e.IPv6.IsValid() {
		if !e.IPv6.Is6() || e.IPv6.Is4In6() {
			return v, fmt.Errorf("endpoint %d: IPv6 %s is not an IPv6 address", e.ID, e.IPv6)
		}
		v.Flags |= FlagHasIPv6
		v.Ipv6 = e.IPv6.As16()
	}
	if e.Flags&FlagDeliverDirect != 0 && (len(e.MAC) != 6 || len(e.HostMAC) != 6) {
		return v, fmt.Errorf("endpoint %d: direct delivery needs the pod's and the host veth's MACs", e.ID)
	}
	copy(v.Mac[:], e.MAC)
	copy(v.HostMac[:], e.HostMAC)
	return v, nil
}

func fromRawEndpoint(v bpf.LxcEndpointInfo) Endpoint {
	e := Endpoint{ID: v.EpId, IfIndex: v.Ifindex, Identity: v.Identity, Flags: v.Flags, Flags2: v.Flags2}
	if v.Flags&FlagHasIPv4 != 0 {
		e.IPv4 = netip.AddrFrom4(v.Ipv4)
	}
	if v.Flags&FlagHasIPv6 != 0 {
		e.IPv6 = netip.AddrFrom16(v.Ipv6)
	}
	if v.Mac != [6]uint8{} {
		e.MAC = append(net.HardwareAddr(nil), v.Mac[:]...)
	}
	if v.HostMac != [6]uint8{} {
		e.HostMAC = append(net.HardwareAddr(nil), v.HostMac[:]...)
	}
	return e
}

// Upsert writes the endpoint's interface and address entries. Idempotent;
// addresses the interface's previous entry had and this one has not are
// removed, and so is the interface entry of a veth the endpoint had before
// (its pod's veth was recreated under the same endpoint ID).
func (m EndpointMap) Upsert(e Endpoint) error {
	if e.IfIndex == 0 {
		return fmt.Errorf("endpoint %d: no interface index", e.ID)
	}
	v, err := e.raw()
	if err != nil {
		return err
	}
	old, had, err := m.Lookup(e.IfIndex)
	if err != nil {
		return err
	}
	var staleIfindex []uint32
	// Address entries first: from the moment the interface entry exists
	// the endpoint's programs pass its traffic, and a peer's from_pod must
	// already find it as a local destination.
	for _, ip := range []netip.Addr{e.IPv4, e.IPv6} {
		if !ip.IsValid() {
			continue
		}
		prev, ok, err := m.LookupAddr(ip)
		if err != nil {
			return err
		}
		if ok && prev.ID == e.ID && prev.IfIndex != e.IfIndex {
			staleIfindex = append(staleIfindex, prev.IfIndex)
		}
		am, k := m.addrMap(ip)
		if err := am.Put(k, &v); err != nil {
			return fmt.Errorf("write endpoint %d address %s: %w", e.ID, ip, err)
		}
	}
	if err := m.writeSlots(e.IfIndex, e.ID, &v); err != nil {
		return err
	}
	if had {
		for _, ip := range []netip.Addr{old.IPv4, old.IPv6} {
			if ip.IsValid() && ip != e.IPv4 && ip != e.IPv6 {
				if err := m.deleteAddr(ip, old.ID); err != nil {
					return err
				}
			}
		}
	}
	for _, ifindex := range staleIfindex {
		if err := m.deleteIfindex(ifindex, e.ID); err != nil {
			return err
		}
	}
	return nil
}

// writeSlots writes an endpoint's ID slot, then its interface entries:
// the hash and, below the array's size, the array slot.
func (m EndpointMap) writeSlots(ifindex uint32, id uint16, v *bpf.LxcEndpointInfo) error {
	if m.byID != nil {
		if uint32(id) >= m.byID.MaxEntries() {
			return fmt.Errorf("endpoint ID %d beyond the datapath's %d", id, m.byID.MaxEntries()-1)
		}
		if err := m.byID.Put(uint32(id), v); err != nil {
			return fmt.Errorf("write endpoint %d (ID slot): %w", id, err)
		}
	}
	if err := m.byIfindex.Put(ifindex, v); err != nil {
		return fmt.Errorf("write endpoint %d (ifindex %d): %w", id, ifindex, err)
	}
	if m.ifindexSlots != nil && ifindex < m.ifindexSlots.MaxEntries() {
		if err := m.ifindexSlots.Put(ifindex, v); err != nil {
			return fmt.Errorf("write endpoint %d (ifindex slot %d): %w", id, ifindex, err)
		}
	}
	return nil
}

// clearSlot empties an array slot if it still holds endpoint id.
func clearSlot(arr *ebpf.Map, slot uint32, id uint16) error {
	if arr == nil || slot >= arr.MaxEntries() {
		return nil
	}
	var v bpf.LxcEndpointInfo
	if err := arr.Lookup(slot, &v); err != nil {
		return fmt.Errorf("read slot %d of %s: %w", slot, arr, err)
	}
	if v.EpId != id {
		return nil
	}
	if err := arr.Put(slot, &bpf.LxcEndpointInfo{}); err != nil {
		return fmt.Errorf("clear slot %d of %s: %w", slot, arr, err)
	}
	return nil
}

// RebuildSlots rewrites the array slots from the interface hash, the
// record of every endpoint: an agent upgraded from a datapath without the
// arrays fills them before its programs run, and slots of endpoints that
// are gone are emptied.
func (m EndpointMap) RebuildSlots() error {
	if m.byID == nil || m.ifindexSlots == nil {
		return nil
	}
	live := map[uint16]bool{}
	liveIfx := map[uint32]bool{}
	var k uint32
	var v bpf.LxcEndpointInfo
	it := m.byIfindex.Iterate()
	for it.Next(&k, &v) {
		if v.EpId == 0 || uint32(v.EpId) >= m.byID.MaxEntries() {
			continue
		}
		live[v.EpId], liveIfx[k] = true, true
		val := v
		if err := m.writeSlots(k, v.EpId, &val); err != nil {
			return err
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read endpoints: %w", err)
	}
	for _, arr := range []struct {
		m    *ebpf.Map
		keep func(slot uint32) bool
	}{
		{m.byID, func(slot uint32) bool { return live[uint16(slot)] }},
		{m.ifindexSlots, func(slot uint32) bool { return liveIfx[slot] }},
	} {
		var stale []uint32
		err := readArray(arr.m, func(slot uint32, v bpf.LxcEndpointInfo) {
			if v.EpId != 0 && !arr.keep(slot) {
				stale = append(stale, slot)
			}
		})
		if err != nil {
			return err
		}
		for _, slot := range stale {
			if err := arr.m.Put(slot, &bpf.LxcEndpointInfo{}); err != nil {
				return fmt.Errorf("clear slot %d of %s: %w", slot, arr.m, err)
			}
		}
	}
	return nil
}

// Replace writes e and removes the entries of prev, the endpoint's state
// as last written, that e does not keep (an interface or address it no
// longer has).
func (m EndpointMap) Replace(prev, e Endpoint) error {
	if err := m.Upsert(e); err != nil {
		return err
	}
	if prev.IfIndex != 0 && prev.IfIndex != e.IfIndex {
		if err := m.deleteIfindex(prev.IfIndex, prev.ID); err != nil {
			return err
		}
	}
	for _, ip := range []netip.Addr{prev.IPv4, prev.IPv6} {
		if ip.IsValid() && ip != e.IPv4 && ip != e.IPv6 {
			if err := m.deleteAddr(ip, prev.ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// deleteAddr removes an address entry if it still belongs to endpoint id
// (another endpoint may have taken the address since).
func (m EndpointMap) deleteAddr(ip netip.Addr, id uint16) error {
	am, k := m.addrMap(ip)
	var v bpf.LxcEndpointInfo
	if err := am.Lookup(k, &v); err != nil {
		return ignoreMissing(err)
	}
	if v.EpId != id {
		return nil
	}
	if err := ignoreMissing(am.Delete(k)); err != nil {
		return fmt.Errorf("delete endpoint address %s: %w", ip, err)
	}
	return nil
}

// Lookup returns the endpoint of an interface.
func (m EndpointMap) Lookup(ifindex uint32) (Endpoint, bool, error) {
	var v bpf.LxcEndpointInfo
	if err := m.byIfindex.Lookup(ifindex, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Endpoint{}, false, nil
		}
		return Endpoint{}, false, fmt.Errorf("look up endpoint of ifindex %d: %w", ifindex, err)
	}
	return fromRawEndpoint(v), true, nil
}

// LookupAddr returns the local endpoint owning an address.
func (m EndpointMap) LookupAddr(ip netip.Addr) (Endpoint, bool, error) {
	if !ip.IsValid() {
		return Endpoint{}, false, nil
	}
	am, k := m.addrMap(ip)
	var v bpf.LxcEndpointInfo
	if err := am.Lookup(k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Endpoint{}, false, nil
		}
		return Endpoint{}, false, fmt.Errorf("look up endpoint of %s: %w", ip, err)
	}
	return fromRawEndpoint(v), true, nil
}

// LookupID finds an endpoint by ID (a walk of the maps). An address entry
// answers too, so an endpoint whose interface entry is already gone is
// still found.
func (m EndpointMap) LookupID(id uint16) (Endpoint, bool, error) {
	for _, mp := range []*ebpf.Map{m.byIfindex, m.byIPv4, m.byIPv6} {
		var v bpf.LxcEndpointInfo
		key := make([]byte, mp.KeySize())
		found := false
		it := mp.Iterate()
		for it.Next(key, &v) {
			if v.EpId == id {
				found = true
				break
			}
		}
		if err := it.Err(); err != nil {
			return Endpoint{}, false, fmt.Errorf("look up endpoint %d: %w", id, err)
		}
		if found {
			return fromRawEndpoint(v), true, nil
		}
	}
	return Endpoint{}, false, nil
}

// deleteIfindex removes an interface entry if it still belongs to
// endpoint id.
func (m EndpointMap) deleteIfindex(ifindex uint32, id uint16) error {
	if err := clearSlot(m.ifindexSlots, ifindex, id); err != nil {
		return err
	}
	var v bpf.LxcEndpointInfo
	if err := m.byIfindex.Lookup(ifindex, &v); err != nil {
		return ignoreMissing(err)
	}
	if v.EpId != id {
		return nil
	}
	if err := ignoreMissing(m.byIfindex.Delete(ifindex)); err != nil {
		return fmt.Errorf("delete endpoint %d (ifindex %d): %w", id, ifindex, err)
	}
	return nil
}

// Delete removes an interface's endpoint and its address entries; a
// missing one is fine.
func (m EndpointMap) Delete(ifindex uint32) error {
	e, ok, err := m.Lookup(ifindex)
	if err != nil || !ok {
		return err
	}
	return m.remove(e)
}

// DeleteID removes endpoint id's entries; a missing one is fine. addrs,
// the endpoint's addresses when known, find its entries without a walk of
// the map.
func (m EndpointMap) DeleteID(id uint16, addrs ...netip.Addr) error {
	for _, ip := range addrs {
		if !ip.IsValid() {
			continue
		}
		e, ok, err := m.LookupAddr(ip)
		if err != nil {
			return err
		}
		if ok && e.ID == id {
			return m.remove(e)
		}
	}
	e, ok, err := m.LookupID(id)
	if err != nil || !ok {
		return err
	}
	return m.remove(e)
}

func (m EndpointMap) remove(e Endpoint) error {
	// The interface entry first: the endpoint's own programs then drop its
	// traffic instead of passing it as a half-removed endpoint.
	if err := m.deleteIfindex(e.IfIndex, e.ID); err != nil {
		return err
	}
	for _, ip := range []netip.Addr{e.IPv4, e.IPv6} {
		if ip.IsValid() {
			if err := m.deleteAddr(ip, e.ID); err != nil {
				return err
			}
		}
	}
	return clearSlot(m.byID, uint32(e.ID), e.ID)
}

// Iterate calls fn for each endpoint (its interface entry) until fn
// returns false.
func (m EndpointMap) Iterate(fn func(Endpoint) bool) error {
	var k uint32
	var v bpf.LxcEndpointInfo
	it := m.byIfindex.Iterate()
	for it.Next(&k, &v) {
		if !fn(fromRawEndpoint(v)) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate endpoints: %w", err)
	}
	return nil
}

// List returns every endpoint.
func (m EndpointMap) List() ([]Endpoint, error) {
	var out []Endpoint
	err := m.Iterate(func(e Endpoint) bool { out = append(out, e); return true })
	return out, err
}

// Count is the number of entries (interface and address keys).
func (m EndpointMap) Count() (int, error) {
	total := 0
	for _, mp := range []*ebpf.Map{m.byIfindex, m.byIPv4, m.byIPv6} {
		n, err := countKeys(mp)
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// Capacity is the maps' maximum number of entries.
func (m EndpointMap) Capacity() int {
	return int(m.byIfindex.MaxEntries() + m.byIPv4.MaxEntries() + m.byIPv6.MaxEntries())
}

// eachEntry calls fn for every entry of the interface and address maps
// (the arrays mirror them), with its map and its key (valid during the
// call only).
func (m EndpointMap) eachEntry(fn func(mp *ebpf.Map, key []byte, v bpf.LxcEndpointInfo)) error {
	for _, mp := range []*ebpf.Map{m.byIfindex, m.byIPv4, m.byIPv6} {
		var v bpf.LxcEndpointInfo
		key := make([]byte, mp.KeySize())
		it := mp.Iterate()
		for it.Next(key, &v) {
			fn(mp, key, v)
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read %s: %w", mp, err)
		}
	}
	return nil
}

// IDs returns the endpoint IDs that have an entry in the map (an
// interface or an address entry), for the prune of endpoints no one
// backs.
func (m EndpointMap) IDs() (map[uint16]struct{}, error) {
	out := map[uint16]struct{}{}
	err := m.eachEntry(func(_ *ebpf.Map, _ []byte, v bpf.LxcEndpointInfo) {
		if v.EpId != 0 {
			out[v.EpId] = struct{}{}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("list endpoint IDs: %w", err)
	}
	return out, nil
}

// Purge removes every entry that names endpoint id, whatever its key: the
// prune of an endpoint whose last state is unknown (DeleteID removes the
// entries of one record, found by its addresses or a walk, and would
// leave an address entry whose interface entry says otherwise).
func (m EndpointMap) Purge(id uint16) error {
	type entry struct {
		mp  *ebpf.Map
		key []byte
	}
	var found []entry
	err := m.eachEntry(func(mp *ebpf.Map, key []byte, v bpf.LxcEndpointInfo) {
		if v.EpId == id {
			found = append(found, entry{mp, bytes.Clone(key)})
		}
	})
	if err != nil {
		return fmt.Errorf("purge endpoint %d: %w", id, err)
	}
	// eachEntry walks the interface entries first; they go first, as in
	// remove: the endpoint's programs then drop its traffic rather than
	// pass it half-removed.
	for _, e := range found {
		if e.mp == m.byIfindex {
			err = m.deleteIfindex(binary.NativeEndian.Uint32(e.key), id)
		} else {
			err = ignoreMissing(e.mp.Delete(e.key))
		}
		if err != nil {
			return fmt.Errorf("purge endpoint %d from %s: %w", id, e.mp, err)
		}
	}
	return clearSlot(m.byID, uint32(id), id)
}
