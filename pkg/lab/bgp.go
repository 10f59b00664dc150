package lab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/controlplane"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilclient "github.com/tendril-net/tendril/pkg/k8s/client/clientset/versioned"
)

// The lab's BGP (lab up --bgp): a real router, BIRD 2 from Debian, in the
// world namespace at the nodes' gateway address, and every node's agent
// (--enable-bgp-control-plane) peering with it over eBGP. The nodes
// announce their pod CIDRs and the LoadBalancer addresses of the Services
// labelled BGPServiceLabel, which LB-IPAM gives from the pool BGPPoolName,
// off the bridge's subnet: the world reaches them only through the routes
// the router learned (BIRD exports the pool's routes to the world's
// kernel, merging equal paths of several nodes into one ECMP route). The
// pod CIDRs stay in the router's table only: the world keeps having no
// route to the pods (world.go). In a dual-stack lab (--ip-family dual)
// every node has a second session, over IPv6 (BIRD's protocol
// <node>_v6, the router at WorldGateway6), for the IPv6 family: the
// nodes' IPv6 pod CIDRs and the pool's IPv6 addresses (BGPPoolCIDR6),
// exported to the world's kernel as the IPv4 ones are.
const (
	BGPRouterASN = 65000
	BGPNodeASN   = 65001
	// BGPPoolName serves the Services with the label BGPServiceLabel=true.
	BGPPoolName = "lab-bgp"
	BGPPoolCIDR = "192.0.2.240/28"
	// BGPPoolCIDR6 is the pool's IPv6 block in a dual-stack lab
	// (documentation addresses, RFC 3849, apart from the world's
	// 2001:db8:100::/64 ones): a dual-stack Service gets an address of
	// each block, announced over the IPv6 sessions.
	BGPPoolCIDR6    = "2001:db8:240::/124"
	BGPServiceLabel = "tendril.io/lab-bgp"
	// BGPConfigName names the TendrilBGPClusterConfig, the
	// TendrilBGPPeerConfig and the TendrilBGPAdvertisement.
	BGPConfigName = "lab"
	// BGPRestartTime is the graceful restart time the nodes ask for: the
	// router keeps a restarting node's routes that long.
	BGPRestartTime = 120
)

// BGPRouter is the lab's router as lab.json records it.
type BGPRouter struct {
	// Config is bird.conf; Socket birdc's control socket.
	Config string `json:"config"`
	Socket string `json:"socket"`
	ASN    int    `json:"asn"`
}

// Birdc runs birdc against the lab's router and returns its output.
func (r *BGPRouter) Birdc(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "birdc", append([]string{"-s", r.Socket}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("birdc %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

var birdConf = template.Must(template.New("bird.conf").Parse(`# The lab's router (tendril lab up --bgp): written by the lab.
router id {{.RouterID}};
log stderr all;
# Routes' times to the millisecond in show route (bench/bgp reads them).
timeformat route iso long ms;

protocol device {}

# Only the load-balancer pool's routes reach the world's kernel; the pod
# CIDRs stay in the router's table.
protocol kernel {
	ipv4 {
		import none;
		export where net ~ [ {{.Pool}}{32,32} ];
	};
	merge paths on;
}

template bgp tnode {
	local {{.RouterID}} as {{.RouterASN}};
	# The nodes open the sessions (their speakers listen nowhere).
	passive on;
	graceful restart on;
	ipv4 {
		import all;
		export none;
	};
}
{{range .Nodes}}
protocol bgp {{.Name}} from tnode {
	neighbor {{.Address}} as {{$.NodeASN}};
}
{{end}}
{{- if .Router6}}
# Dual stack: the IPv6 family over a session of its own per node, to the
# router's IPv6 address on the bridge.
protocol kernel kernel6 {
	ipv6 {
		import none;
		export where net ~ [ {{.Pool6}}{128,128} ];
	};
	merge paths on;
}

template bgp tnode6 {
	local {{.Router6}} as {{.RouterASN}};
	passive on;
	graceful restart on;
	ipv6 {
		import all;
		export none;
	};
}
{{range .Nodes}}
protocol bgp {{.Name}}_v6 from tnode6 {
	neighbor {{.Address6}} as {{$.NodeASN}};
}
{{end}}
{{- end}}`))

// BGPRouter6 is the router's IPv6 address the nodes peer with in a
// dual-stack lab ("" otherwise): the world's on the bridge.
func BGPRouter6(st *State) string {
	if !st.Dual() {
		return ""
	}
	return WorldGateway6
}

// birdConfig is the router's bird.conf for the lab.
func birdConfig(st *State) ([]byte, error) {
	var conf bytes.Buffer
	if err := birdConf.Execute(&conf, map[string]any{"RouterID": st.World.Gateway, "RouterASN": BGPRouterASN, "NodeASN": BGPNodeASN,
		"Pool": BGPPoolCIDR, "Nodes": st.Nodes, "Router6": BGPRouter6(st), "Pool6": BGPPoolCIDR6}); err != nil {
		return nil, fmt.Errorf("bird.conf: %w", err)
	}
	return conf.Bytes(), nil
}

// startBGPRouter writes bird.conf and runs BIRD in the world namespace
// until `birdc show status` answers.
func startBGPRouter(ctx context.Context, st *State, exited map[string]<-chan error) error {
	if _, err := exec.LookPath("bird"); err != nil {
		return fmt.Errorf("--bgp: bird not found (apt-get install bird2; hack/install-deps.sh): %w", err)
	}
	dir := filepath.Join(st.Dir, "bird")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	r := &BGPRouter{Config: filepath.Join(dir, "bird.conf"), Socket: filepath.Join(dir, "bird.ctl"), ASN: BGPRouterASN}
	conf, err := birdConfig(st)
	if err != nil {
		return err
	}
	if err := os.WriteFile(r.Config, conf, 0o644); err != nil {
		return err
	}
	role := "bird"
	argv := []string{"nsenter", "--net=" + NetnsPath(st.World.Netns), "bird", "-f", "-c", r.Config, "-s", r.Socket,
		"-P", filepath.Join(dir, "bird.pid")}
	cmd, _, err := StartDetached(st.PidDir(), role, filepath.Join(st.LogDir(), role+".log"), argv)
	if err != nil {
		return err
	}
	exited[role] = watchExit(cmd)
	st.BGP = r
	return poll(ctx, "BIRD's control socket", 20*time.Second, st, exited, func() (bool, error) {
		_, err := r.Birdc(ctx, "show", "status")
		return err == nil, err
	})
}

// createBGPObjects creates the pool, the cluster config (every node, the
// router as peer), its peer config (short timers, graceful restart) and
// the advertisement (pod CIDRs; the labelled Services' load-balancer
// addresses).
func createBGPObjects(ctx context.Context, st *State) error {
	rc, err := controlplane.RESTConfig(st.Kubeconfig)
	if err != nil {
		return err
	}
	tc, err := tendrilclient.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("tendril client: %w", err)
	}
	v := tc.TendrilV1alpha1()
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{BGPServiceLabel: "true"}}
	meta := metav1.ObjectMeta{Name: BGPConfigName, Labels: map[string]string{"tendril.io/lab": "bgp"}}
	blocks := []v1alpha1.LoadBalancerIPBlock{{CIDR: BGPPoolCIDR}}
	peers := []v1alpha1.BGPPeer{{Name: "world-router", PeerAddress: st.World.Gateway, PeerASN: BGPRouterASN, PeerConfigRef: BGPConfigName}}
	if r6 := BGPRouter6(st); r6 != "" {
		blocks = append(blocks, v1alpha1.LoadBalancerIPBlock{CIDR: BGPPoolCIDR6})
		peers = append(peers, v1alpha1.BGPPeer{Name: "world-router-v6", PeerAddress: r6, PeerASN: BGPRouterASN, PeerConfigRef: BGPConfigName})
	}
	pool := &v1alpha1.TendrilLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: BGPPoolName},
		Spec: v1alpha1.LoadBalancerIPPoolSpec{Blocks: blocks, ServiceSelector: sel}}
	hold, keepalive, retry, restart := int32(9), int32(3), int32(1), int32(BGPRestartTime)
	pc := &v1alpha1.TendrilBGPPeerConfig{ObjectMeta: meta, Spec: v1alpha1.BGPPeerConfigSpec{
		Timers:          &v1alpha1.BGPTimers{HoldTimeSeconds: &hold, KeepAliveTimeSeconds: &keepalive, ConnectRetryTimeSeconds: &retry},
		GracefulRestart: &v1alpha1.BGPGracefulRestart{Enabled: true, RestartTimeSeconds: &restart}}}
	adv := &v1alpha1.TendrilBGPAdvertisement{ObjectMeta: meta, Spec: v1alpha1.BGPAdvertisementSpec{Advertisements: []v1alpha1.BGPAdvertisementEntry{
		{AdvertisementType: v1alpha1.BGPAdvertPodCIDR},
		{AdvertisementType: v1alpha1.BGPAdvertService, Service: &v1alpha1.BGPServiceAdvertisement{Selector: sel,
			Addresses: []string{v1alpha1.BGPServiceAddressLoadBalancerIP}}},
	}}}
	cc := &v1alpha1.TendrilBGPClusterConfig{ObjectMeta: meta, Spec: v1alpha1.BGPClusterConfigSpec{LocalASN: BGPNodeASN,
		Peers:                 peers,
		AdvertisementSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tendril.io/lab": "bgp"}}}}
	for _, create := range []struct {
		what string
		do   func() error
	}{
		{"TendrilLoadBalancerIPPool " + BGPPoolName, func() error {
			_, err := v.TendrilLoadBalancerIPPools().Create(ctx, pool, metav1.CreateOptions{})
			return err
		}},
		{"TendrilBGPPeerConfig " + BGPConfigName, func() error {
			_, err := v.TendrilBGPPeerConfigs().Create(ctx, pc, metav1.CreateOptions{})
			return err
		}},
		{"TendrilBGPAdvertisement " + BGPConfigName, func() error {
			_, err := v.TendrilBGPAdvertisements().Create(ctx, adv, metav1.CreateOptions{})
			return err
		}},
		{"TendrilBGPClusterConfig " + BGPConfigName, func() error {
			_, err := v.TendrilBGPClusterConfigs().Create(ctx, cc, metav1.CreateOptions{})
			return err
		}},
	} {
		if err := create.do(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s: %w", create.what, err)
		}
	}
	return nil
}
