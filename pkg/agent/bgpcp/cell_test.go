package bgpcp

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/bgp"
	"github.com/tendril-net/tendril/pkg/bgp/speaker"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// TestPassAndStatus: one pass from a snapshot announces the node's pod
// CIDR and the pool address and refuses the address outside the pools;
// the node's status entry is written once, not again while nothing
// changes, and removed when the config stops selecting the node.
func TestPassAndStatus(t *testing.T) {
	sp := speaker.New(slog.New(slog.DiscardHandler), -1)
	t.Cleanup(func() { sp.Stop(context.Background()) })
	podCIDR := netip.MustParsePrefix("10.244.1.0/24")
	cp := &ControlPlane{node: "node-1", log: slog.New(slog.DiscardHandler), speaker: sp, metrics: newPeerMetrics(),
		podCIDRs: func() []netip.Prefix { return []netip.Prefix{podCIDR} }}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"bgp": "on"}}
	cc := &v1alpha1.TendrilBGPClusterConfig{ObjectMeta: metav1.ObjectMeta{Name: "all"},
		Spec: v1alpha1.BGPClusterConfigSpec{LocalASN: 65001, AdvertisementSelector: sel}}
	snap := Snapshot{NodeFound: true, NodeLabels: map[string]string{"rack": "a"}, RouterID: netip.MustParseAddr("172.30.0.11"),
		ClusterConfigs: []*v1alpha1.TendrilBGPClusterConfig{cc},
		Adverts: []*v1alpha1.TendrilBGPAdvertisement{{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"bgp": "on"}},
			Spec: v1alpha1.BGPAdvertisementSpec{Advertisements: []v1alpha1.BGPAdvertisementEntry{
				{AdvertisementType: v1alpha1.BGPAdvertPodCIDR},
				{AdvertisementType: v1alpha1.BGPAdvertService, Service: &v1alpha1.BGPServiceAdvertisement{
					Addresses: []string{v1alpha1.BGPServiceAddressLoadBalancerIP}}}}}}},
		Pools: []*v1alpha1.TendrilLoadBalancerIPPool{{ObjectMeta: metav1.ObjectMeta{Name: "lb"},
			Spec: v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{CIDR: "192.0.2.240/28"}}}}},
	}
	svcs := []*loadbalancer.Service{
		{Name: loadbalancer.ServiceName{Namespace: "default", Name: "web"}, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.241")}},
		{Name: loadbalancer.ServiceName{Namespace: "default", Name: "hijack"}, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.100")}},
	}
	ctx := context.Background()
	p := cp.pass(ctx, snap, svcs, func(loadbalancer.ServiceName) bool { return false })
	if p.Err != "" || p.Desired.Config != "all" || p.Applied.Paths != 2 {
		t.Fatalf("pass %+v", p)
	}
	if got := sp.Announced(); !slices.Equal(got, []netip.Prefix{podCIDR, netip.MustParsePrefix("192.0.2.241/32")}) {
		t.Fatalf("announced %v", got)
	}
	if len(p.Desired.Refused) != 1 || !strings.HasPrefix(p.Desired.Refused[0].String(), "192.0.2.100/32 (service default/hijack)") {
		t.Fatalf("refused %v", p.Desired.Refused)
	}

	var writes []string
	write := func(_ context.Context, config string, st *v1alpha1.BGPNodeStatus) error {
		if st == nil {
			writes = append(writes, config+": removed")
			return nil
		}
		writes = append(writes, config+": "+fmt.Sprintf("%s advertised %d refused ", st.Node, st.Advertised)+strings.Join(st.Refused, ","))
		return nil
	}
	last := map[string]string{}
	cp.writeStatuses(ctx, snap, p, write, last)
	cp.writeStatuses(ctx, snap, p, write, last)
	if len(writes) != 1 || !strings.HasPrefix(writes[0], "all: node-1 advertised 2 refused 192.0.2.100/32 (service default/hijack)") {
		t.Fatalf("status writes %q", writes)
	}

	// The config no longer selects the node: BGP stops, the entry goes.
	cc.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "b"}}
	cc.Status.Nodes = []v1alpha1.BGPNodeStatus{{Node: "node-1"}}
	p = cp.pass(ctx, snap, svcs, nil)
	if p.Desired.Config != "" || len(sp.Announced()) != 0 {
		t.Fatalf("unselected node: pass %+v, announced %v", p, sp.Announced())
	}
	cp.writeStatuses(ctx, snap, p, write, last)
	if len(writes) != 2 || writes[1] != "all: removed" {
		t.Fatalf("status writes %q", writes)
	}
}

// TestStatusSection: the section names the config, the sessions and the
// refusals.
func TestStatusSection(t *testing.T) {
	cp := &ControlPlane{}
	cp.last = Pass{RouterID: netip.MustParseAddr("172.30.0.11"), Applied: speaker.Applied{Paths: 2},
		Desired: bgp.Desired{Config: "all", LocalASN: 65001, Refused: []bgp.Refusal{{Prefix: netip.MustParsePrefix("192.0.2.100/32"), Source: "service default/hijack", Reason: "in no pool"}}},
		Peers:   []speaker.PeerState{{Name: "tor", Address: "172.30.0.1", State: "established"}, {Name: "far", Address: "172.30.0.230", State: "active", Reason: "failed to connect: i/o timeout"}}}
	var lines []string
	for _, l := range cp.StatusSection().Lines {
		lines = append(lines, l.Key+": "+l.Value)
	}
	for _, w := range []string{"Config: all (ASN 65001, router ID 172.30.0.11)", "Peers: 1/2 established", "Announced: 2 prefixes, 1 refused",
		"Peer far: active: failed to connect: i/o timeout", "Refused: 192.0.2.100/32 (service default/hijack): in no pool"} {
		if !slices.Contains(lines, w) {
			t.Errorf("section %q lacks %q", lines, w)
		}
	}
}
