// Package maps wraps the datapath's pinned BPF maps (bpf/lib/maps.h) in
// typed Go accessors: endpoints, ipcache, policy, conntrack, metrics, each
// with Upsert/Delete/Lookup/Iterate/Count, and names the drop reasons. The
// values shared with the C programs (reasons, flags, event types) are
// generated from bpf/lib/enums.h into enums_gen.go.
package maps

//go:generate go run ../../../hack/bpfenums -in ../../../bpf/lib/enums.h -out enums_gen.go -package maps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// Pinned map names. Each carries its layout version: a changed C struct
// gets a new name, so a pin of the old layout is replaced, never misread.
const (
	EndpointsMapName = bpf.LxcMapTdrEndpointsV2
	EndpointIfxName  = bpf.LxcMapTdrEpIfindexV1
	EndpointIDName   = bpf.LxcMapTdrEpIdV1
	EndpointIP4Name  = bpf.LxcMapTdrEndpointIp4V1
	EndpointIP6Name  = bpf.LxcMapTdrEndpointIp6V1
	IPCacheMapName   = bpf.LxcMapTdrIpcacheV2
	PolicyCIDRName   = bpf.LxcMapTdrPolicyCidrV1
	AuditMapName     = bpf.LxcMapTdrAuditV1
	PolicyMapName    = bpf.LxcMapTdrPolicyV2
	CT4MapName       = bpf.LxcMapTdrCt4V2
	CT6MapName       = bpf.LxcMapTdrCt6V2
	MetricsMapName   = bpf.LxcMapTdrMetricsV2
	EventsMapName    = bpf.LxcMapTdrEventsV1
	RateLimitMapName = bpf.LxcMapTdrRatelimitV2
)

// PinnedNames maps the short names the CLI and API use to pinned names
// ("endpoints" are three maps: by interface, IPv4 and IPv6 address; the
// name is the interface map's).
func PinnedNames() map[string]string {
	return map[string]string{
		"endpoints": EndpointsMapName, "ipcache": IPCacheMapName, "policy": PolicyMapName, "policy-cidr": PolicyCIDRName,
		"ct4": CT4MapName, "ct6": CT6MapName, "metrics": MetricsMapName,
	}
}

// Maps are the datapath's maps of one node.
type Maps struct {
	Endpoints    *ebpf.Map // by ifindex, every endpoint
	EndpointsIfx *ebpf.Map // array by ifindex, below its size
	EndpointsID  *ebpf.Map // array by endpoint ID
	EndpointsIP4 *ebpf.Map
	EndpointsIP6 *ebpf.Map
	IPCache      *ebpf.Map
	PolicyCIDR   *ebpf.Map // prefixes rules name, for in-cluster addresses
	Policy       *ebpf.Map // array of per-endpoint tries
	Audit        *ebpf.Map // connections audited policies would deny, per rule
	CT4          *ebpf.Map
	CT6          *ebpf.Map
	Metrics      *ebpf.Map
	Events       *ebpf.Map
	// LB are the service load-balancing maps (nil when opened with
	// OpenPinned: OpenPinnedLB opens them).
	LB *LBMaps
	// NAT are the masquerade maps (nil when opened with OpenPinned:
	// OpenPinnedNAT opens them).
	NAT *NATMaps
	// L2Resp is the L2 announcements' ARP responder map (nil when opened
	// with OpenPinned).
	L2Resp *ebpf.Map
	// DNSFallback is the DNS fallback's allowed names (nil when opened
	// with OpenPinned).
	DNSFallback *ebpf.Map

	policyOnce sync.Once
	policy     *PolicyMap
}

// FromObjects takes the maps of loaded objects.
func FromObjects(o *bpf.LxcMaps) *Maps {
	return &Maps{
		Endpoints: o.TdrEndpointsV2, EndpointsIfx: o.TdrEpIfindexV1, EndpointsID: o.TdrEpIdV1,
		EndpointsIP4: o.TdrEndpointIp4V1, EndpointsIP6: o.TdrEndpointIp6V1, IPCache: o.TdrIpcacheV2, PolicyCIDR: o.TdrPolicyCidrV1, Policy: o.TdrPolicyV2, Audit: o.TdrAuditV1,
		CT4: o.TdrCt4V2, CT6: o.TdrCt6V2, Metrics: o.TdrMetricsV2, Events: o.TdrEventsV1,
		LB: LBFromObjects(o), NAT: NATFromObjects(o), L2Resp: o.TdrL2ResponderV4, DNSFallback: o.TdrDnsFallbackV1,
	}
}

// PolicyTrieSpec is the spec of one endpoint's policy trie, as the
// datapath object declares it.
func PolicyTrieSpec() (*ebpf.MapSpec, error) {
	spec, err := bpf.LoadLxc()
	if err != nil {
		return nil, fmt.Errorf("load datapath spec: %w", err)
	}
	outer, ok := spec.Maps[PolicyMapName]
	if !ok || outer.InnerMap == nil {
		return nil, fmt.Errorf("datapath spec has no %s with an inner map", PolicyMapName)
	}
	return outer.InnerMap, nil
}

// OpenPinned opens the maps pinned under root (a node's BPF root) without
// loading any program: the CLI reads them while the agent is down.
func OpenPinned(root string, readOnly bool) (*Maps, error) {
	m := &Maps{}
	opts := &ebpf.LoadPinOptions{ReadOnly: readOnly}
	for name, dst := range map[string]**ebpf.Map{
		EndpointsMapName: &m.Endpoints, EndpointIfxName: &m.EndpointsIfx, EndpointIDName: &m.EndpointsID, EndpointIP4Name: &m.EndpointsIP4, EndpointIP6Name: &m.EndpointsIP6, IPCacheMapName: &m.IPCache, PolicyCIDRName: &m.PolicyCIDR, PolicyMapName: &m.Policy, AuditMapName: &m.Audit,
		CT4MapName: &m.CT4, CT6MapName: &m.CT6, MetricsMapName: &m.Metrics,
	} {
		mp, err := ebpf.LoadPinnedMap(filepath.Join(root, name), opts)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("open pinned map %s under %s (is it the agent's --bpf-root, and is the agent's version the same?): %w", name, root, err)
		}
		*dst = mp
	}
	return m, nil
}

// Close releases the handles (pins stay).
func (m *Maps) Close() {
	if m.policy != nil {
		m.policy.Close()
	}
	if m.LB != nil {
		m.LB.Close()
	}
	for _, mp := range []*ebpf.Map{m.Endpoints, m.EndpointsIfx, m.EndpointsID, m.EndpointsIP4, m.EndpointsIP6, m.IPCache, m.PolicyCIDR, m.Policy, m.Audit, m.CT4, m.CT6, m.Metrics, m.Events} {
		if mp != nil {
			mp.Close()
		}
	}
}

// EndpointMap is the typed endpoints map.
func (m *Maps) EndpointMap() EndpointMap {
	return EndpointMap{byIfindex: m.Endpoints, ifindexSlots: m.EndpointsIfx, byID: m.EndpointsID, byIPv4: m.EndpointsIP4, byIPv6: m.EndpointsIP6}
}

// IPCacheMap is the typed ipcache.
func (m *Maps) IPCacheMap() IPCacheMap { return IPCacheMap{m: m.IPCache} }

// PolicyCIDRMap is the typed map of the prefixes policy rules name.
func (m *Maps) PolicyCIDRMap() PolicyCIDRMap { return PolicyCIDRMap{m: m.PolicyCIDR} }

// AuditMap is the typed audit counters map.
func (m *Maps) AuditMap() AuditMap { return AuditMap{m: m.Audit} }

// PolicyMap is the typed policy map, one per Maps: it caches the handles
// of the endpoints' tries. Tries are created from the datapath object's
// spec, read once when first needed.
func (m *Maps) PolicyMap() *PolicyMap {
	m.policyOnce.Do(func() { m.policy = NewPolicyMap(m.Policy, 0) })
	return m.policy
}

// CTMap is the typed conntrack table (both families).
func (m *Maps) CTMap() CTMap { return CTMap{v4: m.CT4, v6: m.CT6} }

// MetricsMap is the typed counters map.
func (m *Maps) MetricsMap() MetricsMap { return MetricsMap{m: m.Metrics} }

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

// countKeys counts a map's entries by walking its keys (one syscall per
// key, no values copied).
func countKeys(m *ebpf.Map) (int, error) {
	key := make([]byte, m.KeySize())
	next := make([]byte, m.KeySize())
	n := 0
	var prev any // nil starts at the first key
	for {
		err := m.NextKey(prev, &next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("count entries of %s: %w", m, err)
		}
		n++
		copy(key, next)
		prev = key
	}
}

func ignoreMissing(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// batchSize is how many entries one batch lookup reads.
const batchSize = 1024

// readArray calls fn for every slot of an array map (or array of maps:
// then V is the inner map's ID and empty slots are skipped), a batch of
// slots per syscall instead of two syscalls per slot.
func readArray[V any](m *ebpf.Map, fn func(slot uint32, v V)) error {
	keys := make([]uint32, batchSize)
	vals := make([]V, batchSize)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			fn(keys[i], vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", m, err)
		}
	}
}
