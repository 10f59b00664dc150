package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// PolicyKey is one policy map key. Identity 0 matches any identity; Proto 0
// (with PortPrefixLen 0) any protocol and port; PortPrefixLen says how many
// leading bits of Port must match (16 exact, 0 any port), which expresses a
// port range as a few prefixes (see PortRangePrefixes).
type PolicyKey struct {
	EndpointID    uint16
	Direction     uint8
	Identity      uint32
	Proto         uint8
	Port          uint16
	PortPrefixLen uint8
}

// PolicyValue is an allow or deny, with the rule cookie reported in events.
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

// UpsertPolicy writes one policy entry.
func (m *Maps) UpsertPolicy(k PolicyKey, v PolicyValue) error {
	r, err := k.raw()
	if err != nil {
		return err
	}
	val := bpf.LxcPolicyEntry{Cookie: v.Cookie}
	if v.Deny {
		val.Deny = 1
	}
	if err := m.Policy.Put(&r, &val); err != nil {
		return fmt.Errorf("write policy entry %+v: %w", k, err)
	}
	return nil
}

// DeletePolicy removes one policy entry; a missing one is fine.
func (m *Maps) DeletePolicy(k PolicyKey) error {
	r, err := k.raw()
	if err != nil {
		return err
	}
	if err := m.Policy.Delete(&r); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete policy entry %+v: %w", k, err)
	}
	return nil
}

// DumpPolicy lists the policy entries of one endpoint (all when id is 0).
func (m *Maps) DumpPolicy(id uint16) (map[PolicyKey]PolicyValue, error) {
	out := map[PolicyKey]PolicyValue{}
	var r bpf.LxcPolicyKey
	var v bpf.LxcPolicyEntry
	it := m.Policy.Iterate()
	for it.Next(&r, &v) {
		if id != 0 && r.EpId != id {
			continue
		}
		out[fromRawPolicyKey(r)] = PolicyValue{Deny: v.Deny != 0, Cookie: v.Cookie}
	}
	return out, it.Err()
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
