package bgp

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

var (
	podCIDR  = netip.MustParsePrefix("10.244.1.0/24")
	poolCIDR = "172.30.1.0/28"
)

func clusterConfig(name string, nodeSel map[string]string, peers ...v1alpha1.BGPPeer) *v1alpha1.TendrilBGPClusterConfig {
	c := &v1alpha1.TendrilBGPClusterConfig{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.BGPClusterConfigSpec{LocalASN: 65001, Peers: peers,
			AdvertisementSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bgp": "on"}}}}
	if nodeSel != nil {
		c.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: nodeSel}
	}
	return c
}

func advert(name string, lbl string, entries ...v1alpha1.BGPAdvertisementEntry) *v1alpha1.TendrilBGPAdvertisement {
	return &v1alpha1.TendrilBGPAdvertisement{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bgp": lbl}},
		Spec: v1alpha1.BGPAdvertisementSpec{Advertisements: entries}}
}

var (
	podCIDRs    = v1alpha1.BGPAdvertisementEntry{AdvertisementType: v1alpha1.BGPAdvertPodCIDR}
	exposedLBIP = v1alpha1.BGPAdvertisementEntry{AdvertisementType: v1alpha1.BGPAdvertService, Service: &v1alpha1.BGPServiceAdvertisement{
		Selector:  &metav1.LabelSelector{MatchLabels: map[string]string{"expose": "bgp"}},
		Addresses: []string{v1alpha1.BGPServiceAddressLoadBalancerIP}}}
)

func service(name string, lbls map[string]string, etp string, addrs ...string) *loadbalancer.Service {
	s := &loadbalancer.Service{Name: loadbalancer.ServiceName{Namespace: "default", Name: name}, Type: "LoadBalancer",
		Labels: lbls, ExternalTrafficPolicy: etp}
	for _, a := range addrs {
		s.LoadBalancerIPs = append(s.LoadBalancerIPs, netip.MustParseAddr(a))
	}
	return s
}

func pools(t *testing.T, ps ...*v1alpha1.TendrilLoadBalancerIPPool) []Pool {
	t.Helper()
	var out []Pool
	for _, p := range ps {
		pp, err := ParsePool(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pp)
	}
	return out
}

func pool(name, cidr string, svcSel map[string]string) *v1alpha1.TendrilLoadBalancerIPPool {
	p := &v1alpha1.TendrilLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{CIDR: cidr}}}}
	if svcSel != nil {
		p.Spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: svcSel}
	}
	return p
}

func prefixes(as []Advert) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Prefix.String()+" "+a.Source)
	}
	return out
}

// TestComputeAnnouncesOnlyWhatTheNodeWasGiven: the node's pod CIDR and a
// pool address of a selected Service are announced; a Service whose
// status carries an address outside every pool (anyone with
// services/status can write one), or in a pool that does not serve it,
// is refused with the reason, and so is a Service the selector does not
// pick silently left out.
func TestComputeAnnouncesOnlyWhatTheNodeWasGiven(t *testing.T) {
	expose := map[string]string{"expose": "bgp"}
	in := Input{
		NodeName: "node-1", NodeLabels: map[string]string{"rack": "a"}, PodCIDRs: []netip.Prefix{podCIDR},
		ClusterConfigs: []*v1alpha1.TendrilBGPClusterConfig{clusterConfig("rack-a", map[string]string{"rack": "a"},
			v1alpha1.BGPPeer{Name: "tor", PeerAddress: "172.30.0.1", PeerASN: 65000})},
		Adverts: []*v1alpha1.TendrilBGPAdvertisement{advert("pods-and-lb", "on", podCIDRs, exposedLBIP), advert("unselected", "off", podCIDRs)},
		Services: []*loadbalancer.Service{
			service("web", expose, "", "172.30.1.2"),
			service("hijack", expose, "", "8.8.8.8"),
			service("network-address", expose, "", "172.30.1.0"),
			service("other-pool", expose, "", "172.30.2.5"),
			service("not-exposed", nil, "", "172.30.1.3"),
		},
		Allowed: NewAllowed([]netip.Prefix{podCIDR}, pools(t, pool("lb", poolCIDR, nil), pool("db-only", "172.30.2.0/28", map[string]string{"app": "db"}))),
	}
	d := Compute(in)
	if d.Config != "rack-a" || d.LocalASN != 65001 || len(d.Peers) != 1 || d.Peers[0].Address != netip.MustParseAddr("172.30.0.1") {
		t.Fatalf("config %q asn %d peers %+v", d.Config, d.LocalASN, d.Peers)
	}
	want := []string{"10.244.1.0/24 pod CIDR", "172.30.1.2/32 service default/web"}
	if got := prefixes(d.Adverts); !slices.Equal(got, want) {
		t.Fatalf("adverts %q, want %q", got, want)
	}
	var refused []string
	for _, r := range d.Refused {
		refused = append(refused, r.String())
	}
	for _, w := range []string{
		"8.8.8.8/32 (service default/hijack): 8.8.8.8: in no TendrilLoadBalancerIPPool",
		"172.30.1.0/32 (service default/network-address): 172.30.1.0: in no TendrilLoadBalancerIPPool",
		"172.30.2.5/32 (service default/other-pool): 172.30.2.5: in a TendrilLoadBalancerIPPool that does not serve the Service",
	} {
		if !slices.Contains(refused, w) {
			t.Errorf("refusals %q lack %q", refused, w)
		}
	}
	if len(refused) != 3 {
		t.Errorf("refusals %q, want 3", refused)
	}
	for _, a := range d.Adverts {
		if err := in.Allowed.Admit(a.Prefix); err != nil {
			t.Errorf("advert %s not admitted: %v", a.Prefix, err)
		}
	}
}

// TestAllowedAdmit is the guard the speaker applies to every path: a
// pod CIDR only exactly (not a supernet, not another node's), pool
// addresses only as host prefixes.
func TestAllowedAdmit(t *testing.T) {
	a := NewAllowed([]netip.Prefix{podCIDR}, pools(t, pool("lb", poolCIDR, nil)))
	for p, ok := range map[string]bool{
		"10.244.1.0/24":   true,
		"10.244.0.0/16":   false,
		"10.244.2.0/24":   false,
		"10.244.1.5/32":   false,
		"172.30.1.1/32":   true,
		"172.30.1.14/32":  true,
		"172.30.1.15/32":  false, // the broadcast address, never handed out
		"172.30.1.0/28":   false,
		"172.30.1.16/32":  false,
		"0.0.0.0/0":       false,
		"fd00::1/128":     false,
		"172.30.1.1/31":   false,
		"192.168.0.1/32":  false,
		"10.244.1.128/25": false,
	} {
		err := a.Admit(netip.MustParsePrefix(p))
		if (err == nil) != ok {
			t.Errorf("Admit(%s) = %v, want admitted %v", p, err, ok)
		}
	}
}

// TestComputeNodeSelectionAndPeers: a node no config selects runs
// nothing; two configs selecting a node: the first by name applies and
// the other is reported; a peer with a bad address or a missing peer
// config is refused with the reason, the others stay; the peer config's
// timers and graceful restart apply.
func TestComputeNodeSelectionAndPeers(t *testing.T) {
	if d := Compute(Input{NodeLabels: map[string]string{"rack": "b"},
		ClusterConfigs: []*v1alpha1.TendrilBGPClusterConfig{clusterConfig("rack-a", map[string]string{"rack": "a"})}}); d.Config != "" || len(d.Peers) != 0 {
		t.Fatalf("unselected node runs %+v", d)
	}
	pc := &v1alpha1.TendrilBGPPeerConfig{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Spec: v1alpha1.BGPPeerConfigSpec{
		Timers:          &v1alpha1.BGPTimers{HoldTimeSeconds: ptr.To[int32](9), KeepAliveTimeSeconds: ptr.To[int32](3)},
		GracefulRestart: &v1alpha1.BGPGracefulRestart{Enabled: true, RestartTimeSeconds: ptr.To[int32](60)}}}
	d := Compute(Input{NodeLabels: map[string]string{"rack": "a"},
		PeerConfigs: []*v1alpha1.TendrilBGPPeerConfig{pc},
		ClusterConfigs: []*v1alpha1.TendrilBGPClusterConfig{
			clusterConfig("b-second", nil),
			clusterConfig("a-first", nil,
				v1alpha1.BGPPeer{Name: "tor", PeerAddress: "172.30.0.1", PeerASN: 65000, PeerConfigRef: "fast"},
				v1alpha1.BGPPeer{Name: "bad", PeerAddress: "not-an-ip", PeerASN: 65000},
				v1alpha1.BGPPeer{Name: "loop", PeerAddress: "127.0.0.1", PeerASN: 65000},
				v1alpha1.BGPPeer{Name: "dangling", PeerAddress: "172.30.0.2", PeerASN: 65000, PeerConfigRef: "missing"},
				v1alpha1.BGPPeer{Name: "dup", PeerAddress: "172.30.0.1", PeerASN: 65000}),
		}})
	if d.Config != "a-first" {
		t.Fatalf("config %q, want a-first", d.Config)
	}
	want := Peer{Name: "tor", Address: netip.MustParseAddr("172.30.0.1"), ASN: 65000, Port: 179, HoldTime: 9, KeepAlive: 3,
		ConnectRetry: DefaultConnectRetry, GracefulRestart: true, RestartTime: 60}
	if len(d.Peers) != 1 || d.Peers[0] != want {
		t.Fatalf("peers %+v, want %+v", d.Peers, want)
	}
	errs := strings.Join(d.Errors, "\n")
	for _, w := range []string{"b-second also selects the node", "peer bad: peerAddress", "peer loop: peerAddress 127.0.0.1: not a unicast",
		"peer dangling: TendrilBGPPeerConfig missing not found", "peer dup: address 172.30.0.1 is peer tor's too"} {
		if !strings.Contains(errs, w) {
			t.Errorf("errors %q lack %q", errs, w)
		}
	}
}

// TestComputeLocalTrafficPolicy: a Service with externalTrafficPolicy
// Local is announced only while this node has a ready backend of it.
func TestComputeLocalTrafficPolicy(t *testing.T) {
	ready := false
	in := Input{PodCIDRs: []netip.Prefix{podCIDR},
		ClusterConfigs: []*v1alpha1.TendrilBGPClusterConfig{clusterConfig("all", nil)},
		Adverts:        []*v1alpha1.TendrilBGPAdvertisement{advert("lb", "on", exposedLBIP)},
		Services:       []*loadbalancer.Service{service("local", map[string]string{"expose": "bgp"}, "Local", "172.30.1.4")},
		LocalReady:     func(loadbalancer.ServiceName) bool { return ready },
		Allowed:        NewAllowed([]netip.Prefix{podCIDR}, pools(t, pool("lb", poolCIDR, nil)))}
	if d := Compute(in); len(d.Adverts) != 0 {
		t.Fatalf("announced %q without a local backend", prefixes(d.Adverts))
	}
	ready = true
	if d := Compute(in); !slices.Equal(prefixes(d.Adverts), []string{"172.30.1.4/32 service default/local"}) {
		t.Fatalf("announced %q with a local backend", prefixes(d.Adverts))
	}
}

// TestComputePeerPassword: a peer config's authSecretRef gives the peer
// the Secret's password; a missing Secret (or key) or a password the
// kernel cannot take leaves the peer out with the reason, never a
// session without the password; the reason names no password.
func TestComputePeerPassword(t *testing.T) {
	pc := func(name, ref string) *v1alpha1.TendrilBGPPeerConfig {
		return &v1alpha1.TendrilBGPPeerConfig{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.BGPPeerConfigSpec{AuthSecretRef: ptr.To(ref)}}
	}
	in := Input{
		NodeName: "node-1",
		ClusterConfigs: []*v1alpha1.TendrilBGPClusterConfig{clusterConfig("all", nil,
			v1alpha1.BGPPeer{Name: "tor-a", PeerAddress: "172.30.0.1", PeerASN: 65000, PeerConfigRef: "with-secret"},
			v1alpha1.BGPPeer{Name: "tor-b", PeerAddress: "172.30.0.2", PeerASN: 65000, PeerConfigRef: "missing-secret"},
			v1alpha1.BGPPeer{Name: "tor-c", PeerAddress: "172.30.0.3", PeerASN: 65000, PeerConfigRef: "long-secret"})},
		PeerConfigs:      []*v1alpha1.TendrilBGPPeerConfig{pc("with-secret", "rack-a"), pc("missing-secret", "nope"), pc("long-secret", "long")},
		Passwords:        map[string]string{"rack-a": "s3cret", "long": strings.Repeat("x", MaxPasswordLen+1)},
		SecretsNamespace: "kube-system",
		Allowed:          NewAllowed(nil, nil),
	}
	d := Compute(in)
	if len(d.Peers) != 1 || d.Peers[0].Name != "tor-a" || d.Peers[0].Password != "s3cret" {
		t.Fatalf("peers %v, want tor-a alone with its password", d.Peers)
	}
	want := []string{
		`peer tor-b: TendrilBGPPeerConfig missing-secret: authSecretRef: Secret kube-system/nope not found or without a "password" key`,
		"peer tor-c: TendrilBGPPeerConfig long-secret: authSecretRef: Secret kube-system/long: the password must be 1-80 bytes",
	}
	if !slices.Equal(d.Errors, want) {
		t.Errorf("errors %q\nwant %q", d.Errors, want)
	}
	if s := fmt.Sprintf("%v %+v", d.Peers, d.Peers[0]); strings.Contains(s, "s3cret") {
		t.Errorf("a peer printed shows its password: %s", s)
	}
}
