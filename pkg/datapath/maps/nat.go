package maps

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// Masquerade maps (bpf/lib/natmaps.h).
const (
	NAT4MapName    = bpf.LxcMapTdrNat4V1
	NAT6MapName    = bpf.LxcMapTdrNat6V1
	NoMasqMapName  = bpf.LxcMapTdrNomasqV1
	HostDevMapName = bpf.LxcMapTdrHostdevV1
)

// NATMaps are the masquerade maps: the NAT table, the destinations that
// keep the pod's address, and the host devices' addresses.
type NATMaps struct {
	NAT4    *ebpf.Map
	NAT6    *ebpf.Map
	NoMasq  *ebpf.Map
	HostDev *ebpf.Map
	// DSR4 is the record of flows other nodes send here by direct
	// server return (dsr.go).
	DSR4 *ebpf.Map
	// DSR6 is its IPv6 counterpart (the extension header's and the Geneve
	// DSR option's flows).
	DSR6 *ebpf.Map
}

// NATFromObjects takes the masquerade maps of loaded objects.
func NATFromObjects(o *bpf.LxcMaps) *NATMaps {
	return &NATMaps{NAT4: o.TdrNat4V1, NAT6: o.TdrNat6V1, NoMasq: o.TdrNomasqV1, HostDev: o.TdrHostdevV1, DSR4: o.TdrDsr4V1, DSR6: o.TdrDsr6V1}
}

// OpenPinnedNAT opens the masquerade maps pinned under root (the CLI reads
// them while the agent is down).
func OpenPinnedNAT(root string, readOnly bool) (*NATMaps, error) {
	m := &NATMaps{}
	opts := &ebpf.LoadPinOptions{ReadOnly: readOnly}
	for name, dst := range map[string]**ebpf.Map{NAT4MapName: &m.NAT4, NAT6MapName: &m.NAT6, NoMasqMapName: &m.NoMasq, HostDevMapName: &m.HostDev, DSR4MapName: &m.DSR4, DSR6MapName: &m.DSR6} {
		mp, err := ebpf.LoadPinnedMap(filepath.Join(root, name), opts)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("open pinned map %s under %s: %w", name, root, err)
		}
		*dst = mp
	}
	return m, nil
}

// Close releases the handles (pins stay).
func (m *NATMaps) Close() {
	for _, mp := range []*ebpf.Map{m.NAT4, m.NAT6, m.NoMasq, m.HostDev, m.DSR4, m.DSR6} {
		if mp != nil {
			mp.Close()
		}
	}
}

// NATMapping is one masqueraded flow: the pod's tuple and the node's
// address and port it leaves with, as the two entries of the NAT table
// hold it (Orphan: only one of them was found).
type NATMapping struct {
	Proto uint8
	// Pod and PodPort are the flow's source inside the cluster (for ICMP
	// echo the port is the identifier).
	Pod     netip.Addr
	PodPort uint16
	// Remote and RemotePort are the destination outside (0 for ICMP).
	Remote     netip.Addr
	RemotePort uint16
	// Node and NodePort are what the flow leaves with.
	Node     netip.Addr
	NodePort uint16
	// Created is when the mapping was made (CLOCK_MONOTONIC_COARSE ns).
	Created uint64
	// Orphan: the entry of one direction is missing (a mapping being made
	// or taken over, or one the GC has half removed).
	Orphan bool
	// Service: an outside client's flow to a service backend on another
	// node (NAT_F_NODEPORT), source-NATed to this node: Pod is the client,
	// Remote the backend.
	Service bool
}

// natKey and natValue are an entry of either family's table, decoded:
// everything but the layouts (raw4, raw6, decode4, decode6 and the three
// calls that pick the table: put, lookup, deleteAll) is written once.
type natKey struct {
	Local, Remote         netip.Addr
	LocalPort, RemotePort uint16
	Proto, Dir            uint8
}

type natValue struct {
	Addr    netip.Addr
	Port    uint16
	Flags   uint8 // NAT_F_*
	Created uint64
}

func (k natKey) raw4() bpf.LxcNat4Key {
	return bpf.LxcNat4Key{AddrL: k.Local.As4(), AddrR: k.Remote.As4(), PortL: Htons(k.LocalPort), PortR: Htons(k.RemotePort), Proto: k.Proto, Dir: k.Dir}
}

func (k natKey) raw6() bpf.LxcNat6Key {
	return bpf.LxcNat6Key{AddrL: k.Local.As16(), AddrR: k.Remote.As16(), PortL: Htons(k.LocalPort), PortR: Htons(k.RemotePort), Proto: k.Proto, Dir: k.Dir}
}

func (v natValue) raw4() bpf.LxcNat4Entry {
	return bpf.LxcNat4Entry{Addr: v.Addr.As4(), Port: Htons(v.Port), Flags: v.Flags, Created: v.Created}
}

func (v natValue) raw6() bpf.LxcNat6Entry {
	return bpf.LxcNat6Entry{Addr: v.Addr.As16(), Port: Htons(v.Port), Flags: v.Flags, Created: v.Created}
}

func decode4(k bpf.LxcNat4Key, v bpf.LxcNat4Entry) (natKey, natValue) {
	return natKey{Local: netip.AddrFrom4(k.AddrL), Remote: netip.AddrFrom4(k.AddrR), LocalPort: Ntohs(k.PortL), RemotePort: Ntohs(k.PortR), Proto: k.Proto, Dir: k.Dir},
		natValue{Addr: netip.AddrFrom4(v.Addr), Port: Ntohs(v.Port), Flags: v.Flags, Created: v.Created}
}

func decode6(k bpf.LxcNat6Key, v bpf.LxcNat6Entry) (natKey, natValue) {
	return natKey{Local: netip.AddrFrom16(k.AddrL), Remote: netip.AddrFrom16(k.AddrR), LocalPort: Ntohs(k.PortL), RemotePort: Ntohs(k.PortR), Proto: k.Proto, Dir: k.Dir},
		natValue{Addr: netip.AddrFrom16(v.Addr), Port: Ntohs(v.Port), Flags: v.Flags, Created: v.Created}
}

// keys are the mapping's two entries' keys: its tuple as the pod sends it
// and as the reply arrives.
func (n NATMapping) keys() (fwd, rev natKey) {
	fwd = natKey{Local: n.Pod, Remote: n.Remote, LocalPort: n.PodPort, RemotePort: n.RemotePort, Proto: n.Proto, Dir: NATDirEgress}
	rev = natKey{Local: n.Node, Remote: n.Remote, LocalPort: n.NodePort, RemotePort: n.RemotePort, Proto: n.Proto, Dir: NATDirIngress}
	return fwd, rev
}

func (n NATMapping) flags() uint8 {
	if n.Service {
		return NATFlagNodeport
	}
	return 0
}

// NATMap is the typed NAT table: one hash per address family.
type NATMap struct{ m4, m6 *ebpf.Map }

// NATMap is the typed NAT table.
func (m *NATMaps) NATMap() NATMap { return NATMap{m4: m.NAT4, m6: m.NAT6} }

// DSRMap is the record of DSR flows to this node's backends.
func (m *NATMaps) DSRMap() DSRMap { return NewDSRMap(m.DSR4, m.DSR6) }

func (t NATMap) put(k natKey, v natValue) error {
	if k.Local.Is4() {
		rk, rv := k.raw4(), v.raw4()
		return t.m4.Put(&rk, &rv)
	}
	rk, rv := k.raw6(), v.raw6()
	return t.m6.Put(&rk, &rv)
}

func (t NATMap) lookup(k natKey) (natValue, bool) {
	if k.Local.Is4() {
		rk, rv := k.raw4(), bpf.LxcNat4Entry{}
		if t.m4.Lookup(&rk, &rv) != nil {
			return natValue{}, false
		}
		_, v := decode4(rk, rv)
		return v, true
	}
	rk, rv := k.raw6(), bpf.LxcNat6Entry{}
	if t.m6.Lookup(&rk, &rv) != nil {
		return natValue{}, false
	}
	_, v := decode6(rk, rv)
	return v, true
}

func (t NATMap) deleteAll(keys []natKey) {
	var k4 []bpf.LxcNat4Key
	var k6 []bpf.LxcNat6Key
	for _, k := range keys {
		if k.Local.Is4() {
			k4 = append(k4, k.raw4())
		} else {
			k6 = append(k6, k.raw6())
		}
	}
	deleteKeys(t.m4, k4)
	if t.m6 != nil {
		deleteKeys(t.m6, k6)
	}
}

// Upsert writes both entries of a mapping (tests).
func (t NATMap) Upsert(n NATMapping) error {
	fwd, rev := n.keys()
	err := t.put(rev, natValue{Addr: n.Pod, Port: n.PodPort, Flags: n.flags(), Created: n.Created})
	if err == nil {
		err = t.put(fwd, natValue{Addr: n.Node, Port: n.NodePort, Flags: n.flags(), Created: n.Created})
	}
	if err != nil {
		return fmt.Errorf("write NAT mapping %s:%d via %s:%d: %w", n.Pod, n.PodPort, n.Node, n.NodePort, err)
	}
	return nil
}

// List returns every mapping, each once (from its egress entry; an
// ingress entry without its egress one is listed as an orphan), IPv4
// first.
func (t NATMap) List() ([]NATMapping, error) {
	e4, err := walkNAT(t.m4, decode4)
	if err != nil {
		return nil, fmt.Errorf("iterate IPv4 NAT table: %w", err)
	}
	out := pairNAT(e4)
	if t.m6 == nil {
		return out, nil
	}
	e6, err := walkNAT(t.m6, decode6)
	if err != nil {
		return out, fmt.Errorf("iterate IPv6 NAT table: %w", err)
	}
	return append(out, pairNAT(e6)...), nil
}

// walkNAT reads one family's table.
func walkNAT[K, V any](m *ebpf.Map, decode func(K, V) (natKey, natValue)) (map[natKey]natValue, error) {
	var k K
	var v V
	out := map[natKey]natValue{}
	it := m.Iterate()
	for it.Next(&k, &v) {
		dk, dv := decode(k, v)
		out[dk] = dv
	}
	return out, it.Err()
}

// pairNAT makes the mappings of a table's entries: each egress entry with
// the ingress entry that points back at it; the rest are orphans.
func pairNAT(entries map[natKey]natValue) []NATMapping {
	var out []NATMapping
	paired := map[natKey]bool{}
	for k, v := range entries {
		if k.Dir != NATDirEgress {
			continue
		}
		n := NATMapping{Proto: k.Proto, Pod: k.Local, PodPort: k.LocalPort, Remote: k.Remote, RemotePort: k.RemotePort,
			Node: v.Addr, NodePort: v.Port, Created: v.Created, Service: v.Flags&NATFlagNodeport != 0}
		_, r := n.keys()
		if back, ok := entries[r]; ok && back.Addr == k.Local && back.Port == k.LocalPort {
			paired[r] = true
		} else {
			n.Orphan = true
		}
		out = append(out, n)
	}
	for k, v := range entries {
		if k.Dir == NATDirEgress || paired[k] {
			continue
		}
		out = append(out, NATMapping{Proto: k.Proto, Pod: v.Addr, PodPort: v.Port, Remote: k.Remote, RemotePort: k.RemotePort,
			Node: k.Local, NodePort: k.LocalPort, Created: v.Created, Orphan: true, Service: v.Flags&NATFlagNodeport != 0})
	}
	return out
}

// Count is the number of entries of both families (two per mapping).
func (t NATMap) Count() (int, error) {
	n4, err := countKeys(t.m4)
	if err != nil || t.m6 == nil {
		return n4, err
	}
	n6, err := countKeys(t.m6)
	return n4 + n6, err
}

// Capacity is the tables' maximum number of entries.
func (t NATMap) Capacity() int {
	c := int(t.m4.MaxEntries())
	if t.m6 != nil {
		c += int(t.m6.MaxEntries())
	}
	return c
}

// NATMinAge is how old a mapping must be before the GC may remove it for
// a missing conntrack entry: the datapath makes the conntrack entry before
// the mapping (from_pod runs first), but a GC walk that read the conntrack
// table just before a new flow began must not take its fresh mapping.
const NATMinAge = 10 * time.Second

// NATSweep counts one collection of the NAT table.
type NATSweep struct {
	// Mappings seen and deleted (with both their entries); Orphans are
	// single entries deleted.
	Seen, Deleted, Orphans int
}

// CollectNAT deletes every mapping whose flow has no live conntrack entry
// (ct, at monotonic time now), and entries whose other half is gone and
// that are older than NATMinAge: the NAT entries go with conntrack.
func (t NATMap) CollectNAT(ct CTMap, now uint64) (NATSweep, error) {
	var res NATSweep
	list, err := t.List()
	if err != nil {
		return res, err
	}
	minAge := uint64(NATMinAge.Nanoseconds())
	var dels []natKey
	for _, n := range list {
		res.Seen++
		if n.Created+minAge > now {
			continue
		}
		fwd, rev := n.keys()
		if n.Orphan {
			res.Orphans++
			// Only the half that exists is deleted: the other key may
			// belong to another mapping (a port taken over).
			if t.owns(fwd, n.Node, n.NodePort) {
				dels = append(dels, fwd)
			} else if t.owns(rev, n.Pod, n.PodPort) {
				dels = append(dels, rev)
			}
			continue
		}
		e, found, err := ct.Lookup(CTEntry{Proto: n.Proto, Src: n.Pod, SrcPort: n.PodPort, Dst: n.Remote, DstPort: n.RemotePort})
		if err != nil {
			return res, err
		}
		if found && e.Expires > now {
			continue
		}
		res.Deleted++
		dels = append(dels, fwd, rev)
	}
	t.deleteAll(dels)
	return res, nil
}

// owns reports whether key still holds the entry giving addr and port.
func (t NATMap) owns(key natKey, addr netip.Addr, port uint16) bool {
	v, ok := t.lookup(key)
	return ok && v.Addr == addr && v.Port == port
}

// SetNoMasquerade makes the prefixes the destinations that keep the pod's
// address, removing any other.
func (m *NATMaps) SetNoMasquerade(prefixes []netip.Prefix) error {
	want := map[bpf.LxcIpcacheKey]bool{}
	for _, p := range prefixes {
		k, err := ipcacheKey(p)
		if err != nil {
			return err
		}
		want[k] = true
		var one uint8 = 1
		if err := m.NoMasq.Put(&k, &one); err != nil {
			return fmt.Errorf("write non-masquerade prefix %s: %w", p, err)
		}
	}
	var k bpf.LxcIpcacheKey
	var v uint8
	var stale []bpf.LxcIpcacheKey
	it := m.NoMasq.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate non-masquerade prefixes: %w", err)
	}
	for i := range stale {
		if err := ignoreMissing(m.NoMasq.Delete(&stale[i])); err != nil {
			return fmt.Errorf("delete non-masquerade prefix: %w", err)
		}
	}
	return nil
}

// NoMasquerade lists the non-masquerade prefixes.
func (m *NATMaps) NoMasquerade() ([]netip.Prefix, error) {
	var k bpf.LxcIpcacheKey
	var v uint8
	var out []netip.Prefix
	it := m.NoMasq.Iterate()
	for it.Next(&k, &v) {
		out = append(out, netip.PrefixFrom(bytesAddr(k.Family, k.Addr), int(k.Prefixlen)-32))
	}
	return out, it.Err()
}

// HostDevice is what the host programs know of one device.
type HostDevice struct {
	IfIndex int
	// MasqIPv4 and MasqIPv6 are the addresses masqueraded traffic leaves
	// with through the device (invalid: that family is not masqueraded
	// there).
	MasqIPv4 netip.Addr
	MasqIPv6 netip.Addr
	// NoMasquerade: pod traffic leaving through the device keeps its
	// address (--enable-masquerade=false); the addresses serve only the
	// source NAT of requests from outside to a remote backend (NodePort).
	NoMasquerade bool
}

// SetHostDevice writes a device's entry.
func (m *NATMaps) SetHostDevice(d HostDevice) error {
	k := uint32(d.IfIndex)
	v := bpf.LxcHostdevInfo{}
	if d.MasqIPv4.IsValid() && d.MasqIPv4.Unmap().Is4() {
		if !d.NoMasquerade {
			v.Flags |= HostDevFlagMasqV4
		}
		v.Ipv4 = d.MasqIPv4.Unmap().As4()
	}
	if d.MasqIPv6.IsValid() && d.MasqIPv6.Is6() && !d.MasqIPv6.Is4In6() {
		if !d.NoMasquerade {
			v.Flags |= HostDevFlagMasqV6
		}
		v.Ipv6 = d.MasqIPv6.As16()
	}
	if err := m.HostDev.Put(&k, &v); err != nil {
		return fmt.Errorf("write host device %d: %w", d.IfIndex, err)
	}
	return nil
}

// HostDevices lists the devices' entries.
func (m *NATMaps) HostDevices() ([]HostDevice, error) {
	var k uint32
	var v bpf.LxcHostdevInfo
	var out []HostDevice
	it := m.HostDev.Iterate()
	for it.Next(&k, &v) {
		d := HostDevice{IfIndex: int(k), NoMasquerade: v.Flags&(HostDevFlagMasqV4|HostDevFlagMasqV6) == 0}
		if v.Ipv4 != [4]byte{} {
			d.MasqIPv4 = netip.AddrFrom4(v.Ipv4)
		}
		if v.Ipv6 != [16]byte{} {
			d.MasqIPv6 = netip.AddrFrom16(v.Ipv6)
		}
		out = append(out, d)
	}
	return out, it.Err()
}

// DeleteHostDevice removes a device's entry; a missing one is fine.
func (m *NATMaps) DeleteHostDevice(ifindex int) error {
	k := uint32(ifindex)
	return ignoreMissing(m.HostDev.Delete(&k))
}
