package maps

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// PolicyKey is one policy map key: for endpoint EndpointID, traffic in
// Direction (DirIngress: from the peer to the endpoint; DirEgress: from the
// endpoint) with a peer of Identity (0: any identity), protocol Proto (0:
// any protocol and port) and destination port Port, of which the first
// PortPrefixLen bits must match (16: exactly Port; 0: any port; a range is
// a few prefixes, see PortRangePrefixes). For ICMP the port is the type.
type PolicyKey struct {
	EndpointID    uint16
	Direction     uint8
	Identity      uint32
	Proto         uint8
	Port          uint16
	PortPrefixLen uint8
}

// String renders the key for people, the one form the API and the CLI
// print: "ep=3 ingress identity=1000 proto=6 port=8192-9215"; identity 0
// is "any", a key without protocol "proto=any" (and no port), a protocol
// with port prefix length 0 "port=any".
func (k PolicyKey) String() string {
	id := "any"
	if k.Identity != 0 {
		id = fmt.Sprint(k.Identity)
	}
	head := fmt.Sprintf("ep=%d %s identity=%s", k.EndpointID, DirectionName(k.Direction), id)
	switch {
	case k.Proto == 0:
		return head + " proto=any"
	case k.PortPrefixLen == 0:
		return fmt.Sprintf("%s proto=%d port=any", head, k.Proto)
	case k.PortPrefixLen >= 16:
		return fmt.Sprintf("%s proto=%d port=%d", head, k.Proto, k.Port)
	}
	// The range the prefix covers: the port with the bits past the
	// prefix cleared, to the port with them set.
	span := uint32(1) << (16 - k.PortPrefixLen)
	first := uint32(k.Port) &^ (span - 1)
	return fmt.Sprintf("%s proto=%d port=%d-%d", head, k.Proto, first, first+span-1)
}

// PolicyValue is an allow or deny, with the rule cookie reported in
// events. Within one lookup the longest protocol/port prefix wins; across
// the peer's identity and "any identity", a deny beats any allow.
type PolicyValue struct {
	Deny   bool
	Cookie uint32
	// Flags (PolicyFlag*) say what the enforced and the audit view have at
	// the key, for an endpoint under audited policy; 0 otherwise.
	Flags uint8
	// Proxy (Proxy*) is the node's proxy an allowed egress flow goes to:
	// its port has L7 rules. 0: none. The datapath holds it in the high
	// nibble of the entry's match byte (bpf/lib/maps.h).
	Proxy uint8
}

// entryMatch is an entry's match byte: the key's match type and the
// proxy.
func entryMatch(k PolicyKey, v PolicyValue) uint8 { return k.MatchType() | v.Proxy<<4 }

// entryProxy reads the proxy back from an entry's match byte.
func entryProxy(match uint8) uint8 { return match >> 4 }

// MatchType is what the key matches (PolicyMatch*), which the datapath
// reports in the verdict events of the flows it allows.
func (k PolicyKey) MatchType() uint8 {
	switch {
	case k.Identity != 0 && k.Proto == 0:
		return PolicyMatchL3Only
	case k.Identity != 0:
		return PolicyMatchL3L4
	case k.Proto == 0:
		return PolicyMatchAll
	}
	return PolicyMatchL4Only
}

// fixedPolicyBits is the identity, always matched whole.
const fixedPolicyBits = 32

func policySlot(ep uint16, dir uint8, anyIdentity bool) uint32 {
	s := uint32(ep)*policySlotsPerEp | uint32(dir&1)<<1
	if anyIdentity {
		s |= 1
	}
	return s
}

func (k PolicyKey) slot() uint32 { return policySlot(k.EndpointID, k.Direction, k.Identity == 0) }

func (k PolicyKey) raw() (bpf.LxcPolicyKey, error) {
	if k.PortPrefixLen > 16 {
		return bpf.LxcPolicyKey{}, fmt.Errorf("policy key: port prefix length %d > 16", k.PortPrefixLen)
	}
	if k.Proto == 0 && (k.Port != 0 || k.PortPrefixLen != 0) {
		return bpf.LxcPolicyKey{}, fmt.Errorf("policy key: a port needs a protocol")
	}
	if k.Direction > DirEgress {
		return bpf.LxcPolicyKey{}, fmt.Errorf("policy key: direction %d", k.Direction)
	}
	r := bpf.LxcPolicyKey{Identity: k.Identity}
	r.Prefixlen = fixedPolicyBits
	if k.Proto != 0 {
		r.Proto = k.Proto
		r.Prefixlen += 16 + uint32(k.PortPrefixLen)
		mask := uint16(0)
		if k.PortPrefixLen > 0 {
			mask = ^uint16(0) << (16 - k.PortPrefixLen)
		}
		r.Dport = Htons(k.Port & mask)
	}
	return r, nil
}

// fromRawPolicyKey is the key r of the trie in slot.
func fromRawPolicyKey(slot uint32, r bpf.LxcPolicyKey) PolicyKey {
	k := PolicyKey{EndpointID: uint16(slot / policySlotsPerEp), Direction: uint8(slot>>1) & 1, Identity: r.Identity}
	if r.Prefixlen > fixedPolicyBits {
		k.Proto = r.Proto
		k.PortPrefixLen = uint8(r.Prefixlen - fixedPolicyBits - 16)
		k.Port = Ntohs(r.Dport)
	}
	return k
}

// PolicyMap is every endpoint's policy: the pinned outer array
// (tdr_policy_v2) holds, per endpoint, up to four small LPM tries (see
// policySlot), so the datapath walks only the deciding endpoint's entries.
// Tries are created when an endpoint gets its first entry of a kind and
// dropped with the endpoint. Safe for concurrent use.
type PolicyMap struct {
	outer *ebpf.Map
	// innerSpec returns the spec tries are created from; nil for a map
	// opened read-only.
	innerSpec func() (*ebpf.MapSpec, error)

	mu sync.Mutex
	// tries caches open handles of the tries, by slot. Until scanned,
	// a slot missing here may still hold a trie made by an earlier
	// process; after the one scan of the outer map, tries is the whole
	// truth (only the agent's one PolicyMap writes).
	tries   map[uint32]*ebpf.Map
	scanned bool
}

// NewPolicyMap is a typed handle on an open outer policy map (one of
// its kind per outer map: it caches the tries) whose new tries hold
// trieEntries entries each (0: as many as the datapath object declares).
// The kernel takes tries of any size in the outer map; a smaller one
// fills sooner, as a test of a full map needs.
func NewPolicyMap(outer *ebpf.Map, trieEntries uint32) *PolicyMap {
	var once sync.Once
	var spec *ebpf.MapSpec
	var err error
	return newPolicyMap(outer, func() (*ebpf.MapSpec, error) {
		once.Do(func() {
			if spec, err = PolicyTrieSpec(); err == nil && trieEntries > 0 {
				spec = spec.Copy()
				spec.MaxEntries = trieEntries
			}
		})
		return spec, err
	})
}

func newPolicyMap(outer *ebpf.Map, innerSpec func() (*ebpf.MapSpec, error)) *PolicyMap {
	return &PolicyMap{outer: outer, innerSpec: innerSpec, tries: map[uint32]*ebpf.Map{}}
}

// trieLocked returns the trie in slot, or nil when there is none.
func (m *PolicyMap) trieLocked(slot uint32) (*ebpf.Map, error) {
	if t, ok := m.tries[slot]; ok || m.scanned {
		return t, nil
	}
	var id uint32
	if err := m.outer.Lookup(slot, &id); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("look up policy slot %d: %w", slot, err)
	}
	t, err := ebpf.NewMapFromID(ebpf.MapID(id))
	if err != nil {
		return nil, fmt.Errorf("open policy trie %d of slot %d: %w", id, slot, err)
	}
	m.tries[slot] = t
	return t, nil
}

// createTrieLocked makes the trie of slot and puts it in the outer map.
func (m *PolicyMap) createTrieLocked(slot uint32) (*ebpf.Map, error) {
	if m.innerSpec == nil {
		return nil, errors.New("policy map opened without the datapath's spec: cannot add tries")
	}
	spec, err := m.innerSpec()
	if err != nil {
		return nil, err
	}
	spec = spec.Copy()
	// Kernel map names hold 15 characters: tdrpol_<ep>_<kind>.
	spec.Name = fmt.Sprintf("tdrpol_%d_%d", slot/policySlotsPerEp, slot%policySlotsPerEp)
	t, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("create policy trie of slot %d: %w", slot, err)
	}
	if err := m.outer.Put(slot, t); err != nil {
		t.Close()
		return nil, fmt.Errorf("install policy trie of slot %d: %w", slot, err)
	}
	m.tries[slot] = t
	return t, nil
}

// Upsert writes one entry.
func (m *PolicyMap) Upsert(k PolicyKey, v PolicyValue) error {
	r, err := k.raw()
	if err != nil {
		return err
	}
	val := bpf.LxcPolicyEntry{Cookie: v.Cookie, Match: entryMatch(k, v), Flags: v.Flags}
	if v.Deny {
		val.Deny = 1
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t, err := m.trieLocked(k.slot())
	if err == nil && t == nil {
		t, err = m.createTrieLocked(k.slot())
	}
	if err != nil {
		return fmt.Errorf("write policy entry %+v: %w", k, err)
	}
	if err := t.Put(&r, &val); err != nil {
		return fmt.Errorf("write policy entry %+v: %w", k, err)
	}
	return nil
}

// Delete removes one entry; a missing one is fine.
func (m *PolicyMap) Delete(k PolicyKey) error {
	r, err := k.raw()
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t, err := m.trieLocked(k.slot())
	if err == nil && t != nil {
		err = ignoreMissing(t.Delete(&r))
	}
	if err != nil {
		return fmt.Errorf("delete policy entry %+v: %w", k, err)
	}
	return nil
}

// Lookup returns the entry stored under exactly k.
func (m *PolicyMap) Lookup(k PolicyKey) (PolicyValue, bool, error) {
	want, err := k.raw()
	if err != nil {
		return PolicyValue{}, false, err
	}
	// The kernel answers the longest match; an exact hit is confirmed by
	// looking for the key itself in the endpoint's trie.
	var found PolicyValue
	ok := false
	err = m.iterateSlots([]uint32{k.slot()}, func(_ uint32, r bpf.LxcPolicyKey, v bpf.LxcPolicyEntry) bool {
		if r == want {
			found, ok = PolicyValue{Deny: v.Deny != 0, Cookie: v.Cookie, Flags: v.Flags, Proxy: entryProxy(v.Match)}, true
			return false
		}
		return true
	})
	return found, ok, err
}

// Decide answers as the datapath would for a new flow of endpoint ep: the
// entry for the peer's identity and the one for any identity (longest
// protocol/port match each), deny first. found is false when nothing
// allows (a default deny).
func (m *PolicyMap) Decide(ep uint16, dir uint8, identity uint32, proto uint8, port uint16) (v PolicyValue, found bool, err error) {
	lookup := func(id uint32) (*bpf.LxcPolicyEntry, error) {
		m.mu.Lock()
		t, err := m.trieLocked(policySlot(ep, dir, id == 0))
		m.mu.Unlock()
		if err != nil || t == nil {
			return nil, err
		}
		k := bpf.LxcPolicyKey{Prefixlen: fixedPolicyBits + 32, Identity: id, Proto: proto, Dport: Htons(port)}
		var e bpf.LxcPolicyEntry
		if err := t.Lookup(&k, &e); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return nil, nil
			}
			return nil, fmt.Errorf("look up policy: %w", err)
		}
		return &e, nil
	}
	exact, err := lookup(identity)
	if err != nil {
		return v, false, err
	}
	anyID, err := lookup(0)
	if err != nil {
		return v, false, err
	}
	// The enforced view: entries only the audit view has do not count.
	if exact != nil && exact.Flags&PolicyFlagENone != 0 {
		exact = nil
	}
	if anyID != nil && anyID.Flags&PolicyFlagENone != 0 {
		anyID = nil
	}
	for _, e := range []*bpf.LxcPolicyEntry{exact, anyID} {
		if e != nil && e.Deny != 0 {
			return PolicyValue{Deny: true, Cookie: e.Cookie}, true, nil
		}
	}
	for _, e := range []*bpf.LxcPolicyEntry{exact, anyID} {
		if e != nil {
			return PolicyValue{Cookie: e.Cookie, Proxy: entryProxy(e.Match)}, true, nil
		}
	}
	return v, false, nil
}

// endpointSlots are the slots of endpoint id, or, for id 0, every slot
// that holds a trie.
func (m *PolicyMap) endpointSlots(id uint16) ([]uint32, error) {
	if id != 0 {
		return []uint32{policySlot(id, DirIngress, false), policySlot(id, DirIngress, true), policySlot(id, DirEgress, false), policySlot(id, DirEgress, true)}, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.scanned {
		// One read of every slot; from then on the cache knows.
		var ids []uint32
		var slots []uint32
		if err := readArray(m.outer, func(slot uint32, id uint32) {
			if _, ok := m.tries[slot]; !ok {
				slots, ids = append(slots, slot), append(ids, id)
			}
		}); err != nil {
			return nil, err
		}
		for i, slot := range slots {
			t, err := ebpf.NewMapFromID(ebpf.MapID(ids[i]))
			if err != nil {
				return nil, fmt.Errorf("open policy trie %d of slot %d: %w", ids[i], slot, err)
			}
			m.tries[slot] = t
		}
		m.scanned = true
	}
	out := make([]uint32, 0, len(m.tries))
	for s := range m.tries {
		out = append(out, s)
	}
	slices.Sort(out)
	return out, nil
}

// iterateSlots calls fn for each entry of the tries in slots until fn
// returns false.
func (m *PolicyMap) iterateSlots(slots []uint32, fn func(uint32, bpf.LxcPolicyKey, bpf.LxcPolicyEntry) bool) error {
	for _, slot := range slots {
		m.mu.Lock()
		t, err := m.trieLocked(slot)
		m.mu.Unlock()
		if err != nil {
			return err
		}
		if t == nil {
			continue
		}
		var r bpf.LxcPolicyKey
		var v bpf.LxcPolicyEntry
		it := t.Iterate()
		for it.Next(&r, &v) {
			if !fn(slot, r, v) {
				return nil
			}
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("iterate the policy trie of slot %d: %w", slot, err)
		}
	}
	return nil
}

// Iterate calls fn for each entry until fn returns false.
func (m *PolicyMap) Iterate(fn func(PolicyKey, PolicyValue) bool) error {
	slots, err := m.endpointSlots(0)
	if err != nil {
		return err
	}
	return m.iterateSlots(slots, func(slot uint32, r bpf.LxcPolicyKey, v bpf.LxcPolicyEntry) bool {
		return fn(fromRawPolicyKey(slot, r), PolicyValue{Deny: v.Deny != 0, Cookie: v.Cookie, Flags: v.Flags, Proxy: entryProxy(v.Match)})
	})
}

// DumpEndpoint returns the entries of one endpoint (all when id is 0).
func (m *PolicyMap) DumpEndpoint(id uint16) (map[PolicyKey]PolicyValue, error) {
	out := map[PolicyKey]PolicyValue{}
	slots, err := m.endpointSlots(id)
	if err != nil {
		return nil, err
	}
	err = m.iterateSlots(slots, func(slot uint32, r bpf.LxcPolicyKey, v bpf.LxcPolicyEntry) bool {
		out[fromRawPolicyKey(slot, r)] = PolicyValue{Deny: v.Deny != 0, Cookie: v.Cookie, Flags: v.Flags, Proxy: entryProxy(v.Match)}
		return true
	})
	return out, err
}

// DeleteEndpoint removes every entry of one endpoint: its tries leave the
// outer map (the kernel frees them once no program run holds them).
func (m *PolicyMap) DeleteEndpoint(id uint16) error {
	if id == 0 {
		return errors.New("delete policy: endpoint ID 0")
	}
	slots, _ := m.endpointSlots(id)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, slot := range slots {
		if err := ignoreMissing(m.outer.Delete(slot)); err != nil {
			return fmt.Errorf("remove the policy trie of slot %d: %w", slot, err)
		}
		if t, ok := m.tries[slot]; ok {
			t.Close()
			delete(m.tries, slot)
		}
	}
	return nil
}

// Count is the number of entries.
func (m *PolicyMap) Count() (int, error) {
	slots, err := m.endpointSlots(0)
	if err != nil {
		return 0, err
	}
	n := 0
	err = m.iterateSlots(slots, func(uint32, bpf.LxcPolicyKey, bpf.LxcPolicyEntry) bool { n++; return true })
	return n, err
}

// Tries is the number of endpoint tries in the map.
func (m *PolicyMap) Tries() (int, error) {
	slots, err := m.endpointSlots(0)
	return len(slots), err
}

// Capacity is the number of entries the map's tries can hold: each trie
// has its own limit (TrieCapacity).
func (m *PolicyMap) Capacity() int {
	n, _ := m.Tries()
	return n * m.TrieCapacity()
}

// TrieCapacity is the most entries one endpoint may have of one direction
// and identity kind.
func (m *PolicyMap) TrieCapacity() int {
	if m.innerSpec != nil {
		if s, err := m.innerSpec(); err == nil {
			return int(s.MaxEntries)
		}
	}
	return 65536
}

// Close releases the tries' handles.
func (m *PolicyMap) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for slot, t := range m.tries {
		t.Close()
		delete(m.tries, slot)
	}
}

// PortRange is a port with the number of leading bits that must match.
type PortRange struct {
	Port      uint16
	PrefixLen uint8
}

// PortRangePrefixes splits [from, to] into the fewest prefixes (at most 30
// for 16-bit ports).
func PortRangePrefixes(from, to uint16) []PortRange {
	if from > to {
		return nil
	}
	var out []PortRange
	start := uint32(from)
	end := uint32(to)
	for start <= end {
		// The largest aligned block starting at start that fits in the range.
		size := uint32(1)
		bits := uint8(0)
		for bits < 16 {
			next := size << 1
			if start%next != 0 || start+next-1 > end {
				break
			}
			size = next
			bits++
		}
		out = append(out, PortRange{Port: uint16(start), PrefixLen: 16 - bits})
		start += size
	}
	return out
}
