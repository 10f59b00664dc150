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

// TestComputeClusterAndExternalIPs: a cluster IP is announced when it
// lies in the cluster's service CIDRs (refused when they are unknown or it
// does not); an external IP only inside a pool that serves the Service,
// as a load-balancer address (anyone who may create a Service may write
// any external IP); internalTrafficPolicy Local holds back the cluster IP
// and externalTrafficPolicy Local the external one while the node has no
// ready backend.
func TestComputeClusterAndExternalIPs(t *testing.T) {
	expose := map[string]string{"expose": "bgp"}
	entry := exposedLBIP
	entry.Service = &v1alpha1.BGPServiceAdvertisement{Selector: exposedLBIP.Service.Selector,
		Addresses: []string{v1alpha1.BGPServiceAddressClusterIP, v1alpha1.BGPServiceAddressExternalIP}}
	web := service("web", expose, "", "172.30.1.9")
	web.Addresses = []netip.Addr{netip.MustParseAddr("10.96.0.10")}
	web.ExternalIPs = []netip.Addr{netip.MustParseAddr("172.30.1.5"), netip.MustParseAddr("8.8.8.8")}
	local := service("local", expose, "Local")
	local.InternalTrafficPolicy = "Local"
	local.Addresses = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
	local.ExternalIPs = []netip.Addr{netip.MustParseAddr("172.30.1.6")}
	odd := service("odd", expose, "")
	odd.Addresses = []netip.Addr{netip.MustParseAddr("10.97.0.1")}
	in := Input{
		NodeName: "node-1",
		ClusterConfigs: []*v1alpha1.TendrilBGPClusterConfig{clusterConfig("all", nil,
			v1alpha1.BGPPeer{Name: "tor", PeerAddress: "172.30.0.1", PeerASN: 65000})},
		Adverts:    []*v1alpha1.TendrilBGPAdvertisement{advert("svc", "on", entry)},
		Services:   []*loadbalancer.Service{web, local, odd},
		LocalReady: func(loadbalancer.ServiceName) bool { return false },
		Allowed: NewAllowed(nil, pools(t, pool("lb", poolCIDR, nil))).
			WithServiceCIDRs([]netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}),
	}
	d := Compute(in)
	want := []string{"10.96.0.10/32 service default/web", "172.30.1.5/32 service default/web"}
	if got := prefixes(d.Adverts); !slices.Equal(got, want) {
		t.Errorf("adverts %q, want %q (the LB address is not asked for; local's wait for a ready backend)", got, want)
	}
	var refused []string
	for _, r := range d.Refused {
		refused = append(refused, r.String())
	}
	wantRefused := []string{
		"8.8.8.8/32 (service default/web): 8.8.8.8: in no TendrilLoadBalancerIPPool",
		"10.97.0.1/32 (service default/odd): 10.97.0.1: in none of the cluster's service CIDRs",
	}
	slices.Sort(refused)
	slices.Sort(wantRefused)
	if !slices.Equal(refused, wantRefused) {
		t.Errorf("refused %q, want %q", refused, wantRefused)
	}
	for _, a := range d.Adverts {
		if err := in.Allowed.Admit(a.Prefix); err != nil {
			t.Errorf("advert %s not admitted by the speaker's guard: %v", a.Prefix, err)
		}
	}

	// With a ready local backend, local's addresses go too; without any
	// ServiceCIDR known, no cluster IP is announced.
	in.LocalReady = func(loadbalancer.ServiceName) bool { return true }
	in.Allowed = NewAllowed(nil, pools(t, pool("lb", poolCIDR, nil)))
	d = Compute(in)
	want = []string{"172.30.1.5/32 service default/web", "172.30.1.6/32 service default/local"}
	if got := prefixes(d.Adverts); !slices.Equal(got, want) {
		t.Errorf("without service CIDRs: adverts %q, want %q", got, want)
	}
	found := false
	for _, r := range d.Refused {
		found = found || strings.Contains(r.Reason, "service CIDRs are not known")
	}
	if !found {
		t.Errorf("without service CIDRs: refusals %v lack the reason", d.Refused)
	}
}
