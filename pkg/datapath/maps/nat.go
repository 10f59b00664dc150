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
}

// NATFromObjects takes the masquerade maps of loaded objects.
func NATFromObjects(o *bpf.LxcMaps) *NATMaps {
	return &NATMaps{NAT4: o.TdrNat4V1, NAT6: o.TdrNat6V1, NoMasq: o.TdrNomasqV1, HostDev: o.TdrHostdevV1}
}

// OpenPinnedNAT opens the masquerade maps pinned under root (the CLI reads
// them while the agent is down).
func OpenPinnedNAT(root string, readOnly bool) (*NATMaps, error) {
	m := &NATMaps{}
	opts := &ebpf.LoadPinOptions{ReadOnly: readOnly}
	for name, dst := range map[string]**ebpf.Map{NAT4MapName: &m.NAT4, NAT6MapName: &m.NAT6, NoMasqMapName: &m.NoMasq, HostDevMapName: &m.HostDev} {
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
	for _, mp := range []*ebpf.Map{m.NAT4, m.NAT6, m.NoMasq, m.HostDev} {
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

func (n NATMapping) keys4() (fwd, rev bpf.LxcNat4Key) {
	fwd = bpf.LxcNat4Key{AddrL: n.Pod.As4(), AddrR: n.Remote.As4(), PortL: Htons(n.PodPort), PortR: Htons(n.RemotePort), Proto: n.Proto, Dir: NATDirEgress}
	rev = bpf.LxcNat4Key{AddrL: n.Node.As4(), AddrR: n.Remote.As4(), PortL: Htons(n.NodePort), PortR: Htons(n.RemotePort), Proto: n.Proto, Dir: NATDirIngress}
	return fwd, rev
}

func (n NATMapping) keys6() (fwd, rev bpf.LxcNat6Key) {
	fwd = bpf.LxcNat6Key{AddrL: n.Pod.As16(), AddrR: n.Remote.As16(), PortL: Htons(n.PodPort), PortR: Htons(n.RemotePort), Proto: n.Proto, Dir: NATDirEgress}
	rev = bpf.LxcNat6Key{AddrL: n.Node.As16(), AddrR: n.Remote.As16(), PortL: Htons(n.NodePort), PortR: Htons(n.RemotePort), Proto: n.Proto, Dir: NATDirIngress}
	return fwd, rev
}

// NATMap is the typed NAT table: one hash per address family.
type NATMap struct{ m4, m6 *ebpf.Map }

// NATMap is the typed NAT table.
func (m *NATMaps) NATMap() NATMap { return NATMap{m4: m.NAT4, m6: m.NAT6} }

// Upsert writes both entries of a mapping (tests).
func (t NATMap) Upsert(n NATMapping) error {
	var err error
	if n.Pod.Is4() {
		fwd, rev := n.keys4()
		out := bpf.LxcNat4Entry{Addr: n.Node.As4(), Port: Htons(n.NodePort), Created: n.Created}
		back := bpf.LxcNat4Entry{Addr: n.Pod.As4(), Port: Htons(n.PodPort), Created: n.Created}
		if err = t.m4.Put(&rev, &back); err == nil {
			err = t.m4.Put(&fwd, &out)
		}
	} else {
		fwd, rev := n.keys6()
		out := bpf.LxcNat6Entry{Addr: n.Node.As16(), Port: Htons(n.NodePort), Created: n.Created}
		back := bpf.LxcNat6Entry{Addr: n.Pod.As16(), Port: Htons(n.PodPort), Created: n.Created}
		if err = t.m6.Put(&rev, &back); err == nil {
			err = t.m6.Put(&fwd, &out)
		}
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
	out, err := list4(t.m4)
	if err != nil || t.m6 == nil {
		return out, err
	}
	out6, err := list6(t.m6)
	return append(out, out6...), err
}

func list4(m *ebpf.Map) ([]NATMapping, error) {
	var k bpf.LxcNat4Key
	var v bpf.LxcNat4Entry
	fwd := map[bpf.LxcNat4Key]bpf.LxcNat4Entry{}
	rev := map[bpf.LxcNat4Key]bpf.LxcNat4Entry{}
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k.Dir == NATDirEgress {
			fwd[k] = v
		} else {
			rev[k] = v
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate IPv4 NAT table: %w", err)
	}
	var out []NATMapping
	for k, v := range fwd {
		n := NATMapping{Proto: k.Proto, Pod: netip.AddrFrom4(k.AddrL), PodPort: Ntohs(k.PortL), Remote: netip.AddrFrom4(k.AddrR), RemotePort: Ntohs(k.PortR),
			Node: netip.AddrFrom4(v.Addr), NodePort: Ntohs(v.Port), Created: v.Created, Service: v.Flags&NATFlagNodeport != 0}
		_, r := n.keys4()
		back, ok := rev[r]
		if ok && back.Addr == k.AddrL && back.Port == k.PortL {
			delete(rev, r)
		} else {
			n.Orphan = true
		}
		out = append(out, n)
	}
	for k, v := range rev {
		out = append(out, NATMapping{Proto: k.Proto, Pod: netip.AddrFrom4(v.Addr), PodPort: Ntohs(v.Port), Remote: netip.AddrFrom4(k.AddrR), RemotePort: Ntohs(k.PortR),
			Node: netip.AddrFrom4(k.AddrL), NodePort: Ntohs(k.PortL), Created: v.Created, Orphan: true, Service: v.Flags&NATFlagNodeport != 0})
	}
	return out, nil
}

func list6(m *ebpf.Map) ([]NATMapping, error) {
	var k bpf.LxcNat6Key
	var v bpf.LxcNat6Entry
	fwd := map[bpf.LxcNat6Key]bpf.LxcNat6Entry{}
	rev := map[bpf.LxcNat6Key]bpf.LxcNat6Entry{}
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k.Dir == NATDirEgress {
			fwd[k] = v
		} else {
			rev[k] = v
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate IPv6 NAT table: %w", err)
	}
	var out []NATMapping
	for k, v := range fwd {
		n := NATMapping{Proto: k.Proto, Pod: netip.AddrFrom16(k.AddrL), PodPort: Ntohs(k.PortL), Remote: netip.AddrFrom16(k.AddrR), RemotePort: Ntohs(k.PortR),
			Node: netip.AddrFrom16(v.Addr), NodePort: Ntohs(v.Port), Created: v.Created}
		_, r := n.keys6()
		back, ok := rev[r]
		if ok && back.Addr == k.AddrL && back.Port == k.PortL {
			delete(rev, r)
		} else {
			n.Orphan = true
		}
		out = append(out, n)
	}
	for k, v := range rev {
		out = append(out, NATMapping{Proto: k.Proto, Pod: netip.AddrFrom16(v.Addr), PodPort: Ntohs(v.Port), Remote: netip.AddrFrom16(k.AddrR), RemotePort: Ntohs(k.PortR),
			Node: netip.AddrFrom16(k.AddrL), NodePort: Ntohs(k.PortL), Created: v.Created, Orphan: true})
	}
	return out, nil
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
	var dels4 []bpf.LxcNat4Key
	var dels6 []bpf.LxcNat6Key
	for _, n := range list {
		res.Seen++
		if n.Created+minAge > now {
			continue
		}
		if n.Orphan {
			res.Orphans++
			// Only the half that exists is deleted: the other key may
			// belong to another mapping (a port taken over).
			if n.Pod.Is4() {
				fwd, rev := n.keys4()
				if owns4(t.m4, fwd, n.Node, n.NodePort) {
					dels4 = append(dels4, fwd)
				} else if owns4(t.m4, rev, n.Pod, n.PodPort) {
					dels4 = append(dels4, rev)
				}
			} else {
				fwd, rev := n.keys6()
				if owns6(t.m6, fwd, n.Node, n.NodePort) {
					dels6 = append(dels6, fwd)
				} else if owns6(t.m6, rev, n.Pod, n.PodPort) {
					dels6 = append(dels6, rev)
				}
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
		if n.Pod.Is4() {
			fwd, rev := n.keys4()
			dels4 = append(dels4, fwd, rev)
		} else {
			fwd, rev := n.keys6()
			dels6 = append(dels6, fwd, rev)
		}
	}
	deleteKeys(t.m4, dels4)
	if t.m6 != nil {
		deleteKeys(t.m6, dels6)
	}
	return res, nil
}

// owns4 and owns6 report whether key still holds the entry giving addr
// and port.
func owns4(m *ebpf.Map, key bpf.LxcNat4Key, addr netip.Addr, port uint16) bool {
	var v bpf.LxcNat4Entry
	return m.Lookup(&key, &v) == nil && v.Addr == addr.As4() && Ntohs(v.Port) == port
}

func owns6(m *ebpf.Map, key bpf.LxcNat6Key, addr netip.Addr, port uint16) bool {
	var v bpf.LxcNat6Entry
	return m.Lookup(&key, &v) == nil && v.Addr == addr.As16() && Ntohs(v.Port) == port
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
}

// SetHostDevice writes a device's entry.
func (m *NATMaps) SetHostDevice(d HostDevice) error {
	k := uint32(d.IfIndex)
	v := bpf.LxcHostdevInfo{}
	if d.MasqIPv4.IsValid() && d.MasqIPv4.Unmap().Is4() {
		v.Flags |= HostDevFlagMasqV4
		v.Ipv4 = d.MasqIPv4.Unmap().As4()
	}
	if d.MasqIPv6.IsValid() && d.MasqIPv6.Is6() && !d.MasqIPv6.Is4In6() {
		v.Flags |= HostDevFlagMasqV6
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
		d := HostDevice{IfIndex: int(k)}
		if v.Flags&HostDevFlagMasqV4 != 0 {
			d.MasqIPv4 = netip.AddrFrom4(v.Ipv4)
		}
		if v.Flags&HostDevFlagMasqV6 != 0 {
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
