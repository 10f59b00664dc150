package lbipam

import (
	"fmt"
	"math/big"
	"net/netip"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// addrRange is a run of addresses of one family, both ends included.
type addrRange struct{ from, to netip.Addr }

func (r addrRange) contains(a netip.Addr) bool {
	return a.BitLen() == r.from.BitLen() && r.from.Compare(a) <= 0 && a.Compare(r.to) <= 0
}

// size is the number of addresses in the range.
func (r addrRange) size() *big.Int {
	from, to := new(big.Int).SetBytes(r.from.AsSlice()), new(big.Int).SetBytes(r.to.AsSlice())
	return to.Sub(to, from).Add(to, big.NewInt(1))
}

// parseBlocks turns a pool's blocks into ranges. In an IPv4 CIDR of more
// than two addresses the network and broadcast addresses are left out
// (some clients refuse them); a start/stop range is taken as written.
func parseBlocks(blocks []v1alpha1.LoadBalancerIPBlock) ([]addrRange, error) {
	var out []addrRange
	for i, b := range blocks {
		switch {
		case b.CIDR != "" && b.Start == "" && b.Stop == "":
			p, err := netip.ParsePrefix(b.CIDR)
			if err != nil {
				return nil, fmt.Errorf("block %d: cidr %q: %w", i, b.CIDR, err)
			}
			p = p.Masked()
			r := addrRange{from: p.Addr(), to: lastAddr(p)}
			if p.Addr().Is4() && p.Bits() < 31 {
				r.from, r.to = r.from.Next(), r.to.Prev()
			}
			out = append(out, r)
		case b.CIDR == "" && b.Start != "" && b.Stop != "":
			from, err := netip.ParseAddr(b.Start)
			if err != nil {
				return nil, fmt.Errorf("block %d: start %q: %w", i, b.Start, err)
			}
			to, err := netip.ParseAddr(b.Stop)
			if err != nil {
				return nil, fmt.Errorf("block %d: stop %q: %w", i, b.Stop, err)
			}
			from, to = from.Unmap(), to.Unmap()
			if from.BitLen() != to.BitLen() {
				return nil, fmt.Errorf("block %d: start %s and stop %s are of different families", i, from, to)
			}
			if to.Less(from) {
				return nil, fmt.Errorf("block %d: stop %s is before start %s", i, to, from)
			}
			out = append(out, addrRange{from: from, to: to})
		default:
			return nil, fmt.Errorf("block %d: want cidr, or start and stop", i)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no blocks")
	}
	return out, nil
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

func (r addrRange) String() string { return "{" + r.from.String() + " " + r.to.String() + "}" }
