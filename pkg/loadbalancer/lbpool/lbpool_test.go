package lbpool

import (
	"net/netip"
	"testing"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

func TestRanges(t *testing.T) {
	tests := []struct {
		name            string
		block           v1alpha1.LoadBalancerIPBlock
		whole, assigned string // "from-to"
	}{
		{"ipv4 cidr", v1alpha1.LoadBalancerIPBlock{CIDR: "192.0.2.240/28"}, "192.0.2.240-192.0.2.255", "192.0.2.241-192.0.2.254"},
		{"unmasked cidr", v1alpha1.LoadBalancerIPBlock{CIDR: "192.0.2.243/28"}, "192.0.2.240-192.0.2.255", "192.0.2.241-192.0.2.254"},
		{"ipv4 /31 keeps both", v1alpha1.LoadBalancerIPBlock{CIDR: "192.0.2.8/31"}, "192.0.2.8-192.0.2.9", "192.0.2.8-192.0.2.9"},
		{"ipv4-mapped cidr", v1alpha1.LoadBalancerIPBlock{CIDR: "::ffff:192.0.2.0/120"}, "192.0.2.0-192.0.2.255", "192.0.2.1-192.0.2.254"},
		{"ipv6 cidr keeps both ends", v1alpha1.LoadBalancerIPBlock{CIDR: "2001:db8::/126"}, "2001:db8::-2001:db8::3", "2001:db8::-2001:db8::3"},
		{"start stop as written", v1alpha1.LoadBalancerIPBlock{Start: "192.0.2.0", Stop: "::ffff:192.0.2.5"}, "192.0.2.0-192.0.2.5", "192.0.2.0-192.0.2.5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := BlockRange(tt.block)
			if err != nil {
				t.Fatal(err)
			}
			a, err := AssignableRange(tt.block)
			if err != nil {
				t.Fatal(err)
			}
			if got := w.From.String() + "-" + w.To.String(); got != tt.whole {
				t.Errorf("whole %s, want %s", got, tt.whole)
			}
			if got := a.From.String() + "-" + a.To.String(); got != tt.assigned {
				t.Errorf("assignable %s, want %s", got, tt.assigned)
			}
		})
	}
}

func TestBadBlocks(t *testing.T) {
	for _, b := range []v1alpha1.LoadBalancerIPBlock{
		{},
		{CIDR: "192.0.2.0/28", Start: "192.0.2.1"},
		{CIDR: "nope"},
		{CIDR: "::ffff:0.0.0.0/64"},
		{Start: "192.0.2.9", Stop: "192.0.2.1"},
		{Start: "192.0.2.1", Stop: "2001:db8::1"},
		{Start: "192.0.2.1"},
	} {
		if r, err := BlockRange(b); err == nil {
			t.Errorf("block %+v read as %v", b, r)
		}
	}
}

func TestContainsReadsMappedAddresses(t *testing.T) {
	r := Range{From: netip.MustParseAddr("192.0.2.1"), To: netip.MustParseAddr("192.0.2.9")}
	for a, want := range map[string]bool{"192.0.2.1": true, "192.0.2.9": true, "::ffff:192.0.2.5": true, "192.0.2.10": false, "2001:db8::1": false} {
		if got := r.Contains(netip.MustParseAddr(a)); got != want {
			t.Errorf("Contains(%s) = %v", a, got)
		}
	}
}
