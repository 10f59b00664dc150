// Package lbpool reads the addresses of a load-balancer IP pool's blocks,
// once for every reader: LB-IPAM (pkg/operator/lbipam) assigns from them,
// and the L2 announcements and the BGP guard admit only what they hold.
// Three copies of this parsing once disagreed on IPv4-mapped addresses and
// on the network and broadcast addresses of a CIDR.
package lbpool

import (
	"errors"
	"fmt"
	"net/netip"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// Range is From to To, both included, of one family (IPv4 addresses are
// never IPv4-mapped).
type Range struct{ From, To netip.Addr }

// Contains reports whether a lies in the range; an IPv4-mapped address is
// read as its IPv4 address.
func (r Range) Contains(a netip.Addr) bool {
	a = a.Unmap()
	return a.BitLen() == r.From.BitLen() && r.From.Compare(a) <= 0 && a.Compare(r.To) <= 0
}

// BlockRange is every address of a block as written: a CIDR whole, or
// start to stop. A Service may hold any of them (a user may ask for one).
func BlockRange(b v1alpha1.LoadBalancerIPBlock) (Range, error) {
	r, _, err := parseBlock(b)
	return r, err
}

// AssignableRange is the part of a block LB-IPAM hands out: in an IPv4
// CIDR of more than two addresses neither the network nor the broadcast
// address (some clients refuse them); a start/stop range as written.
func AssignableRange(b v1alpha1.LoadBalancerIPBlock) (Range, error) {
	r, p, err := parseBlock(b)
	if err != nil {
		return Range{}, err
	}
	if p.IsValid() && p.Addr().Is4() && p.Bits() < 31 {
		r.From, r.To = r.From.Next(), r.To.Prev()
	}
	return r, nil
}

// parseBlock is the block's range and, for a CIDR block, its prefix
// (IPv4-mapped prefixes read as IPv4 ones).
func parseBlock(b v1alpha1.LoadBalancerIPBlock) (Range, netip.Prefix, error) {
	switch {
	case b.CIDR != "" && b.Start == "" && b.Stop == "":
		p, err := netip.ParsePrefix(b.CIDR)
		if err != nil {
			return Range{}, netip.Prefix{}, fmt.Errorf("cidr %q: %w", b.CIDR, err)
		}
		bits := p.Bits()
		if p.Addr().Is4In6() {
			if bits < 96 {
				return Range{}, netip.Prefix{}, fmt.Errorf("cidr %q: an IPv4-mapped prefix shorter than /96", b.CIDR)
			}
			bits -= 96
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), bits).Masked()
		return Range{From: p.Addr(), To: lastAddr(p)}, p, nil
	case b.CIDR == "" && b.Start != "" && b.Stop != "":
		from, err := netip.ParseAddr(b.Start)
		if err != nil {
			return Range{}, netip.Prefix{}, fmt.Errorf("start %q: %w", b.Start, err)
		}
		to, err := netip.ParseAddr(b.Stop)
		if err != nil {
			return Range{}, netip.Prefix{}, fmt.Errorf("stop %q: %w", b.Stop, err)
		}
		from, to = from.Unmap(), to.Unmap()
		if from.BitLen() != to.BitLen() {
			return Range{}, netip.Prefix{}, fmt.Errorf("start %s and stop %s are of different families", from, to)
		}
		if to.Less(from) {
			return Range{}, netip.Prefix{}, fmt.Errorf("stop %s is before start %s", to, from)
		}
		return Range{From: from, To: to}, netip.Prefix{}, nil
	}
	return Range{}, netip.Prefix{}, errors.New("want cidr, or start and stop")
}

// lastAddr is the highest address of a prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
