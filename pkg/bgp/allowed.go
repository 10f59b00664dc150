package bgp

import (
	"fmt"
	"net/netip"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/loadbalancer/lbpool"
)

// Pool is a TendrilLoadBalancerIPPool as the guard reads it: its address
// ranges and the Services it serves.
type Pool struct {
	Name     string
	Ranges   []AddrRange
	Services labels.Selector
}

// AddrRange is From to To, both included.
type AddrRange = lbpool.Range

// ParsePool reads a pool's blocks and selector. A pool with a block that
// does not parse is refused whole (its addresses are announced by no
// one), as LB-IPAM refuses it.
func ParsePool(p *v1alpha1.TendrilLoadBalancerIPPool) (Pool, error) {
	out := Pool{Name: p.Name}
	for i, b := range p.Spec.Blocks {
		r, err := lbpool.AssignableRange(b)
		if err != nil {
			return Pool{}, fmt.Errorf("pool %s: block %d: %w", p.Name, i, err)
		}
		out.Ranges = append(out.Ranges, r)
	}
	sel, err := selector(p.Spec.ServiceSelector)
	if err != nil {
		return Pool{}, fmt.Errorf("pool %s: serviceSelector: %w", p.Name, err)
	}
	out.Services = sel
	return out, nil
}

func selector(s *metav1.LabelSelector) (labels.Selector, error) {
	if s == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(s)
}

// Allowed is what this node may announce: its own pod CIDRs, whole, and
// single addresses of the pools' ranges. It is built from the node and
// the pools alone, never from the advertisements or the services, so
// that nothing those say widens it.
type Allowed struct {
	podCIDRs []netip.Prefix
	pools    []Pool
	// serviceCIDRs are the cluster's (its ServiceCIDR objects): where a
	// cluster IP may be.
	serviceCIDRs []netip.Prefix
}

// WithServiceCIDRs is a with the cluster's service CIDRs, inside which
// cluster IPs may be announced (as host prefixes).
func (a Allowed) WithServiceCIDRs(cidrs []netip.Prefix) Allowed {
	a.serviceCIDRs = cidrs
	return a
}

// NewAllowed is the guard for a node with these pod CIDRs and pools.
func NewAllowed(podCIDRs []netip.Prefix, pools []Pool) Allowed {
	return Allowed{podCIDRs: podCIDRs, pools: pools}
}

// Admit says why p may not be announced (nil: it may): p is one of the
// node's pod CIDRs exactly, or a host prefix (/32, /128) of an address
// that lies in a pool or in one of the cluster's service CIDRs.
func (a Allowed) Admit(p netip.Prefix) error {
	if !p.IsValid() || p != p.Masked() {
		return fmt.Errorf("%s: not a valid prefix", p)
	}
	for _, c := range a.podCIDRs {
		if p == c {
			return nil
		}
	}
	if p.IsSingleIP() {
		if pool := a.poolOf(p.Addr()); pool != "" {
			return nil
		}
		if a.admitClusterIP(p.Addr()) == nil {
			return nil
		}
		return fmt.Errorf("%s: neither a pod CIDR of this node nor in a TendrilLoadBalancerIPPool or a service CIDR", p)
	}
	return fmt.Errorf("%s: not a pod CIDR of this node (%v)", p, a.podCIDRs)
}

// poolOf is the first pool whose ranges hold addr ("" for none).
func (a Allowed) poolOf(addr netip.Addr) string {
	for _, pool := range a.pools {
		for _, r := range pool.Ranges {
			if r.Contains(addr) {
				return pool.Name
			}
		}
	}
	return ""
}

// admitClusterIP says why addr may not be announced as a cluster IP: it
// must lie in one of the cluster's service CIDRs (the API server
// allocates cluster IPs there and refuses others).
func (a Allowed) admitClusterIP(addr netip.Addr) error {
	for _, c := range a.serviceCIDRs {
		if c.Contains(addr) {
			return nil
		}
	}
	if len(a.serviceCIDRs) == 0 {
		return fmt.Errorf("%s: the cluster's service CIDRs are not known (no ServiceCIDR object)", addr)
	}
	return fmt.Errorf("%s: in none of the cluster's service CIDRs", addr)
}

// admitService says why addr may not be announced for a Service with
// these labels: it must lie in a pool that serves the Service (an address
// in another Service's pool was not given to this one by LB-IPAM).
func (a Allowed) admitService(addr netip.Addr, svcLabels map[string]string) error {
	inAny := false
	for _, pool := range a.pools {
		for _, r := range pool.Ranges {
			if !r.Contains(addr) {
				continue
			}
			inAny = true
			if pool.Services.Matches(labels.Set(svcLabels)) {
				return nil
			}
		}
	}
	if inAny {
		return fmt.Errorf("%s: in a TendrilLoadBalancerIPPool that does not serve the Service", addr)
	}
	return fmt.Errorf("%s: in no TendrilLoadBalancerIPPool", addr)
}
