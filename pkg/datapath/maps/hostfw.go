package maps

import (
	"fmt"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// The host firewall (bpf/lib/hostfw.h) keeps the host endpoint's state in
// the maps every endpoint's lives in, under endpoint ID 0, which no pod
// gets: its policy in the policy map's endpoint-0 tries (the host policy
// map), its enforcement and audit flags in slot 0 of the by-ID endpoint
// array (the datapath never returns that slot for a pod, and RebuildSlots
// keeps it: its ep_id is 0).

// HostEndpointID is the host endpoint's ID in the policy map and in the
// datapath's events.
const HostEndpointID uint16 = 0

// HostFirewallCTID is the host's side of a conntrack entry the host
// firewall admitted (HOSTFW_CT_ID): above every endpoint ID.
const HostFirewallCTID uint16 = 0xffff

// hostIdentity is the reserved identity host (ID_HOST), which slot 0 must
// carry for the datapath to read its flags.
const hostIdentity = 1

// HostFirewallFlags are the flags the host firewall reads.
const HostFirewallFlags = FlagEnforceIngress | FlagEnforceEgress | FlagAuditIngress | FlagAuditEgress

// SetHostFirewall writes the host endpoint's enforcement and audit flags
// (FlagEnforce*, FlagAudit*); 0 turns the host firewall off.
func (m EndpointMap) SetHostFirewall(flags uint8) error {
	if flags&^HostFirewallFlags != 0 {
		return fmt.Errorf("host firewall flags %#x: only enforce and audit flags", flags)
	}
	v := bpf.LxcEndpointInfo{Identity: hostIdentity, Flags: flags}
	if flags == 0 {
		v = bpf.LxcEndpointInfo{}
	}
	if err := m.byID.Put(uint32(HostEndpointID), &v); err != nil {
		return fmt.Errorf("write the host firewall's flags: %w", err)
	}
	return nil
}

// HostFirewall reads the host endpoint's flags back (0: off).
func (m EndpointMap) HostFirewall() (uint8, error) {
	var v bpf.LxcEndpointInfo
	if err := m.byID.Lookup(uint32(HostEndpointID), &v); err != nil {
		return 0, fmt.Errorf("read the host firewall's flags: %w", err)
	}
	if v.Identity != hostIdentity {
		return 0, nil
	}
	return v.Flags & HostFirewallFlags, nil
}

// DumpHost returns the host endpoint's policy entries (DumpEndpoint(0)
// returns every endpoint's).
func (m *PolicyMap) DumpHost() (map[PolicyKey]PolicyValue, error) {
	out := map[PolicyKey]PolicyValue{}
	slots := []uint32{policySlot(HostEndpointID, DirIngress, false), policySlot(HostEndpointID, DirIngress, true),
		policySlot(HostEndpointID, DirEgress, false), policySlot(HostEndpointID, DirEgress, true)}
	err := m.iterateSlots(slots, func(slot uint32, r bpf.LxcPolicyKey, v bpf.LxcPolicyEntry) bool {
		out[fromRawPolicyKey(slot, r)] = PolicyValue{Deny: v.Deny != 0, Cookie: v.Cookie, Flags: v.Flags}
		return true
	})
	return out, err
}
