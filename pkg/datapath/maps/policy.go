package maps

import (
	"errors"
	"fmt"

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

// PolicyValue is an allow or deny, with the rule cookie reported in
// events. Within one lookup the longest protocol/port prefix wins; across
// the peer's identity and "any identity", a deny beats any allow.
type PolicyValue struct {
	Deny   bool
	Cookie uint32
}

// fixedPolicyBits are ep_id, dir, pad and identity.
const fixedPolicyBits = 64

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
	r := bpf.LxcPolicyKey{EpId: k.EndpointID, Dir: k.Direction, Identity: k.Identity}
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

func fromRawPolicyKey(r bpf.LxcPolicyKey) PolicyKey {
	k := PolicyKey{EndpointID: r.EpId, Direction: r.Dir, Identity: r.Identity}
	if r.Prefixlen > fixedPolicyBits {
		k.Proto = r.Proto
		k.PortPrefixLen = uint8(r.Prefixlen - fixedPolicyBits - 16)
		k.Port = Ntohs(r.Dport)
	}
	return k
}

// PolicyMap is the LPM trie of every endpoint's policy.
type PolicyMap struct{ m *ebpf.Map }

// Upsert writes one entry.
func (m PolicyMap) Upsert(k PolicyKey, v PolicyValue) error {
	r, err := k.raw()
	if err != nil {
		return err
	}
	val := bpf.LxcPolicyEntry{Cookie: v.Cookie}
	if v.Deny {
		val.Deny = 1
	}
	if err := m.m.Put(&r, &val); err != nil {
		return fmt.Errorf("write policy entry %+v: %w", k, err)
	}
	return nil
}

// Delete removes one entry; a missing one is fine.
func (m PolicyMap) Delete(k PolicyKey) error {
	r, err := k.raw()
	if err != nil {
		return err
	}
	if err := ignoreMissing(m.m.Delete(&r)); err != nil {
		return fmt.Errorf("delete policy entry %+v: %w", k, err)
	}
	return nil
}

// Lookup returns the entry stored under exactly k.
func (m PolicyMap) Lookup(k PolicyKey) (PolicyValue, bool, error) {
	want, err := k.raw()
	if err != nil {
		return PolicyValue{}, false, err
	}
	// The kernel answers the longest match; an exact hit is confirmed by
	// looking for the key itself.
	var found PolicyValue
	ok := false
	err = m.iterateRaw(func(r bpf.LxcPolicyKey, v bpf.LxcPolicyEntry) bool {
		if r == want {
			found, ok = PolicyValue{Deny: v.Deny != 0, Cookie: v.Cookie}, true
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
func (m PolicyMap) Decide(ep uint16, dir uint8, identity uint32, proto uint8, port uint16) (v PolicyValue, found bool, err error) {
	lookup := func(id uint32) (*bpf.LxcPolicyEntry, error) {
		k := bpf.LxcPolicyKey{Prefixlen: fixedPolicyBits + 32, EpId: ep, Dir: dir, Identity: id, Proto: proto, Dport: Htons(port)}
		var e bpf.LxcPolicyEntry
		if err := m.m.Lookup(&k, &e); err != nil {
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
	for _, e := range []*bpf.LxcPolicyEntry{exact, anyID} {
		if e != nil && e.Deny != 0 {
			return PolicyValue{Deny: true, Cookie: e.Cookie}, true, nil
		}
	}
	for _, e := range []*bpf.LxcPolicyEntry{exact, anyID} {
		if e != nil {
			return PolicyValue{Cookie: e.Cookie}, true, nil
		}
	}
	return v, false, nil
}

func (m PolicyMap) iterateRaw(fn func(bpf.LxcPolicyKey, bpf.LxcPolicyEntry) bool) error {
	var r bpf.LxcPolicyKey
	var v bpf.LxcPolicyEntry
	it := m.m.Iterate()
	for it.Next(&r, &v) {
		if !fn(r, v) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate the policy map: %w", err)
	}
	return nil
}

// Iterate calls fn for each entry until fn returns false.
func (m PolicyMap) Iterate(fn func(PolicyKey, PolicyValue) bool) error {
	return m.iterateRaw(func(r bpf.LxcPolicyKey, v bpf.LxcPolicyEntry) bool {
		return fn(fromRawPolicyKey(r), PolicyValue{Deny: v.Deny != 0, Cookie: v.Cookie})
	})
}

// DumpEndpoint returns the entries of one endpoint (all when id is 0).
func (m PolicyMap) DumpEndpoint(id uint16) (map[PolicyKey]PolicyValue, error) {
	out := map[PolicyKey]PolicyValue{}
	err := m.Iterate(func(k PolicyKey, v PolicyValue) bool {
		if id == 0 || k.EndpointID == id {
			out[k] = v
		}
		return true
	})
	return out, err
}

// DeleteEndpoint removes every entry of one endpoint.
func (m PolicyMap) DeleteEndpoint(id uint16) error {
	entries, err := m.DumpEndpoint(id)
	if err != nil {
		return err
	}
	for k := range entries {
		if err := m.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// Count is the number of entries.
func (m PolicyMap) Count() (int, error) { return countKeys(m.m) }

// Capacity is the map's maximum number of entries.
func (m PolicyMap) Capacity() int { return int(m.m.MaxEntries()) }

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
