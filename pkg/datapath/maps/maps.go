// Package maps wraps the datapath's pinned BPF maps (bpf/lib/common.h) with
// typed Go accessors: endpoints, ipcache, policy, conntrack and metrics.
package maps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// Address families as the datapath stores them.
const (
	FamilyV4 = 4
	FamilyV6 = 6
)

// Directions as seen from the endpoint.
const (
	DirIngress uint8 = 0
	DirEgress  uint8 = 1
)

// Endpoint flags.
const (
	FlagEnforceIngress uint8 = 1
	FlagEnforceEgress  uint8 = 2
)

// Maps are the datapath's maps of one node.
type Maps struct {
	Endpoints *ebpf.Map
	IPCache   *ebpf.Map
	Policy    *ebpf.Map
	CT        *ebpf.Map
	Metrics   *ebpf.Map
	Events    *ebpf.Map
}

// FromObjects takes the maps of loaded objects.
func FromObjects(o *bpf.LxcMaps) *Maps {
	return &Maps{
		Endpoints: o.TdrEndpointsV1, IPCache: o.TdrIpcacheV1, Policy: o.TdrPolicyV1,
		CT: o.TdrCtV1, Metrics: o.TdrMetricsV2, Events: o.TdrEventsV1,
	}
}

// Htons converts a port to network byte order as the C structs hold it.
func Htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// Ntohs is Htons' inverse.
func Ntohs(v uint16) uint16 { return Htons(v) }

func addrBytes(a netip.Addr) (uint8, [16]uint8) {
	var out [16]uint8
	a = a.Unmap()
	if a.Is4() {
		b := a.As4()
		copy(out[:], b[:])
		return FamilyV4, out
	}
	return FamilyV6, a.As16()
}

func bytesAddr(family uint8, b [16]uint8) netip.Addr {
	if family == FamilyV4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

// EndpointValue is one local endpoint's datapath facts.
type EndpointValue struct {
	IfIndex  uint32
	Identity uint32
	ID       uint16
	Flags    uint8
	MAC      net.HardwareAddr
	HostMAC  net.HardwareAddr
}

// UpsertEndpoint maps one of an endpoint's addresses to its facts.
func (m *Maps) UpsertEndpoint(ip netip.Addr, v EndpointValue) error {
	fam, addr := addrBytes(ip)
	k := bpf.LxcEndpointKey{Family: fam, Addr: addr}
	val := bpf.LxcEndpointInfo{Ifindex: v.IfIndex, Identity: v.Identity, EpId: v.ID, Flags: v.Flags}
	copy(val.Mac[:], v.MAC)
	copy(val.HostMac[:], v.HostMAC)
	if err := m.Endpoints.Put(&k, &val); err != nil {
		return fmt.Errorf("write endpoint %d (%s) to the endpoints map: %w", v.ID, ip, err)
	}
	return nil
}

// DeleteEndpoint removes an address; a missing one is fine.
func (m *Maps) DeleteEndpoint(ip netip.Addr) error {
	fam, addr := addrBytes(ip)
	k := bpf.LxcEndpointKey{Family: fam, Addr: addr}
	if err := m.Endpoints.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete %s from the endpoints map: %w", ip, err)
	}
	return nil
}

// EndpointEntry is one row of the endpoints map.
type EndpointEntry struct {
	IP netip.Addr
	EndpointValue
}

// DumpEndpoints lists the endpoints map.
func (m *Maps) DumpEndpoints() ([]EndpointEntry, error) {
	var out []EndpointEntry
	var k bpf.LxcEndpointKey
	var v bpf.LxcEndpointInfo
	it := m.Endpoints.Iterate()
	for it.Next(&k, &v) {
		out = append(out, EndpointEntry{IP: bytesAddr(k.Family, k.Addr), EndpointValue: EndpointValue{
			IfIndex: v.Ifindex, Identity: v.Identity, ID: v.EpId, Flags: v.Flags,
			MAC: append(net.HardwareAddr(nil), v.Mac[:]...), HostMAC: append(net.HardwareAddr(nil), v.HostMac[:]...),
		}})
	}
	return out, it.Err()
}

func ipcacheKey(p netip.Prefix) bpf.LxcIpcacheKey {
	fam, addr := addrBytes(p.Masked().Addr())
	return bpf.LxcIpcacheKey{Prefixlen: uint32(32 + p.Bits()), Family: fam, Addr: addr}
}

// IPCacheValue is the identity of a prefix and the node owning it.
type IPCacheValue struct {
	Identity uint32
	// TunnelIP is the owner node's IPv4 address (zero when local/unknown).
	TunnelIP netip.Addr
}

// UpsertIPCache maps a prefix to an identity.
func (m *Maps) UpsertIPCache(p netip.Prefix, v IPCacheValue) error {
	k := ipcacheKey(p)
	val := bpf.LxcIpcacheInfo{Identity: v.Identity}
	if v.TunnelIP.Is4() {
		b := v.TunnelIP.As4()
		val.TunnelIp4 = binary.NativeEndian.Uint32(b[:])
	}
	if err := m.IPCache.Put(&k, &val); err != nil {
		return fmt.Errorf("write %s to the ipcache map: %w", p, err)
	}
	return nil
}

// DeleteIPCache removes a prefix; a missing one is fine.
func (m *Maps) DeleteIPCache(p netip.Prefix) error {
	k := ipcacheKey(p)
	if err := m.IPCache.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete %s from the ipcache map: %w", p, err)
	}
	return nil
}

// DumpIPCache lists the ipcache map.
func (m *Maps) DumpIPCache() (map[netip.Prefix]IPCacheValue, error) {
	out := map[netip.Prefix]IPCacheValue{}
	var k bpf.LxcIpcacheKey
	var v bpf.LxcIpcacheInfo
	it := m.IPCache.Iterate()
	for it.Next(&k, &v) {
		p := netip.PrefixFrom(bytesAddr(k.Family, k.Addr), int(k.Prefixlen)-32)
		val := IPCacheValue{Identity: v.Identity}
		if v.TunnelIp4 != 0 {
			var b [4]byte
			binary.NativeEndian.PutUint32(b[:], v.TunnelIp4)
			val.TunnelIP = netip.AddrFrom4(b)
		}
		out[p] = val
	}
	return out, it.Err()
}
