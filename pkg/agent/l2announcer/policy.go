package l2announcer

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/loadbalancer/lbpool"
)

// Policy is one TendrilLoadBalancerIPPool's spec.l2Announcements as this
// node applies it: which addresses (the pool's blocks, of which kinds),
// of which services, on which devices, and whether this node may announce
// at all. Only an address some policy admits is ever announced.
type Policy struct {
	Pool string
	// Blocks are the pool's addresses, both ends included.
	Blocks []AddrRange
	// Services selects the services (the pool's serviceSelector and the
	// policy's, both).
	Services labels.Selector
	// Node: this node matches the policy's nodeSelector.
	Node bool
	// Interfaces match whole device names; none: every device.
	Interfaces []*regexp.Regexp
	// LoadBalancerIPs and ExternalIPs: which kinds of address it admits.
	LoadBalancerIPs, ExternalIPs bool
}

// AddrRange is a run of addresses, both ends included.
type AddrRange = lbpool.Range

// Admits reports whether the policy lets a service with labels lbls
// announce addr as a load-balancer (lb) or external address.
func (p *Policy) Admits(addr netip.Addr, lbls map[string]string, lb bool) bool {
	if lb && !p.LoadBalancerIPs || !lb && !p.ExternalIPs {
		return false
	}
	if !slices.ContainsFunc(p.Blocks, func(r AddrRange) bool { return r.Contains(addr) }) {
		return false
	}
	return p.Services.Matches(labels.Set(lbls))
}

// OnDevice reports whether the policy lets this node announce on dev.
func (p *Policy) OnDevice(dev string) bool {
	if !p.Node {
		return false
	}
	if len(p.Interfaces) == 0 {
		return true
	}
	return slices.ContainsFunc(p.Interfaces, func(re *regexp.Regexp) bool { return re.MatchString(dev) })
}

// ParsePolicy reads a pool's L2 announcement policy for a node with
// labels nodeLabels; nil without spec.l2Announcements. A pool with an
// invalid field is refused whole (an error naming the field): none of its
// addresses is announced.
func ParsePolicy(pool *v1alpha1.TendrilLoadBalancerIPPool, nodeLabels map[string]string) (*Policy, error) {
	l2 := pool.Spec.L2Announcements
	if l2 == nil {
		return nil, nil
	}
	p := &Policy{Pool: pool.Name, LoadBalancerIPs: l2.LoadBalancerIPs == nil || *l2.LoadBalancerIPs, ExternalIPs: l2.ExternalIPs}
	var errs []error
	for i, b := range pool.Spec.Blocks {
		// A CIDR whole: an announcement may cover any address a
		// Service holds in it.
		r, err := lbpool.BlockRange(b)
		if err != nil {
			errs = append(errs, fmt.Errorf("blocks[%d]: %w", i, err))
			continue
		}
		p.Blocks = append(p.Blocks, r)
	}
	svcSel, err := both(pool.Spec.ServiceSelector, l2.ServiceSelector)
	if err != nil {
		errs = append(errs, fmt.Errorf("serviceSelector: %w", err))
	}
	p.Services = svcSel
	nodeSel, err := selector(l2.NodeSelector)
	if err != nil {
		errs = append(errs, fmt.Errorf("l2Announcements.nodeSelector: %w", err))
	} else {
		p.Node = nodeSel.Matches(labels.Set(nodeLabels))
	}
	for i, s := range l2.Interfaces {
		re, err := regexp.Compile("^(?:" + s + ")$")
		if err != nil {
			errs = append(errs, fmt.Errorf("l2Announcements.interfaces[%d] %q: %w", i, s, err))
			continue
		}
		p.Interfaces = append(p.Interfaces, re)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("pool %s: %w", pool.Name, err)
	}
	return p, nil
}

func selector(s *metav1.LabelSelector) (labels.Selector, error) {
	if s == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(s)
}

// both is the selector of the objects a and b both select.
func both(a, b *metav1.LabelSelector) (labels.Selector, error) {
	sa, err := selector(a)
	if err != nil {
		return nil, err
	}
	sb, err := selector(b)
	if err != nil {
		return nil, err
	}
	reqs, _ := sb.Requirements()
	return sa.Add(reqs...), nil
}
