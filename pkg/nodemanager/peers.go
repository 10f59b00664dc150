package nodemanager

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// PeerFromNode reads a peer from a Node object: InternalIP (then
// ExternalIP) addresses and spec.podCIDRs.
func PeerFromNode(n *corev1.Node) Peer {
	p := Peer{Name: n.Name}
	for _, typ := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if a.Type != typ {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				p.IPs = append(p.IPs, ip)
			}
		}
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if pf, err := netip.ParsePrefix(c); err == nil {
			p.PodCIDRs = append(p.PodCIDRs, pf.Masked())
		}
	}
	return p
}

// MergeTendrilNode completes a peer with what its agent published: the
// pod CIDRs it actually uses (they may come from an annotation or a flag
// rather than the Node's spec) and its addresses.
func MergeTendrilNode(p Peer, tn *v1alpha1.TendrilNode) Peer {
	if tn == nil {
		return p
	}
	if len(tn.Spec.IPAM.PodCIDRs) > 0 {
		p.PodCIDRs = nil
		for _, c := range tn.Spec.IPAM.PodCIDRs {
			if pf, err := netip.ParsePrefix(c); err == nil {
				p.PodCIDRs = append(p.PodCIDRs, pf.Masked())
			}
		}
	}
	if len(p.IPs) == 0 {
		for _, a := range tn.Spec.Addresses {
			if a.Type == "TendrilInternalIP" {
				continue
			}
			if ip, err := netip.ParseAddr(a.IP); err == nil {
				p.IPs = append(p.IPs, ip)
			}
		}
	}
	return p
}
