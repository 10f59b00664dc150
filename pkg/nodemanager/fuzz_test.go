package nodemanager

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// FuzzTendrilNode: a Node and a TendrilNode of any content (another node's
// agent writes the TendrilNode) become a peer whose addresses and pod
// CIDRs are valid and masked, whose routes' next hops are of the CIDR's
// family, and that round-trips: the peer read again from a TendrilNode
// holding its own CIDRs and addresses is the same.
func FuzzTendrilNode(f *testing.F) {
	f.Add([]byte(`{"metadata":{"name":"node-b"},"spec":{"podCIDRs":["10.0.1.0/24","fd00:1::/64"]},"status":{"addresses":[{"type":"InternalIP","address":"192.168.0.2"}]}}`),
		[]byte(`{"metadata":{"name":"node-b"},"spec":{"addresses":[{"type":"InternalIP","ip":"192.168.0.2"},{"type":"TendrilInternalIP","ip":"10.0.1.1"}],"ipam":{"podCIDRs":["10.0.1.0/24"]}}}`))
	f.Add([]byte(`{"metadata":{"name":"node-c"},"spec":{"podCIDR":"10.0.2.7/24"}}`),
		[]byte(`{"metadata":{"name":"node-c"},"spec":{"addresses":[{"type":"ExternalIP","ip":"fd00::2"}],"ipam":{"podCIDRs":["fd00:2::/64","bogus"]}}}`))
	f.Add([]byte(`{}`), []byte(`null`))
	f.Fuzz(func(t *testing.T, nodeJSON, tnJSON []byte) {
		var n corev1.Node
		if json.Unmarshal(nodeJSON, &n) != nil {
			return
		}
		var tn *v1alpha1.TendrilNode
		if json.Unmarshal(tnJSON, &tn) != nil {
			return
		}
		p := MergeTendrilNode(PeerFromNode(&n), tn)
		for _, ip := range p.IPs {
			if !ip.IsValid() {
				t.Fatalf("peer address %v", ip)
			}
		}
		for _, c := range p.PodCIDRs {
			if !c.IsValid() || c != c.Masked() {
				t.Fatalf("peer pod CIDR %v", c)
			}
			if via, ok := p.nextHop(c); ok && via.Is4() != c.Addr().Is4() {
				t.Fatalf("route to %s via %s", c, via)
			}
		}
		own := &v1alpha1.TendrilNode{}
		for _, c := range p.PodCIDRs {
			own.Spec.IPAM.PodCIDRs = append(own.Spec.IPAM.PodCIDRs, c.String())
		}
		for _, ip := range p.IPs {
			own.Spec.Addresses = append(own.Spec.Addresses, v1alpha1.NodeAddress{Type: "InternalIP", IP: ip.String()})
		}
		again := MergeTendrilNode(Peer{Name: p.Name}, own)
		if len(p.PodCIDRs) > 0 && !again.sameSpec(&p) {
			t.Fatalf("peer %+v read back as %+v", p, again)
		}
	})
}
