package nodemanager

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/tendril-net/tendril/pkg/datapath/wireguard/wgkey"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// PeerFromNode reads a peer from a Node object: InternalIP (then
// ExternalIP) addresses and spec.podCIDRs.
func PeerFromNode(n *corev1.Node) Peer {
	p := Peer{Name: n.Name, Created: n.CreationTimestamp.Time}
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
	p.PodCIDRs, p.Rejected = parseCIDRs(cidrs)
	return p
}

// parseCIDRs reads pod CIDRs; one that does not parse is kept as a
// rejection, so that it shows rather than vanishes.
func parseCIDRs(cidrs []string) (ok []netip.Prefix, bad []Rejection) {
	for _, c := range cidrs {
		pf, err := netip.ParsePrefix(c)
		if err != nil {
			bad = append(bad, Rejection{CIDR: c, Reason: ReasonMalformed, Detail: err.Error()})
			continue
		}
		ok = append(ok, pf.Masked())
	}
	return ok, bad
}

// MergeTendrilNode completes a peer with what its agent published: the
// pod CIDRs it actually uses (they may come from an annotation or a flag
// rather than the Node's spec) and its addresses.
func MergeTendrilNode(p Peer, tn *v1alpha1.TendrilNode) Peer {
	if tn == nil {
		return p
	}
	// Another node wrote this: a key that is not one never reaches the
	// device.
	if s := tn.Spec.Encryption.WireGuardPublicKey; s != "" {
		if k, err := wgkey.ParsePublicKey(s); err != nil {
			p.KeyError = err.Error()
		} else {
			p.WireGuardKey = k.String()
		}
	}
	// The health endpoint's addresses: checked against the accepted pod
	// CIDRs where they are used (Peer.HealthEndpointIPs).
	for _, a := range tn.Spec.Addresses {
		if a.Type != v1alpha1.NodeAddressHealthIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.IP); err == nil {
			p.HealthIPs = append(p.HealthIPs, ip)
		}
	}
	if len(tn.Spec.IPAM.PodCIDRs) > 0 {
		p.PodCIDRs, p.Rejected = parseCIDRs(tn.Spec.IPAM.PodCIDRs)
	}
	if len(p.IPs) == 0 {
		for _, a := range tn.Spec.Addresses {
			if a.Type == "TendrilInternalIP" || a.Type == v1alpha1.NodeAddressHealthIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.IP); err == nil {
				p.IPs = append(p.IPs, ip)
			}
		}
	}
	return p
}
