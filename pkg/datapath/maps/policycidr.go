package maps

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// PolicyCIDRMap is the LPM trie of the prefixes policy rules name (CIDRs
// and their exceptions) to the node-local identity an in-cluster address
// inside the prefix carries for those rules. The ipcache gives a pod's or
// a node's address its own identity; the datapath looks the address up
// here as well, so a rule's CIDR selects every address in its block.
type PolicyCIDRMap struct{ m *ebpf.Map }

// Upsert maps a prefix to its in-cluster CIDR identity.
func (m PolicyCIDRMap) Upsert(p netip.Prefix, id uint32) error {
	k, err := ipcacheKey(p)
	if err != nil {
		return err
	}
	if err := m.m.Put(&k, &id); err != nil {
		return fmt.Errorf("write %s to the policy CIDR map: %w", p, err)
	}
	return nil
}

// Delete removes a prefix; a missing one is fine.
func (m PolicyCIDRMap) Delete(p netip.Prefix) error {
	k, err := ipcacheKey(p)
	if err != nil {
		return err
	}
	if err := ignoreMissing(m.m.Delete(&k)); err != nil {
		return fmt.Errorf("delete %s from the policy CIDR map: %w", p, err)
	}
	return nil
}

// LookupAddr resolves an address as the datapath does: the identity of the
// longest prefix holding it, false when no rule names one.
func (m PolicyCIDRMap) LookupAddr(ip netip.Addr) (uint32, bool, error) {
	k, err := ipcacheKey(netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
	if err != nil {
		return 0, false, err
	}
	var id uint32
	if err := m.m.Lookup(&k, &id); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("look up %s in the policy CIDR map: %w", ip, err)
	}
	return id, true, nil
}

// Dump returns every prefix's identity.
func (m PolicyCIDRMap) Dump() (map[netip.Prefix]uint32, error) {
	out := map[netip.Prefix]uint32{}
	var k bpf.LxcIpcacheKey
	var id uint32
	it := m.m.Iterate()
	for it.Next(&k, &id) {
		out[netip.PrefixFrom(bytesAddr(k.Family, k.Addr), int(k.Prefixlen)-32)] = id
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate the policy CIDR map: %w", err)
	}
	return out, nil
}
