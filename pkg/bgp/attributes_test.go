package bgp

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// TestParseAttributes: each community form reads to its number, the
// result sorted and unique; a bad value fails the whole with its reason.
func TestParseAttributes(t *testing.T) {
	a, err := ParseAttributes(&v1alpha1.BGPAttributes{LocalPreference: ptr.To[int64](150),
		Communities: &v1alpha1.BGPCommunities{Standard: []string{"65000:100", "4259905636", "65000:100"},
			WellKnown: []string{"no-export"}, Large: []string{"65000:1:2", "4294967295:0:7"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []uint32{65000<<16 | 100, 65001<<16 | 100, 0xFFFFFF01}
	if !slices.Equal(a.Communities, want) || a.LocalPreference != 150 {
		t.Errorf("communities %v local pref %d, want %v and 150", a.Communities, a.LocalPreference, want)
	}
	if got := a.String(); got != "65000:100 65001:100 65535:65281 65000:1:2 4294967295:0:7 local-pref 150" {
		t.Errorf("String %q", got)
	}
	for _, bad := range []struct {
		attrs v1alpha1.BGPAttributes
		want  string
	}{
		{v1alpha1.BGPAttributes{Communities: &v1alpha1.BGPCommunities{Standard: []string{"65536:1"}}}, `standard community "65536:1"`},
		{v1alpha1.BGPAttributes{Communities: &v1alpha1.BGPCommunities{Standard: []string{"4294967296"}}}, `standard community "4294967296"`},
		{v1alpha1.BGPAttributes{Communities: &v1alpha1.BGPCommunities{WellKnown: []string{"no-exprot"}}}, `well-known community "no-exprot"`},
		{v1alpha1.BGPAttributes{Communities: &v1alpha1.BGPCommunities{Large: []string{"1:2"}}}, `large community "1:2"`},
		{v1alpha1.BGPAttributes{Communities: &v1alpha1.BGPCommunities{Large: []string{"1:2:x"}}}, `large community "1:2:x": part 3`},
		{v1alpha1.BGPAttributes{LocalPreference: ptr.To[int64](-1)}, "localPreference -1"},
		{v1alpha1.BGPAttributes{LocalPreference: ptr.To[int64](1 << 32)}, "localPreference 4294967296"},
	} {
		if _, err := ParseAttributes(&bad.attrs); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want an error with %q", bad.attrs, err, bad.want)
		}
	}
}

// TestComputeAttributes: a prefix two entries announce carries both
// entries' communities and the higher local preference; an entry with a
// bad attribute announces nothing (not its prefixes without the
// attributes asked for) and says why.
func TestComputeAttributes(t *testing.T) {
	expose := map[string]string{"expose": "bgp"}
	withAttrs := func(e v1alpha1.BGPAdvertisementEntry, a v1alpha1.BGPAttributes) v1alpha1.BGPAdvertisementEntry {
		e.Attributes = &a
		return e
	}
	in := Input{
		NodeName: "node-1", PodCIDRs: []netip.Prefix{podCIDR},
		ClusterConfigs: []*v1alpha1.TendrilBGPClusterConfig{clusterConfig("all", nil,
			v1alpha1.BGPPeer{Name: "tor", PeerAddress: "172.30.0.1", PeerASN: 65000})},
		Adverts: []*v1alpha1.TendrilBGPAdvertisement{
			advert("a", "on",
				withAttrs(exposedLBIP, v1alpha1.BGPAttributes{LocalPreference: ptr.To[int64](100),
					Communities: &v1alpha1.BGPCommunities{Standard: []string{"65000:1"}}}),
				withAttrs(podCIDRs, v1alpha1.BGPAttributes{Communities: &v1alpha1.BGPCommunities{Standard: []string{"65000:99999"}}})),
			advert("b", "on", withAttrs(exposedLBIP, v1alpha1.BGPAttributes{LocalPreference: ptr.To[int64](300),
				Communities: &v1alpha1.BGPCommunities{Standard: []string{"65000:2"}, WellKnown: []string{"no-export"}}})),
		},
		Services: []*loadbalancer.Service{service("web", expose, "", "172.30.1.2")},
		Allowed:  NewAllowed([]netip.Prefix{podCIDR}, pools(t, pool("lb", poolCIDR, nil))),
	}
	d := Compute(in)
	if got := prefixes(d.Adverts); !slices.Equal(got, []string{"172.30.1.2/32 service default/web"}) {
		t.Fatalf("adverts %q: want the service only (the pod CIDR's entry has a bad community)", got)
	}
	if got := d.Adverts[0].Attributes.String(); got != "65000:1 65000:2 65535:65281 local-pref 300" {
		t.Errorf("merged attributes %q", got)
	}
	if len(d.Errors) != 1 || !strings.Contains(d.Errors[0], `TendrilBGPAdvertisement a: advertisement 1: attributes: standard community "65000:99999"`) {
		t.Errorf("errors %q", d.Errors)
	}
}
