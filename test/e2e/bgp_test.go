package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/cilium/api/v1/models"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// birdRoute is the router's own view of prefix (`birdc show route
// <prefix>`); "" when it has none.
func birdRoute(t *testing.T, e *env, prefix string) string {
	t.Helper()
	out, err := e.st.BGP.Birdc(context.Background(), "show", "route", "all", prefix)
	if strings.Contains(out, "Network not found") {
		return "" // birdc exits 1 then
	}
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, prefix) {
		return ""
	}
	return out
}

// viaAll reports whether route names every address as a next hop.
func viaAll(route string, addrs ...string) error {
	for _, a := range addrs {
		if !strings.Contains(route, "via "+a+" ") {
			return fmt.Errorf("route has no next hop %s:\n%s", a, route)
		}
	}
	return nil
}

// TestPrivilegedLabBGP: the lab's router (BIRD, in the world) learns
// from every node's speaker what the node was given, and nothing else:
//   - each node's pod CIDR, with the node as next hop;
//   - a LoadBalancer address LB-IPAM gave from the BGP pool, from every
//     node (externalTrafficPolicy Cluster: an ECMP route), and the world
//     reaches the service through that route (not on-link);
//   - a Service whose status carries an address outside every pool
//     (written here, as anyone with services/status could) is refused by
//     every node, says so in the nodes' status of the cluster config,
//     and the router never has it;
//   - `tendril bgp peers` on a node shows the session established, and
//     `tendril status` its section;
//   - a peer added at an address no one answers: every node's status
//     entry says why its session is down, `tendril bgp peers` lists it,
//     the router's session stays up;
//   - a node's agent killed (SIGKILL): the router keeps its path through
//     graceful restart while the session is down, the world's probes all
//     answered, and the restarted agent's session comes back;
//   - the same agent stopped cleanly (SIGTERM): no Cease, so the router
//     keeps its path as stale until the agent is back;
//   - externalTrafficPolicy Local: only the node with the ready backend
//     announces; the backend deleted, the route is withdrawn;
//   - deleting the Service withdraws its route from the router and the
//     world.
func TestPrivilegedLabBGP(t *testing.T) {
	e := labUp(t)
	if e.st.BGP == nil || e.st.World == nil {
		t.Fatal("the lab runs no BGP router (lab up --bgp)")
	}
	ctx := context.Background()
	const ns = "e2e-bgp"
	e.createNamespace(t, ns)
	t.Cleanup(func() { _ = e.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })
	var nodeAddrs []string
	for _, n := range e.st.Nodes {
		nodeAddrs = append(nodeAddrs, n.Address)
	}

	// Pod CIDRs, each from its own node.
	for _, n := range e.st.Nodes {
		node, err := e.cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(node.Spec.PodCIDRs) == 0 {
			t.Fatalf("node %s has no pod CIDR", n.Name)
		}
		for _, cidr := range node.Spec.PodCIDRs {
			eventually(t, fmt.Sprintf("the router to learn %s's pod CIDR %s", n.Name, cidr), func() (bool, error) {
				r := birdRoute(t, e, cidr)
				if err := viaAll(r, n.Address); err != nil {
					return false, err
				}
				for _, other := range nodeAddrs {
					if other != n.Address && strings.Contains(r, "via "+other+" ") {
						return false, fmt.Errorf("pod CIDR %s of %s also via %s:\n%s", cidr, n.Name, other, r)
					}
				}
				return true, nil
			})
		}
	}

	// A LoadBalancer Service from the BGP pool, backend on node 1.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bgp-backend", Labels: map[string]string{"app": "bgp"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": e.st.Nodes[0].Name},
			Containers:   []corev1.Container{{Name: "main", Image: "lab", Args: []string{"--report-peer"}}},
		},
	}
	if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitReady(t, ns, "bgp-backend")
	const addr = "192.0.2.241"
	ports := []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "bgp", Labels: map[string]string{lab.BGPServiceLabel: "true"},
			Annotations: map[string]string{"lbipam.tendril.io/ips": addr}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "bgp"}, Ports: ports},
	}
	if _, err := e.cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "LB-IPAM to give "+addr, func() (bool, error) {
		s, err := e.cs.CoreV1().Services(ns).Get(ctx, "bgp", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return len(s.Status.LoadBalancer.Ingress) == 1 && s.Status.LoadBalancer.Ingress[0].IP == addr, fmt.Errorf("ingress %v", s.Status.LoadBalancer.Ingress)
	})
	eventually(t, "the router to learn "+addr+" from every node", func() (bool, error) {
		return true, viaAll(birdRoute(t, e, addr+"/32"), nodeAddrs...)
	})
	world := "--net=" + lab.NetnsPath(e.st.World.Netns)
	eventually(t, "the world's kernel to route "+addr+" to the nodes", func() (bool, error) {
		out, err := exec.Command("nsenter", world, "ip", "route", "show", addr).CombinedOutput()
		if err != nil {
			return false, fmt.Errorf("%v: %s", err, out)
		}
		for _, a := range nodeAddrs {
			if !strings.Contains(string(out), "via "+a) {
				return false, fmt.Errorf("world route %q lacks next hop %s", out, a)
			}
		}
		return true, nil
	})
	eventually(t, "the world to reach the service at "+addr, func() (bool, error) {
		name, _, _, err := fromWorld(t, net.JoinHostPort(addr, "80"), false)
		if err != nil {
			return false, err
		}
		return name == "bgp-backend", fmt.Errorf("answered by %q", name)
	})

	// An address outside every pool in a Service's status: refused.
	const outside = "192.0.2.100"
	hijack := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "bgp-hijack", Labels: map[string]string{lab.BGPServiceLabel: "true"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "bgp"}, Ports: ports,
			LoadBalancerClass: ptr.To("example.com/other")},
	}
	created, err := e.cs.CoreV1().Services(ns).Create(ctx, hijack, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: outside}}
	if _, err := e.cs.CoreV1().Services(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every node to report "+outside+" refused", func() (bool, error) {
		cc, err := e.k8.Tendril.TendrilV1alpha1().TendrilBGPClusterConfigs().Get(ctx, lab.BGPConfigName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		refused := 0
		for _, n := range cc.Status.Nodes {
			for _, r := range n.Refused {
				if strings.HasPrefix(r, outside+"/32 (service "+ns+"/bgp-hijack)") && strings.Contains(r, "in no TendrilLoadBalancerIPPool") {
					refused++
				}
			}
		}
		return refused == len(e.st.Nodes), fmt.Errorf("status %+v", cc.Status.Nodes)
	})
	if r := birdRoute(t, e, outside+"/32"); r != "" {
		t.Fatalf("the router learned %s:\n%s", outside, r)
	}

	// The CLI on node 1: the session with the router is up.
	out := runTendril(t, "-H", "unix://"+e.st.Nodes[0].Socket, "bgp", "peers", "-o", "json")
	var peers []*models.BgpPeer
	if err := json.Unmarshal([]byte(out), &peers); err != nil {
		t.Fatalf("bgp peers: %v: %s", err, out)
	}
	if len(peers) != 1 || peers[0].PeerAddress != e.st.World.Gateway || peers[0].SessionState != "established" ||
		peers[0].PeerAsn != lab.BGPRouterASN || peers[0].GracefulRestart == nil || !peers[0].GracefulRestart.Enabled {
		t.Fatalf("bgp peers: %s", out)
	}
	t.Logf("tendril bgp routes on %s:\n%s", e.st.Nodes[0].Name, runTendril(t, "-H", "unix://"+e.st.Nodes[0].Socket, "bgp", "routes"))
	// The stock cilium-dbg reads the same API: its peers and its routes
	// (which decodes each path's NLRI and attributes from their wire
	// format).
	dbg, err := exec.Command("../../hack/cilium-dbg.sh").Output()
	testutil.Require(t, err == nil, fmt.Sprintf("stock cilium-dbg not built: %v", err))
	for _, args := range [][]string{{"bgp", "peers"}, {"bgp", "routes", "available", "ipv4", "unicast"}} {
		out, err := exec.Command(strings.TrimSpace(string(dbg)), append([]string{"-H", "unix://" + e.st.Nodes[0].Socket}, args...)...).CombinedOutput()
		t.Logf("cilium-dbg %s on %s:\n%s", strings.Join(args, " "), e.st.Nodes[0].Name, out)
		if err != nil {
			t.Fatalf("cilium-dbg %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		for _, want := range map[string][]string{"peers": {e.st.World.Gateway, "established"}, "routes": {addr + "/32", "10.244."}}[args[1]] {
			if !strings.Contains(string(out), want) {
				t.Fatalf("cilium-dbg %s lacks %q:\n%s", strings.Join(args, " "), want, out)
			}
		}
	}
	if st := runTendril(t, "-H", "unix://"+e.st.Nodes[0].Socket, "status"); !strings.Contains(st, "BGP control plane") ||
		!strings.Contains(st, "1/1 established") {
		t.Fatalf("tendril status lacks the BGP section with the session:\n%s", st)
	}

	// Communities on the Service entry of the lab's advertisement: the
	// router's route carries them, from both nodes; taken off again, the
	// route has none.
	setServiceAttrs := func(a *v1alpha1.BGPAttributes) {
		t.Helper()
		adv, err := e.k8.Tendril.TendrilV1alpha1().TendrilBGPAdvertisements().Get(ctx, "lab", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range adv.Spec.Advertisements {
			if adv.Spec.Advertisements[i].AdvertisementType == v1alpha1.BGPAdvertService {
				adv.Spec.Advertisements[i].Attributes = a
			}
		}
		if _, err := e.k8.Tendril.TendrilV1alpha1().TendrilBGPAdvertisements().Update(ctx, adv, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setServiceAttrs(&v1alpha1.BGPAttributes{Communities: &v1alpha1.BGPCommunities{Standard: []string{"65001:100"}, Large: []string{"65001:7:8"}}})
	eventually(t, "the router's route of "+addr+" to carry the communities", func() (bool, error) {
		r := birdRoute(t, e, addr+"/32")
		ok := strings.Count(r, "BGP.community: (65001,100)") == len(nodeAddrs) && strings.Count(r, "BGP.large_community: (65001, 7, 8)") == len(nodeAddrs)
		return ok, fmt.Errorf("want both communities on each of %d paths:\n%s", len(nodeAddrs), r)
	})
	setServiceAttrs(nil)
	eventually(t, "the router's route of "+addr+" without communities", func() (bool, error) {
		r := birdRoute(t, e, addr+"/32")
		return !strings.Contains(r, "community") && viaAll(r, nodeAddrs...) == nil, fmt.Errorf("%s", r)
	})

	// Cluster IPs asked for too: the Service's cluster IP, inside the API
	// server's default ServiceCIDR, reaches the router from both nodes,
	// and goes when the kind is taken off again.
	setServiceKinds := func(kinds ...string) {
		t.Helper()
		adv, err := e.k8.Tendril.TendrilV1alpha1().TendrilBGPAdvertisements().Get(ctx, "lab", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range adv.Spec.Advertisements {
			if adv.Spec.Advertisements[i].Service != nil {
				adv.Spec.Advertisements[i].Service.Addresses = kinds
			}
		}
		if _, err := e.k8.Tendril.TendrilV1alpha1().TendrilBGPAdvertisements().Update(ctx, adv, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	created, err = e.cs.CoreV1().Services(ns).Get(ctx, "bgp", metav1.GetOptions{})
	if err != nil || created.Spec.ClusterIP == "" {
		t.Fatalf("the Service's cluster IP: %v", err)
	}
	clusterIP := created.Spec.ClusterIP + "/32"
	setServiceKinds(v1alpha1.BGPServiceAddressLoadBalancerIP, v1alpha1.BGPServiceAddressClusterIP)
	eventually(t, "the router to learn the cluster IP "+clusterIP+" from both nodes", func() (bool, error) {
		r := birdRoute(t, e, clusterIP)
		return viaAll(r, nodeAddrs...) == nil, fmt.Errorf("%s", r)
	})
	setServiceKinds(v1alpha1.BGPServiceAddressLoadBalancerIP)
	eventually(t, "the router to drop the cluster IP "+clusterIP, func() (bool, error) {
		r := birdRoute(t, e, clusterIP)
		return r == "", fmt.Errorf("still there:\n%s", r)
	})

	// A peer no one answers at: the nodes say why in their status and in
	// `tendril bgp peers`; the other session stays up.
	const nowhere = "172.30.0.230"
	ccs := e.k8.Tendril.TendrilV1alpha1().TendrilBGPClusterConfigs()
	// The nodes write the cluster config's status while the test changes its
	// spec, so every write retries on a conflict with a fresh read.
	updatePeers := func(change func([]v1alpha1.BGPPeer) []v1alpha1.BGPPeer) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cc, err := ccs.Get(ctx, lab.BGPConfigName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cc.Spec.Peers = change(cc.Spec.Peers)
			_, err = ccs.Update(ctx, cc, metav1.UpdateOptions{})
			return err
		})
	}
	var peersBefore []v1alpha1.BGPPeer
	if err := updatePeers(func(p []v1alpha1.BGPPeer) []v1alpha1.BGPPeer {
		peersBefore = p
		return append(append([]v1alpha1.BGPPeer(nil), p...), v1alpha1.BGPPeer{Name: "nowhere", PeerAddress: nowhere, PeerASN: lab.BGPRouterASN, PeerConfigRef: lab.BGPConfigName})
	}); err != nil {
		t.Fatalf("add the unreachable peer: %v", err)
	}
	restorePeers := func() {
		if err := updatePeers(func([]v1alpha1.BGPPeer) []v1alpha1.BGPPeer { return peersBefore }); err != nil {
			t.Errorf("restore the cluster config's peers: %v", err)
		}
	}
	eventually(t, "every node to report why the peer "+nowhere+" is down", func() (bool, error) {
		cc, err := ccs.Get(ctx, lab.BGPConfigName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		down := 0
		for _, n := range cc.Status.Nodes {
			for _, p := range n.Peers {
				if p.Name == "nowhere" && p.State != "established" && strings.Contains(p.Reason, "failed to connect") {
					down++
				}
			}
		}
		return down == len(e.st.Nodes), fmt.Errorf("status %+v", cc.Status.Nodes)
	})
	sessions := map[string]string{} // peer address → session state
	out = runTendril(t, "-H", "unix://"+e.st.Nodes[0].Socket, "bgp", "peers")
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 4 {
			sessions[f[2]] = f[3]
		}
	}
	if sessions[e.st.World.Gateway+":179"] != "established" || sessions[nowhere+":179"] == "" || sessions[nowhere+":179"] == "established" {
		t.Fatalf("bgp peers with the unreachable peer:\n%s", out)
	}
	restorePeers()

	// Graceful restart: node 2's agent killed (SIGKILL: no NOTIFICATION),
	// the router keeps node 2's path while the session is down, and the
	// world's traffic keeps flowing (the datapath forwards without its
	// agent); the restarted agent's session comes back.
	victim := e.st.Nodes[1]
	argv := killAgent(t, e.st, victim.Name)
	eventually(t, "the router to see "+victim.Name+"'s session drop", func() (bool, error) {
		out, err := e.st.BGP.Birdc(ctx, "show", "protocols", victim.Name)
		return err == nil && !strings.Contains(out, "Established"), fmt.Errorf("%v: %s", err, out)
	})
	if err := viaAll(birdRoute(t, e, addr+"/32"), nodeAddrs...); err != nil {
		t.Fatalf("graceful restart: %v", err)
	}
	for i := range 20 {
		if name, _, _, err := fromWorld(t, net.JoinHostPort(addr, "80"), false); err != nil || name != "bgp-backend" {
			t.Fatalf("probe %d from the world with %s's agent down: %q, %v", i, victim.Name, name, err)
		}
	}
	if err := viaAll(birdRoute(t, e, addr+"/32"), nodeAddrs...); err != nil {
		t.Fatalf("graceful restart, after the probes: %v", err)
	}
	startAgent(t, e.st, victim.Name, argv)
	waitAgentAPI(t, victim)
	eventually(t, victim.Name+"'s session back", func() (bool, error) {
		out, err := e.st.BGP.Birdc(ctx, "show", "protocols", victim.Name)
		return err == nil && strings.Contains(out, "Established"), fmt.Errorf("%v: %s", err, out)
	})
	eventually(t, "the route via both nodes, not stale", func() (bool, error) {
		r := birdRoute(t, e, addr+"/32")
		if strings.Contains(r, "stale") {
			return false, fmt.Errorf("stale:\n%s", r)
		}
		return true, viaAll(r, nodeAddrs...)
	})

	// A clean stop (SIGTERM, as a rolling upgrade sends): the session
	// ends without a Cease, so the router keeps the node's routes as
	// stale until the agent is back, as after the kill -9.
	argv = signalAgent(t, e.st, victim.Name, syscall.SIGTERM, "stop")
	eventually(t, "the router to see "+victim.Name+"'s session end after SIGTERM", func() (bool, error) {
		out, err := e.st.BGP.Birdc(ctx, "show", "protocols", victim.Name)
		return err == nil && !strings.Contains(out, "Established"), fmt.Errorf("%v: %s", err, out)
	})
	if r := birdRoute(t, e, addr+"/32"); viaAll(r, nodeAddrs...) != nil {
		t.Fatalf("after SIGTERM of %s's agent the router dropped its route (a Cease flushes graceful restart):\n%s", victim.Name, r)
	}
	startAgent(t, e.st, victim.Name, argv)
	waitAgentAPI(t, victim)
	eventually(t, victim.Name+"'s session back after SIGTERM", func() (bool, error) {
		out, err := e.st.BGP.Birdc(ctx, "show", "protocols", victim.Name)
		return err == nil && strings.Contains(out, "Established"), fmt.Errorf("%v: %s", err, out)
	})
	eventually(t, "the route via both nodes, not stale, after SIGTERM", func() (bool, error) {
		r := birdRoute(t, e, addr+"/32")
		if strings.Contains(r, "stale") {
			return false, fmt.Errorf("stale:\n%s", r)
		}
		return true, viaAll(r, nodeAddrs...)
	})

	// externalTrafficPolicy Local: announced by the node with the ready
	// backend only, withdrawn when it goes.
	const localAddr = "192.0.2.242"
	local := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "bgp-local", Labels: map[string]string{lab.BGPServiceLabel: "true"},
			Annotations: map[string]string{"lbipam.tendril.io/ips": localAddr}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "bgp"}, Ports: ports,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal},
	}
	if _, err := e.cs.CoreV1().Services(ns).Create(ctx, local, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the router to learn "+localAddr+" from node 1 only", func() (bool, error) {
		r := birdRoute(t, e, localAddr+"/32")
		if strings.Contains(r, "via "+victim.Address+" ") {
			return false, fmt.Errorf("also via %s (no local backend):\n%s", victim.Address, r)
		}
		return true, viaAll(r, e.st.Nodes[0].Address)
	})
	if err := e.cs.CoreV1().Pods(ns).Delete(ctx, "bgp-backend", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the router to withdraw "+localAddr+" with its only backend", func() (bool, error) {
		r := birdRoute(t, e, localAddr+"/32")
		return r == "", fmt.Errorf("route still there:\n%s", r)
	})

	// Deleting the Service withdraws its address.
	if err := e.cs.CoreV1().Services(ns).Delete(ctx, "bgp", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the router to withdraw "+addr, func() (bool, error) {
		r := birdRoute(t, e, addr+"/32")
		return r == "", fmt.Errorf("route still there:\n%s", r)
	})
	eventually(t, "the world's kernel to drop "+addr, func() (bool, error) {
		out, err := exec.Command("nsenter", world, "ip", "route", "show", addr).CombinedOutput()
		return err == nil && strings.TrimSpace(string(out)) == "", fmt.Errorf("%v: %q", err, out)
	})
}

// TestPrivilegedLabBGPDualStack: a dual-stack lab with --bgp. Every
// node has a second session with the router, over IPv6 (BIRD's
// <node>_v6, to lab.BGPRouter6), which carries the IPv6 family:
//   - each node's IPv6 pod CIDR reaches the router with the node's IPv6
//     address as next hop;
//   - a dual-stack LoadBalancer Service gets an address of each of the
//     BGP pool's blocks (lab.BGPPoolCIDR, lab.BGPPoolCIDR6); the IPv6 one
//     is in the router's table from every node and in the world's kernel
//     as an ECMP route;
//   - the world reaches the service at its IPv6 address through it.
func TestPrivilegedLabBGPDualStack(t *testing.T) {
	testutil.Privileged(t)
	testutil.Require(t, labErr == nil, "no binaries for the lab")
	name, e := ownLab(t, "bgd", "--operators", "1", "--bgp", "--ip-family", "dual")
	if e.st.BGP == nil || !e.st.Dual() {
		t.Fatal("the lab runs no BGP router, or is not dual stack")
	}
	ctx := context.Background()
	var nodeAddrs6 []string
	for _, n := range e.st.Nodes {
		nodeAddrs6 = append(nodeAddrs6, n.Address6)
	}
	for _, n := range e.st.Nodes {
		proto := n.Name + "_v6"
		eventually(t, "the router's session "+proto+" to be established", func() (bool, error) {
			out, err := e.st.BGP.Birdc(ctx, "show", "protocols", proto)
			return err == nil && strings.Contains(out, "Established"), fmt.Errorf("%v: %s", err, out)
		})
		node, err := e.cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cidr := range node.Spec.PodCIDRs {
			if !strings.Contains(cidr, ":") {
				continue
			}
			eventually(t, fmt.Sprintf("the router to learn %s's IPv6 pod CIDR %s", n.Name, cidr), func() (bool, error) {
				return true, viaAll(birdRoute(t, e, cidr), n.Address6)
			})
		}
	}

	const ns = "e2e-bgp6"
	e.createNamespace(t, ns)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bgp6-backend", Labels: map[string]string{"app": "bgp6"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": e.st.Nodes[0].Name},
			Containers:   []corev1.Container{{Name: "main", Image: "lab", Args: []string{"--report-peer"}}},
		},
	}
	if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitReady(t, ns, "bgp6-backend")
	const addr4, addr6 = "192.0.2.242", "2001:db8:240::2"
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "bgp6", Labels: map[string]string{lab.BGPServiceLabel: "true"},
			Annotations: map[string]string{"lbipam.tendril.io/ips": addr4 + "," + addr6}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "bgp6"},
			IPFamilyPolicy: &policy, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}}},
	}
	if _, err := e.cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "LB-IPAM to give "+addr4+" and "+addr6, func() (bool, error) {
		s, err := e.cs.CoreV1().Services(ns).Get(ctx, "bgp6", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var got []string
		for _, in := range s.Status.LoadBalancer.Ingress {
			got = append(got, in.IP)
		}
		return strings.Join(got, ",") == addr4+","+addr6, fmt.Errorf("ingress %v", got)
	})
	eventually(t, "the router to learn "+addr6+" from every node", func() (bool, error) {
		return true, viaAll(birdRoute(t, e, addr6+"/128"), nodeAddrs6...)
	})
	world := "--net=" + lab.NetnsPath(e.st.World.Netns)
	eventually(t, "the world's kernel to route "+addr6+" to the nodes", func() (bool, error) {
		out, err := exec.Command("nsenter", world, "ip", "-6", "route", "show", addr6).CombinedOutput()
		if err != nil {
			return false, fmt.Errorf("%v: %s", err, out)
		}
		for _, a := range nodeAddrs6 {
			if !strings.Contains(string(out), "via "+a) {
				return false, fmt.Errorf("world route %q lacks next hop %s", out, a)
			}
		}
		return true, nil
	})
	answered := regexp.MustCompile(`answered "bgp6-backend from `)
	eventually(t, "the world to reach the service at "+addr6, func() (bool, error) {
		code, out := labProbe(t, name, lab.WorldRef, net.JoinHostPort(addr6, "80"), false)
		return code == 0 && answered.MatchString(out), fmt.Errorf("exit %d: %s", code, out)
	})
	// The IPv4 address still goes over the IPv4 sessions.
	var nodeAddrs []string
	for _, n := range e.st.Nodes {
		nodeAddrs = append(nodeAddrs, n.Address)
	}
	eventually(t, "the router to learn "+addr4+" from every node", func() (bool, error) {
		return true, viaAll(birdRoute(t, e, addr4+"/32"), nodeAddrs...)
	})
}
