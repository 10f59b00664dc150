package maps

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// SkipKey is a client (its network namespace cookie) of a local redirect
// frontend with skipRedirectFromBackend: one of the policy's own backend
// pods, which the socket hooks do not redirect to itself.
type SkipKey struct {
	NetnsCookie uint64
	Frontend    Frontend
}

// SkipMap is tdr_lb4_skip_v1 and tdr_lb6_skip_v1: SkipKey -> LBSkip*.
type SkipMap struct{ v4, v6 *ebpf.Map }

// SkipMap is the typed skip map.
func (m *LBMaps) SkipMap() SkipMap { return SkipMap{v4: m.Skip4, v6: m.Skip6} }

func (m SkipMap) key(k SkipKey) (*ebpf.Map, any, error) {
	if err := k.Frontend.validate(); err != nil {
		return nil, nil, err
	}
	a := k.Frontend.Addr.Unmap()
	if a.Is4() {
		return m.v4, &bpf.LxcLb4SkipKey{NetnsCookie: k.NetnsCookie, Addr: a.As4(), Port: Htons(k.Frontend.Port), Proto: k.Frontend.Proto}, nil
	}
	return m.v6, &bpf.LxcLb6SkipKey{NetnsCookie: k.NetnsCookie, Addr: a.As16(), Port: Htons(k.Frontend.Port), Proto: k.Frontend.Proto}, nil
}

// Upsert says where client k goes instead of the redirect (LBSkipOriginal
// or LBSkipPass).
func (m SkipMap) Upsert(k SkipKey, mode uint8) error {
	if mode != LBSkipOriginal && mode != LBSkipPass {
		return fmt.Errorf("skip entry %d %s: mode %d is not LB_SKIP_ORIGINAL or LB_SKIP_PASS", k.NetnsCookie, k.Frontend, mode)
	}
	mp, key, err := m.key(k)
	if err != nil {
		return err
	}
	if err := mp.Put(key, mode); err != nil {
		return fmt.Errorf("write skip entry %d %s: %w", k.NetnsCookie, k.Frontend, err)
	}
	return nil
}

// Delete removes client k's entry; a missing one is fine.
func (m SkipMap) Delete(k SkipKey) error {
	mp, key, err := m.key(k)
	if err != nil {
		return err
	}
	if err := ignoreMissing(mp.Delete(key)); err != nil {
		return fmt.Errorf("delete skip entry %d %s: %w", k.NetnsCookie, k.Frontend, err)
	}
	return nil
}

// Iterate calls fn with every entry of both families, until it returns
// false. Maps of a layout without them (nil) hold nothing.
func (m SkipMap) Iterate(fn func(SkipKey, uint8) bool) error {
	if m.v4 == nil || m.v6 == nil {
		return nil
	}
	var k4 bpf.LxcLb4SkipKey
	var mode uint8
	it := m.v4.Iterate()
	for it.Next(&k4, &mode) {
		f := Frontend{Addr: netip.AddrFrom4(k4.Addr), Port: Ntohs(k4.Port), Proto: k4.Proto}
		if !fn(SkipKey{NetnsCookie: k4.NetnsCookie, Frontend: f}, mode) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate IPv4 skip entries: %w", err)
	}
	var k6 bpf.LxcLb6SkipKey
	it = m.v6.Iterate()
	for it.Next(&k6, &mode) {
		f := Frontend{Addr: netip.AddrFrom16(k6.Addr), Port: Ntohs(k6.Port), Proto: k6.Proto}
		if !fn(SkipKey{NetnsCookie: k6.NetnsCookie, Frontend: f}, mode) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate IPv6 skip entries: %w", err)
	}
	return nil
}

// SkipSrcKey is a client of a local redirect frontend with
// skipRedirectFromBackend as the per-packet translation sees it: the
// backend pod's address.
type SkipSrcKey struct {
	Client   netip.Addr
	Frontend Frontend
}

// SkipSrcMap is tdr_lb_skipsrc_v1: SkipSrcKey -> LBSkip*.
type SkipSrcMap struct{ m *ebpf.Map }

// SkipSrcMap is the typed per-packet skip map.
func (m *LBMaps) SkipSrcMap() SkipSrcMap { return SkipSrcMap{m: m.SkipSrc} }

func (m SkipSrcMap) key(k SkipSrcKey) (*bpf.LxcLbSkipsrcKey, error) {
	if err := k.Frontend.validate(); err != nil {
		return nil, err
	}
	c, f := k.Client.Unmap(), k.Frontend.Addr.Unmap()
	if !c.IsValid() || c.Is4() != f.Is4() {
		return nil, fmt.Errorf("skip entry %s %s: client not of the frontend's family", k.Client, k.Frontend)
	}
	out := &bpf.LxcLbSkipsrcKey{Port: Htons(k.Frontend.Port), Proto: k.Frontend.Proto, Family: FamilyV6}
	if f.Is4() {
		a, b := c.As4(), f.As4()
		copy(out.Client[:], a[:])
		copy(out.Frontend[:], b[:])
		out.Family = FamilyV4
	} else {
		out.Client, out.Frontend = c.As16(), f.As16()
	}
	return out, nil
}

// Upsert says where client k goes instead of the redirect.
func (m SkipSrcMap) Upsert(k SkipSrcKey, mode uint8) error {
	if mode != LBSkipOriginal && mode != LBSkipPass {
		return fmt.Errorf("skip entry %s %s: mode %d is not LB_SKIP_ORIGINAL or LB_SKIP_PASS", k.Client, k.Frontend, mode)
	}
	key, err := m.key(k)
	if err != nil {
		return err
	}
	if err := m.m.Put(key, mode); err != nil {
		return fmt.Errorf("write skip entry %s %s: %w", k.Client, k.Frontend, err)
	}
	return nil
}

// Delete removes client k's entry; a missing one is fine.
func (m SkipSrcMap) Delete(k SkipSrcKey) error {
	key, err := m.key(k)
	if err != nil {
		return err
	}
	if err := ignoreMissing(m.m.Delete(key)); err != nil {
		return fmt.Errorf("delete skip entry %s %s: %w", k.Client, k.Frontend, err)
	}
	return nil
}

// Iterate calls fn with every entry until it returns false. A layout
// without the map (nil) holds nothing.
func (m SkipSrcMap) Iterate(fn func(SkipSrcKey, uint8) bool) error {
	if m.m == nil {
		return nil
	}
	var k bpf.LxcLbSkipsrcKey
	var mode uint8
	it := m.m.Iterate()
	for it.Next(&k, &mode) {
		c, f := netip.AddrFrom16(k.Client), netip.AddrFrom16(k.Frontend)
		if k.Family == FamilyV4 {
			c, f = netip.AddrFrom4([4]byte(k.Client[:4])), netip.AddrFrom4([4]byte(k.Frontend[:4]))
		}
		if !fn(SkipSrcKey{Client: c, Frontend: Frontend{Addr: f, Port: Ntohs(k.Port), Proto: k.Proto}}, mode) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate per-packet skip entries: %w", err)
	}
	return nil
}
