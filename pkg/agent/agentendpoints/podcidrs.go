package agentendpoints

import (
	"fmt"
	"hash/fnv"
	"net/netip"
)

// AutoPodCIDRs derives a node's pod CIDRs from its name when nothing else
// chose them (standalone mode without --ipv4-range/--ipv6-range): a stable
// 10.128.0.0/10 /24 and a fd00:7464::/96 /112, so the same node gets the same
// CIDRs across restarts.
func AutoPodCIDRs(nodeName string) (netip.Prefix, netip.Prefix) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(nodeName))
	sum := h.Sum32()
	v4 := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(128 + sum%64), byte(sum >> 8), 0}), 24)
	v6 := netip.MustParsePrefix(fmt.Sprintf("fd00:7464::%x:0/112", sum&0xffff))
	return v4, v6
}

// PodCIDRs resolves the configured pod CIDRs: an explicit range, "auto"
// (derived from nodeName), or empty/"none" to disable the family.
func (c *Config) PodCIDRs(nodeName string) (netip.Prefix, netip.Prefix, error) {
	autoV4, autoV6 := AutoPodCIDRs(nodeName)
	parse := func(flag, v string, auto netip.Prefix, want4 bool) (netip.Prefix, error) {
		switch v {
		case "", "none":
			return netip.Prefix{}, nil
		case "auto":
			return auto, nil
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%s %q: %w", flag, v, err)
		}
		if p.Addr().Is4() != want4 {
			return netip.Prefix{}, fmt.Errorf("%s %q: wrong address family", flag, v)
		}
		return p.Masked(), nil
	}
	v4, err := parse("ipv4-range", c.IPv4Range, autoV4, true)
	if err != nil {
		return v4, v4, err
	}
	v6, err := parse("ipv6-range", c.IPv6Range, autoV6, false)
	if err != nil {
		return v4, v6, err
	}
	if !v4.IsValid() && !v6.IsValid() {
		return v4, v6, fmt.Errorf("ipv4-range and ipv6-range are both disabled: at least one pod CIDR is needed")
	}
	return v4, v6, nil
}
