package lbipam

import (
	"fmt"
	"math/big"
	"net/netip"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/loadbalancer/lbpool"
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

// parseBlocks turns a pool's blocks into the ranges LB-IPAM assigns from
// (lbpool.AssignableRange: in an IPv4 CIDR of more than two addresses the
// network and broadcast addresses are left out).
func parseBlocks(blocks []v1alpha1.LoadBalancerIPBlock) ([]addrRange, error) {
	var out []addrRange
	for i, b := range blocks {
		r, err := lbpool.AssignableRange(b)
		if err != nil {
			return nil, fmt.Errorf("block %d: %w", i, err)
		}
		out = append(out, addrRange{from: r.From, to: r.To})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no blocks")
	}
	return out, nil
}

func (r addrRange) String() string { return "{" + r.from.String() + " " + r.to.String() + "}" }
