package agentpolicy

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/tendril-net/tendril/pkg/identity"
)

// TestPolicyCIDRIdentityLabels: the flows name a node-local CIDR
// identity (plain or in-cluster) by the prefix the policy gave it, and
// know nothing of others.
func TestPolicyCIDRIdentityLabels(t *testing.T) {
	pm := &Module{cidrIDs: map[netip.Prefix]identity.NumericIdentity{netip.MustParsePrefix("192.0.2.0/24"): identity.LocalScope | 1}}
	for id, want := range map[identity.NumericIdentity]string{
		identity.LocalScope | 1:                          "[cidr:192.0.2.0/24]",
		identity.LocalScope | 1 | identity.InClusterCIDR: "[cidr:192.0.2.0/24]",
		identity.LocalScope | 2:                          "[]",
	} {
		if got := fmt.Sprint(pm.CIDRIdentityLabels(id)); got != want {
			t.Errorf("identity %d: %s, want %s", id, got, want)
		}
	}
}

// TestAllowLocalhostConfig: --allow-localhost takes always or policy
// (policy by default) and rejects anything else.
func TestAllowLocalhostConfig(t *testing.T) {
	if got := DefaultConfig().AllowLocalhost; got != AllowLocalhostPolicy {
		t.Errorf("default %q, want %q", got, AllowLocalhostPolicy)
	}
	for v, ok := range map[string]bool{AllowLocalhostAlways: true, AllowLocalhostPolicy: true, "auto": false, "yes": false} {
		c := DefaultConfig()
		c.AllowLocalhost = v
		if err := c.validate(); (err == nil) != ok {
			t.Errorf("allow-localhost %q: %v", v, err)
		}
	}
}
