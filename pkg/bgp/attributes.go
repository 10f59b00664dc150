package bgp

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// Attributes are the path attributes an announced prefix carries beside
// origin and next hop.
type Attributes struct {
	// Communities are RFC 1997 communities (standard and well-known),
	// sorted and unique.
	Communities []uint32
	// LargeCommunities are RFC 8092's, sorted and unique.
	LargeCommunities []LargeCommunity
	// LocalPreference is LOCAL_PREF (0: none).
	LocalPreference uint32
}

// LargeCommunity is one RFC 8092 community.
type LargeCommunity struct {
	GlobalAdmin, LocalData1, LocalData2 uint32
}

func (l LargeCommunity) String() string {
	return fmt.Sprintf("%d:%d:%d", l.GlobalAdmin, l.LocalData1, l.LocalData2)
}

func compareLarge(a, b LargeCommunity) int {
	return cmp.Or(cmp.Compare(a.GlobalAdmin, b.GlobalAdmin), cmp.Compare(a.LocalData1, b.LocalData1),
		cmp.Compare(a.LocalData2, b.LocalData2))
}

// wellKnownCommunity is the community a BGPCommunities.WellKnown name
// stands for (IANA's registry of well-known communities).
func wellKnownCommunity(name string) (uint32, bool) {
	switch name {
	case "graceful-shutdown":
		return 0xFFFF0000, true
	case "accept-own":
		return 0xFFFF0001, true
	case "llgr-stale":
		return 0xFFFF0006, true
	case "no-llgr":
		return 0xFFFF0007, true
	case "blackhole":
		return 0xFFFF029A, true
	case "no-export":
		return 0xFFFFFF01, true
	case "no-advertise":
		return 0xFFFFFF02, true
	case "no-export-subconfed":
		return 0xFFFFFF03, true
	case "no-peer":
		return 0xFFFFFF04, true
	}
	return 0, false
}

// ParseAttributes checks an advertisement's attributes and returns them;
// nil is no attributes. The first bad value fails the whole (a prefix
// announced without the no-export an operator asked for would leak it).
func ParseAttributes(a *v1alpha1.BGPAttributes) (Attributes, error) {
	var out Attributes
	if a == nil {
		return out, nil
	}
	if lp := a.LocalPreference; lp != nil {
		if *lp < 0 || *lp > 1<<32-1 {
			return Attributes{}, fmt.Errorf("localPreference %d: out of range 0-4294967295", *lp)
		}
		out.LocalPreference = uint32(*lp)
	}
	if c := a.Communities; c != nil {
		for _, s := range c.Standard {
			v, err := parseStandardCommunity(s)
			if err != nil {
				return Attributes{}, err
			}
			out.Communities = append(out.Communities, v)
		}
		for _, s := range c.WellKnown {
			v, ok := wellKnownCommunity(s)
			if !ok {
				return Attributes{}, fmt.Errorf("well-known community %q: unknown name", s)
			}
			out.Communities = append(out.Communities, v)
		}
		for _, s := range c.Large {
			v, err := parseLargeCommunity(s)
			if err != nil {
				return Attributes{}, err
			}
			out.LargeCommunities = append(out.LargeCommunities, v)
		}
	}
	out.normalize()
	return out, nil
}

// parseStandardCommunity reads "ASN:value" (each 16 bits) or a decimal
// 32-bit number.
func parseStandardCommunity(s string) (uint32, error) {
	if hi, lo, ok := strings.Cut(s, ":"); ok {
		h, err1 := strconv.ParseUint(hi, 10, 16)
		l, err2 := strconv.ParseUint(lo, 10, 16)
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("standard community %q: want ASN:value, each 0-65535", s)
		}
		return uint32(h)<<16 | uint32(l), nil
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("standard community %q: want ASN:value or a 32-bit number", s)
	}
	return uint32(v), nil
}

// parseLargeCommunity reads "global:local1:local2", each 32 bits.
func parseLargeCommunity(s string) (LargeCommunity, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return LargeCommunity{}, fmt.Errorf("large community %q: want global:local1:local2", s)
	}
	var v [3]uint32
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return LargeCommunity{}, fmt.Errorf("large community %q: part %d is not a 32-bit number", s, i+1)
		}
		v[i] = uint32(n)
	}
	return LargeCommunity{v[0], v[1], v[2]}, nil
}

// Merge adds b's attributes to a's: both's communities, the higher local
// preference (what a prefix two advertisements announce carries).
func (a Attributes) Merge(b Attributes) Attributes {
	out := Attributes{
		Communities:      append(slices.Clone(a.Communities), b.Communities...),
		LargeCommunities: append(slices.Clone(a.LargeCommunities), b.LargeCommunities...),
		LocalPreference:  max(a.LocalPreference, b.LocalPreference),
	}
	out.normalize()
	return out
}

// Equal: the same attributes (both normalized).
func (a Attributes) Equal(b Attributes) bool {
	return slices.Equal(a.Communities, b.Communities) && slices.Equal(a.LargeCommunities, b.LargeCommunities) &&
		a.LocalPreference == b.LocalPreference
}

func (a *Attributes) normalize() {
	slices.Sort(a.Communities)
	a.Communities = slices.Compact(a.Communities)
	slices.SortFunc(a.LargeCommunities, compareLarge)
	a.LargeCommunities = slices.Compact(a.LargeCommunities)
	if len(a.Communities) == 0 {
		a.Communities = nil
	}
	if len(a.LargeCommunities) == 0 {
		a.LargeCommunities = nil
	}
}

// String is the attributes as `tendril bgp` and the logs show them.
func (a Attributes) String() string {
	var parts []string
	for _, c := range a.Communities {
		parts = append(parts, fmt.Sprintf("%d:%d", c>>16, c&0xffff))
	}
	for _, l := range a.LargeCommunities {
		parts = append(parts, l.String())
	}
	if a.LocalPreference != 0 {
		parts = append(parts, fmt.Sprintf("local-pref %d", a.LocalPreference))
	}
	return strings.Join(parts, " ")
}
