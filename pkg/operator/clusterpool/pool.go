package clusterpool

import (
	"errors"
	"fmt"
	"net/netip"
)

// ErrExhausted: every subnet of the pool is allocated.
var ErrExhausted = errors.New("pool exhausted")

// Pool hands out fixed-size subnets of one family from a list of CIDRs,
// lowest first.
type Pool struct {
	family   string
	prefixes []netip.Prefix
	maskSize int
	used     map[netip.Prefix]bool
}

// NewPool validates the CIDRs (all of the family, each no longer than the
// mask size) and returns an empty pool.
func NewPool(cidrs []string, maskSize int, v4 bool) (*Pool, error) {
	family, bits := "IPv6", 128
	if v4 {
		family, bits = "IPv4", 32
	}
	if maskSize <= 0 || maskSize > bits {
		return nil, fmt.Errorf("%s mask size %d out of range", family, maskSize)
	}
	p := &Pool{family: family, maskSize: maskSize, used: map[netip.Prefix]bool{}}
	for _, s := range cidrs {
		pr, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%s pool %q: %w", family, s, err)
		}
		if pr.Addr().Is4() != v4 {
			return nil, fmt.Errorf("%s pool %q: wrong address family", family, s)
		}
		if pr.Bits() > maskSize {
			return nil, fmt.Errorf("%s pool %q is smaller than the per-node mask /%d", family, s, maskSize)
		}
		p.prefixes = append(p.prefixes, pr.Masked())
	}
	return p, nil
}

// Enabled reports whether the pool has CIDRs.
func (p *Pool) Enabled() bool { return len(p.prefixes) > 0 }

// Family is "IPv4" or "IPv6".
func (p *Pool) Family() string { return p.family }

// Contains reports whether c is one of the pool's subnets.
func (p *Pool) Contains(c netip.Prefix) bool {
	if c.Bits() != p.maskSize {
		return false
	}
	for _, pr := range p.prefixes {
		if pr.Contains(c.Addr()) {
			return true
		}
	}
	return false
}

// Occupy marks c allocated; it reports false when c is not a subnet of
// the pool (a CIDR from elsewhere, left alone).
func (p *Pool) Occupy(c netip.Prefix) bool {
	c = c.Masked()
	if !p.Contains(c) {
		return false
	}
	p.used[c] = true
	return true
}

// Allocate returns the lowest free subnet.
func (p *Pool) Allocate() (netip.Prefix, error) {
	for _, pr := range p.prefixes {
		for c := netip.PrefixFrom(pr.Addr(), p.maskSize); c.IsValid() && pr.Contains(c.Addr()); c = next(c) {
			if !p.used[c] {
				p.used[c] = true
				return c, nil
			}
		}
	}
	return netip.Prefix{}, fmt.Errorf("%s pool %v with /%d per node: %w (%d allocated)", p.family, p.prefixes, p.maskSize, ErrExhausted, len(p.used))
}

// next is the subnet after c of the same size (invalid past the end of
// the address space).
func next(c netip.Prefix) netip.Prefix {
	b := c.Addr().AsSlice()
	// Add 1 at bit position c.Bits()-1 (counting from the top).
	bit := c.Bits() - 1
	i, shift := bit/8, 7-bit%8
	carry := uint16(1) << shift
	for ; i >= 0 && carry != 0; i-- {
		sum := uint16(b[i]) + carry
		b[i] = byte(sum)
		carry = sum >> 8
	}
	if carry != 0 {
		return netip.Prefix{}
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.PrefixFrom(a, c.Bits())
}
