package maps

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"github.com/cilium/ebpf"
)

// The first layout (v1) of the maps whose layout changed since: pinned as
// tdr_endpoints_v1, tdr_ipcache_v1 and tdr_ct_v1 by datapaths up to commit
// 435eb53. A running datapath of that layout keeps enforcing with them
// until the new programs replace it, so the agent copies their entries into
// the current maps before it swaps the programs: pods keep their
// connections and their policy across the upgrade. The structs mirror the
// C layout of that version exactly; their sizes are checked against the
// pinned maps before anything is read.

// Pinned names of the v1 maps.
const (
	EndpointsV1MapName = "tdr_endpoints_v1"
	IPCacheV1MapName   = "tdr_ipcache_v1"
	CTV1MapName        = "tdr_ct_v1"
	// PolicyV1MapName is the one LPM trie of every endpoint's policy
	// (endpoint ID and direction in the key), used up to commit d679259
	// (datapath layouts v1 and v2); now each endpoint has tries of its own.
	PolicyV1MapName = "tdr_policy_v1"
)

type policyKeyV1 struct {
	Prefixlen uint32
	EpID      uint16
	Dir       uint8
	Pad       uint8
	Identity  uint32
	Proto     uint8
	Pad2      uint8
	Dport     uint16 // network byte order
}

type policyEntryV1 struct {
	Deny   uint8
	Pad    [3]uint8
	Cookie uint32
}

type endpointKeyV1 struct {
	Family uint8
	Pad    [3]uint8
	Addr   [16]uint8
}

type endpointInfoV1 struct {
	Ifindex  uint32
	Identity uint32
	EpID     uint16
	Flags    uint8
	Pad      uint8
	MAC      [6]uint8
	HostMAC  [6]uint8
}

type ipcacheKeyV1 struct {
	Prefixlen uint32
	Family    uint8
	Pad       [3]uint8
	Addr      [16]uint8
}

type ipcacheInfoV1 struct {
	Identity  uint32
	TunnelIP4 [4]uint8
	Flags     uint8
	Pad       [3]uint8
}

type ctKeyV1 struct {
	Saddr  [16]uint8
	Daddr  [16]uint8
	Sport  uint16 // network byte order
	Dport  uint16 // network byte order
	Proto  uint8
	Family uint8
	Dir    uint8
	Pad    uint8
	EpID   uint16
	Pad2   uint16
}

type ctEntryV1 struct {
	Expires   uint64 // CLOCK_MONOTONIC, the clock of the current entries too
	Packets   uint64
	Bytes     uint64
	SeenReply uint8
	Closing   uint8
	IsReply   uint8
	Pad       [5]uint8
}

// errLayoutMismatch reports a pin whose shape is not the v1 layout its
// name claims: it is not read.
var errLayoutMismatch = errors.New("pinned map does not have the v1 layout")

func checkLayout(m *ebpf.Map, key, value uintptr) error {
	if uintptr(m.KeySize()) != key || uintptr(m.ValueSize()) != value {
		return fmt.Errorf("%w: key %d/%d bytes, value %d/%d bytes", errLayoutMismatch, m.KeySize(), key, m.ValueSize(), value)
	}
	return nil
}

// MigrationResult counts the entries carried over from one old map.
type MigrationResult struct {
	Read, Written int
}

// MigrateEndpointsV1 copies a v1 endpoints map (one entry per address)
// into the current one (interface and address entries). direct says
// whether an endpoint whose MACs are known takes direct delivery, as the
// loader would decide for it.
func MigrateEndpointsV1(old *ebpf.Map, dst EndpointMap, direct bool) (MigrationResult, error) {
	var res MigrationResult
	if err := checkLayout(old, unsafe.Sizeof(endpointKeyV1{}), unsafe.Sizeof(endpointInfoV1{})); err != nil {
		return res, err
	}
	byID := map[uint16]*Endpoint{}
	var order []uint16
	var k endpointKeyV1
	var v endpointInfoV1
	it := old.Iterate()
	for it.Next(&k, &v) {
		res.Read++
		e, ok := byID[v.EpID]
		if !ok {
			e = &Endpoint{ID: v.EpID, IfIndex: v.Ifindex, Identity: v.Identity, Flags: v.Flags & (FlagEnforceIngress | FlagEnforceEgress)}
			if v.MAC != [6]uint8{} && v.HostMAC != [6]uint8{} {
				e.MAC = append(net.HardwareAddr(nil), v.MAC[:]...)
				e.HostMAC = append(net.HardwareAddr(nil), v.HostMAC[:]...)
				if direct {
					e.Flags |= FlagDeliverDirect
				}
			}
			byID[v.EpID] = e
			order = append(order, v.EpID)
		}
		switch k.Family {
		case FamilyV4:
			e.IPv4 = netip.AddrFrom4([4]byte(k.Addr[:4]))
		case FamilyV6:
			e.IPv6 = netip.AddrFrom16(k.Addr)
		}
	}
	if err := it.Err(); err != nil {
		return res, fmt.Errorf("read %s: %w", EndpointsV1MapName, err)
	}
	for _, id := range order {
		if err := dst.Upsert(*byID[id]); err != nil {
			return res, fmt.Errorf("carry endpoint %d over from %s: %w", id, EndpointsV1MapName, err)
		}
		res.Written++
	}
	return res, nil
}

// MigrateIPCacheV1 copies a v1 ipcache (IPv4 tunnel endpoint) into the
// current one.
func MigrateIPCacheV1(old *ebpf.Map, dst IPCacheMap) (MigrationResult, error) {
	var res MigrationResult
	if err := checkLayout(old, unsafe.Sizeof(ipcacheKeyV1{}), unsafe.Sizeof(ipcacheInfoV1{})); err != nil {
		return res, err
	}
	var k ipcacheKeyV1
	var v ipcacheInfoV1
	it := old.Iterate()
	for it.Next(&k, &v) {
		res.Read++
		if k.Prefixlen < 32 || (k.Family != FamilyV4 && k.Family != FamilyV6) {
			continue
		}
		p := netip.PrefixFrom(bytesAddr(k.Family, k.Addr), int(k.Prefixlen)-32)
		e := IPCacheEntry{Identity: v.Identity, Flags: v.Flags}
		if v.TunnelIP4 != [4]uint8{} {
			e.TunnelIP = netip.AddrFrom4(v.TunnelIP4)
		}
		if err := dst.Upsert(p, e); err != nil {
			return res, fmt.Errorf("carry %s over from %s: %w", p, IPCacheV1MapName, err)
		}
		res.Written++
	}
	if err := it.Err(); err != nil {
		return res, fmt.Errorf("read %s: %w", IPCacheV1MapName, err)
	}
	return res, nil
}

// MigrateCTV1 copies the flows of a v1 conntrack table (an entry per
// endpoint, direction and tuple, plus one for each flow's reply direction)
// into the current tables (one entry per flow, naming its local
// endpoints): the entries the two endpoints of a local flow had become
// one. Reply-direction entries carry nothing the flow's own entry lacks
// and are skipped; entries that expired before now are dropped.
func MigrateCTV1(old *ebpf.Map, dst CTMap, now uint64) (MigrationResult, error) {
	var res MigrationResult
	if err := checkLayout(old, unsafe.Sizeof(ctKeyV1{}), unsafe.Sizeof(ctEntryV1{})); err != nil {
		return res, err
	}
	type tuple struct {
		proto            uint8
		src, dst         netip.Addr
		srcPort, dstPort uint16
	}
	flows := map[tuple]*CTEntry{}
	var order []tuple
	var k ctKeyV1
	var v ctEntryV1
	it := old.Iterate()
	for it.Next(&k, &v) {
		res.Read++
		if v.IsReply != 0 || v.Expires <= now || (k.Family != FamilyV4 && k.Family != FamilyV6) {
			continue
		}
		// The v1 key holds the flow's first packet as it went: its
		// source started the flow, whichever endpoint saw it.
		t := tuple{proto: k.Proto, src: bytesAddr(k.Family, k.Saddr), dst: bytesAddr(k.Family, k.Daddr), srcPort: Ntohs(k.Sport), dstPort: Ntohs(k.Dport)}
		e, ok := flows[t]
		if !ok {
			e = &CTEntry{Proto: t.proto, Src: t.src, Dst: t.dst, SrcPort: t.srcPort, DstPort: t.dstPort}
			flows[t] = e
			order = append(order, t)
		}
		if k.Dir == DirEgress {
			e.SrcEndpoint = k.EpID
		} else {
			e.DstEndpoint = k.EpID
		}
		if v.Expires > e.Expires {
			e.Expires = v.Expires
		}
		if v.SeenReply != 0 {
			e.Flags |= CTFlagSeenReply
		}
		if v.Closing != 0 {
			e.Flags |= CTFlagClosing
		}
	}
	// An LRU table may evict under the walk, which then gives up; what
	// was read so far is still carried over.
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		return res, fmt.Errorf("read %s: %w", CTV1MapName, err)
	}
	for _, t := range order {
		if err := dst.Upsert(*flows[t]); err != nil {
			return res, fmt.Errorf("carry a flow over from %s: %w", CTV1MapName, err)
		}
		res.Written++
	}
	return res, nil
}

// MigratePolicyV1 copies the one-trie policy map of the earlier layouts
// into the endpoints' own tries. Its prefix counted 64 fixed bits (endpoint
// ID, direction, pad, identity) before protocol and port.
func MigratePolicyV1(old *ebpf.Map, dst *PolicyMap) (MigrationResult, error) {
	var res MigrationResult
	if err := checkLayout(old, unsafe.Sizeof(policyKeyV1{}), unsafe.Sizeof(policyEntryV1{})); err != nil {
		return res, err
	}
	const fixedV1 = 64
	var k policyKeyV1
	var v policyEntryV1
	it := old.Iterate()
	for it.Next(&k, &v) {
		res.Read++
		if k.Prefixlen < fixedV1 || k.EpID == 0 || k.Dir > DirEgress {
			continue
		}
		nk := PolicyKey{EndpointID: k.EpID, Direction: k.Dir, Identity: k.Identity}
		if k.Prefixlen > fixedV1 {
			nk.Proto, nk.Port, nk.PortPrefixLen = k.Proto, Ntohs(k.Dport), uint8(k.Prefixlen-fixedV1-16)
		}
		if err := dst.Upsert(nk, PolicyValue{Deny: v.Deny != 0, Cookie: v.Cookie}); err != nil {
			return res, fmt.Errorf("carry policy entry %+v over from %s: %w", nk, PolicyV1MapName, err)
		}
		res.Written++
	}
	if err := it.Err(); err != nil {
		return res, fmt.Errorf("read %s: %w", PolicyV1MapName, err)
	}
	return res, nil
}
