package e2e_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/lab"
)

// withRoutingMode is an agent's command line with its --routing-mode
// set to mode.
func withRoutingMode(t *testing.T, argv []string, mode string) []string {
	t.Helper()
	out := slices.Clone(argv)
	i := slices.Index(out, "--routing-mode")
	if i < 0 || i+1 >= len(out) {
		t.Fatalf("no --routing-mode in the agent's command line %q", argv)
	}
	out[i+1] = mode
	return out
}

// TestPrivilegedLabRoutedTopology: a lab whose nodes sit in different
// subnets (--topology routed), the world routing between them but not to
// the pod CIDRs, as cloud VMs behind the provider's router.
//   - The topology: each node's address in its own /24, the other node
//     reached via the node's gateway, not on-link.
//   - Tunnel mode: pods on the two nodes talk TCP across them; a TCP
//     stream between them (iperf3, 10 s) runs its whole time without an
//     error while the client's node's agent, then the server's, is killed
//     with SIGKILL and started again.
//   - Node IDs: node1's agent gives node2 an ID (the stock cilium-dbg
//     nodeid list), the same after node1's agent was killed and started
//     again.
//   - The whole connectivity test (both families) and the x/y/z policy
//     matrix in tunnel mode across the subnets.
//   - Native mode (the agents restarted with --routing-mode native): the
//     route to the other node's pod CIDR via that node cannot be made
//     (its gateway is not on-link: the routes table says so), and a pod's
//     TCP to the pod on the other node gets no answer (it goes to the
//     router, which has no route to the pod CIDRs).
//   - Back in tunnel mode, the pods talk again.
//   - Geneve built in eBPF (the agents restarted with --tunnel-protocol
//     geneve; this kernel has no Geneve module): TCP and UDP over both
//     families, only Geneve on the wire with the client's identity in
//     the VNI, the health endpoints, a policy telling two clients on one
//     node apart.
//
// The lab is dual stack: each node has an IPv6 address in its own /64
// too, routed by the world; the pods talk IPv6 TCP and UDP across the
// subnets through the tunnel (VXLAN over the nodes' IPv4 addresses).
func TestPrivilegedLabRoutedTopology(t *testing.T) {
	labUp(t) // the binaries; the routed lab is this test's own
	name, e := ownLab(t, "rt", "--topology", "routed", "--routing-mode", "tunnel", "--ip-family", "dual")
	ctx := context.Background()
	node1, node2 := e.st.Nodes[0], e.st.Nodes[1]
	if e.st.Topology != lab.TopologyRouted {
		t.Fatalf("lab.json topology %q, want %s", e.st.Topology, lab.TopologyRouted)
	}

	t.Run("nodes in different subnets behind the router", func(t *testing.T) {
		if node1.Address != "172.30.1.11" || node2.Address != "172.30.2.11" {
			t.Fatalf("node addresses %s and %s, want 172.30.1.11 and 172.30.2.11", node1.Address, node2.Address)
		}
		out, err := exec.Command("nsenter", "--net="+lab.NetnsPath(node1.Netns), "ip", "-4", "route", "get", node2.Address).CombinedOutput()
		if err != nil {
			t.Fatalf("ip route get: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "via "+node1.Gateway) {
			t.Fatalf("node1 reaches node2 not via its gateway %s: %s", node1.Gateway, out)
		}
		// The router routes between the nodes: node1 pings node2.
		if out, err := exec.Command("nsenter", "--net="+lab.NetnsPath(node1.Netns), "ping", "-c", "1", "-W", "2", node2.Address).CombinedOutput(); err != nil {
			t.Fatalf("node1 -> node2 through the router: %v\n%s", err, out)
		}
	})

	const ns = "e2e-routed"
	e.createNamespace(t, ns)
	tcp8080 := corev1.ContainerPort{ContainerPort: 8080, Protocol: corev1.ProtocolTCP}
	udp53 := corev1.ContainerPort{ContainerPort: 53, Protocol: corev1.ProtocolUDP}
	e.createPod(t, ns, "server", node2.Name, map[string]string{"app": "server"}, tcp8080, udp53)
	e.createPod(t, ns, "client", node1.Name, map[string]string{"app": "client"})
	server := e.waitReady(t, ns, "server")
	client := e.waitReady(t, ns, "client")
	addr := server.Status.PodIP + ":8080"
	t.Logf("client %s on %s, server %s on %s", client.Status.PodIP, node1.Name, server.Status.PodIP, node2.Name)

	t.Run("tunnel: pod to pod TCP across the subnets", func(t *testing.T) {
		var out string
		eventually(t, "an answer from the server pod", func() (bool, error) {
			var code int
			code, out = labProbe(t, name, ns+"/client", addr, false)
			return code == 0, fmt.Errorf("exit %d", code)
		})
		if !strings.Contains(out, `"server"`) {
			t.Fatalf("the answer is not the server pod's: %s", out)
		}
	})

	t.Run("tunnel: IPv6 pod to pod TCP and UDP across the subnets", func(t *testing.T) {
		if node1.Address6 != "fd00:172:30:1::11" || node2.Address6 != "fd00:172:30:2::11" {
			t.Fatalf("node IPv6 addresses %s and %s, want fd00:172:30:1::11 and fd00:172:30:2::11", node1.Address6, node2.Address6)
		}
		// The router routes IPv6 between the nodes' subnets too.
		if out, err := exec.Command("nsenter", "--net="+lab.NetnsPath(node1.Netns), "ping", "-c", "1", "-W", "2", node2.Address6).CombinedOutput(); err != nil {
			t.Fatalf("node1 -> node2 over IPv6 through the router: %v\n%s", err, out)
		}
		server6 := podIPv6(t, server).String()
		for _, udp := range []bool{false, true} {
			port := "8080"
			if udp {
				port = "53"
			}
			addr6 := net.JoinHostPort(server6, port)
			eventually(t, "an answer from the server pod at "+addr6, func() (bool, error) {
				code, out := labProbe(t, name, ns+"/client", addr6, udp)
				return code == 0 && strings.Contains(out, `"server"`), fmt.Errorf("exit %d: %s", code, out)
			})
		}
	})

	dbg, err := exec.Command("../../hack/cilium-dbg.sh").Output()
	if err != nil {
		t.Fatalf("stock cilium-dbg not built: %v", err)
	}
	nodeIDs := func(t *testing.T, n lab.Node) map[string]int64 {
		t.Helper()
		out, err := exec.Command(strings.TrimSpace(string(dbg)), "-H", "unix://"+n.Socket, "nodeid", "list", "-o", "json").CombinedOutput()
		if err != nil {
			t.Fatalf("cilium-dbg nodeid list on %s: %v\n%s", n.Name, err, out)
		}
		var ids []*models.NodeID
		if err := json.Unmarshal(out, &ids); err != nil {
			t.Fatalf("cilium-dbg nodeid list -o json on %s: %v\n%s", n.Name, err, out)
		}
		m := map[string]int64{}
		for _, id := range ids {
			for _, ip := range id.Ips {
				m[ip] = *id.ID
			}
		}
		return m
	}
	var idsBefore map[string]int64
	t.Run("node IDs", func(t *testing.T) {
		idsBefore = nodeIDs(t, node1)
		// The lab is dual stack: node2's two addresses, one ID.
		if len(idsBefore) != 2 || idsBefore[node2.Address] < 1 || idsBefore[node2.Address6] != idsBefore[node2.Address] {
			t.Fatalf("node1's node IDs %v, want node2's addresses %s and %s with one ID from 1", idsBefore, node2.Address, node2.Address6)
		}
	})

	t.Run("tunnel: a TCP stream across kill -9 of each agent", func(t *testing.T) {
		if _, err := exec.LookPath("iperf3"); err != nil {
			t.Fatal("iperf3 is missing (hack/install-deps.sh installs it)")
		}
		for _, victim := range []lab.Node{node1, node2} {
			r := podStreamAcrossAgentKill(t, e, name, ns+"/server", ns+"/client", server.Status.PodIP, victim)
			t.Logf("iperf3 client -> server across kill -9 of %s's agent: %.1f s, %d MB, %d retransmits", victim.Name, r.Seconds, r.Bytes>>20, r.Retransmits)
		}
		// node1's agent was restarted: node2 keeps its ID.
		if after := nodeIDs(t, node1); idsBefore != nil && after[node2.Address] != idsBefore[node2.Address] {
			t.Errorf("node1's node IDs after its agent's restart %v, before %v", after, idsBefore)
		}
	})

	// The whole connectivity test in tunnel mode across the subnets,
	// both families (the lab is dual stack): pods across nodes,
	// Services, DNS, policy, masquerade, NodePort and the world.
	t.Run("tunnel: the connectivity test across the subnets, dual stack", func(t *testing.T) {
		out, err := exec.Command(tendrilBin, "connectivity", "test", "--lab", name).CombinedOutput()
		t.Logf("tendril connectivity test:\n%s", out)
		if err != nil {
			t.Fatalf("connectivity test in tunnel mode across the subnets: %v", err)
		}
		// 59 IPv4 checks and 9 IPv6 ones, less the L2 announcement's: the
		// world shares no segment with the nodes here.
		m := regexp.MustCompile(`(\d+) checks: (\d+) passed, 0 failed`).FindStringSubmatch(string(out))
		if m == nil || m[1] != m[2] || m[1] != "67" {
			t.Fatalf("no all-passed summary of 67 checks in the output")
		}
		if !strings.Contains(string(out), "share no L2 segment") {
			t.Errorf("the output does not say why the L2 announcement check is left out")
		}
		for _, want := range []string{"pod to pod, other node, TCP", "other client denied, other node", "ClusterIP, other node, UDP",
			"IPv6 pod to pod, other node, UDP", "IPv6 world to NodePort, externalTrafficPolicy Cluster, node 1, TCP: local and remote servers"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("output lacks check %q", want)
			}
		}
	})

	// The upstream netpol suite's x/y/z matrix in tunnel mode across the
	// subnets (IPv4; its IPv6 run is TestPrivilegedLabTunnelVXLAN's).
	t.Run("tunnel: the policy matrix (x, y, z) across the subnets", func(t *testing.T) {
		reachabilityMatrix(t, e, name)
	})

	node2CIDR := ""
	if n, err := e.cs.CoreV1().Nodes().Get(ctx, node2.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else {
		node2CIDR = n.Spec.PodCIDR
	}

	var tunnelArgv map[string][]string
	t.Run("native: no route to the other node's pods, no answer", func(t *testing.T) {
		tunnelArgv = map[string][]string{}
		for _, n := range e.st.Nodes {
			argv := killAgent(t, e.st, n.Name)
			tunnelArgv[n.Name] = argv
			startAgent(t, e.st, n.Name, withRoutingMode(t, argv, "native"))
		}
		// Not waitAgentAPI: `tendril status` exits 1 here, with the
		// failing route as its warning.
		var dump string
		eventually(t, "node1's route to "+node2CIDR+" tried in native mode", func() (bool, error) {
			o, err := runCLI(tendrilBin, "-H", node1.Socket, "statedb", "dump", "routes")
			dump = o
			return err == nil && strings.Contains(o, node2CIDR) && strings.Contains(o, node2.Address) && strings.Contains(o, "network is unreachable"),
				fmt.Errorf("%v: %s", err, o)
		})
		t.Logf("node1's routes table in native mode:\n%s", dump)
		if out, err := runCLI(tendrilBin, "-H", node1.Socket, "status"); err == nil || !strings.Contains(out, "routes failing") {
			t.Errorf("tendril status in native mode across the subnets: %v, want exit 1 with the failing route:\n%s", err, out)
		}
		out, err := exec.Command("nsenter", "--net="+lab.NetnsPath(node1.Netns), "ip", "-4", "route", "show", node2CIDR).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("node1 has a route to %s in native mode (%v): %s", node2CIDR, err, out)
		}
		out, _ = exec.Command("nsenter", "--net="+lab.NetnsPath(node1.Netns), "ip", "-4", "route", "get", server.Status.PodIP).CombinedOutput()
		t.Logf("node1: ip route get %s: %s", server.Status.PodIP, strings.TrimSpace(string(out)))
		for i := 0; i < 3; i++ {
			if code, out := labProbe(t, name, ns+"/client", addr, false); code == 0 {
				t.Fatalf("native routing across the subnets answered: %s", out)
			}
		}
	})

	t.Run("tunnel again: the pods talk", func(t *testing.T) {
		// When the native step did not run (a -run filter), the agents
		// are still in tunnel mode: the pods must talk all the same.
		if tunnelArgv != nil {
			restartAgents(t, e, tunnelArgv)
		}
		eventually(t, "an answer from the server pod", func() (bool, error) {
			code, _ := labProbe(t, name, ns+"/client", addr, false)
			return code == 0, fmt.Errorf("exit %d", code)
		})
	})

	// Geneve built and stripped in eBPF (the kernel has no Geneve
	// module): the agents restarted with --tunnel-protocol geneve, the
	// pods talk across the subnets over both families, the identity rides
	// in the VNI (a policy on the server tells two clients on the same
	// node apart), the health endpoints answer (the host's own packets
	// through the carrier), and the router's port of node2 sees Geneve on
	// UDP 6081 between the node addresses and no VXLAN.
	t.Run("Geneve in eBPF: TCP and UDP over both families, the identity in the VNI, health", func(t *testing.T) {
		e.createPod(t, ns, "other", node1.Name, map[string]string{"app": "other"})
		other := e.waitReady(t, ns, "other")
		clientID := endpointIdentity(t, e, ns, "client")
		restartAgents(t, e, nil, "--tunnel-protocol", "geneve")
		for _, n := range []lab.Node{node1, node2} {
			eventually(t, n.Name+"'s status names the eBPF Geneve carrier", func() (bool, error) {
				out, err := runCLI(tendrilBin, "-H", n.Socket, "status")
				return err == nil && strings.Contains(out, "Geneve built and stripped in eBPF"), fmt.Errorf("%v: %s", err, out)
			})
		}
		server6 := podIPv6(t, server).String()
		eventually(t, "an answer from the server pod through Geneve", func() (bool, error) {
			code, _ := labProbe(t, name, ns+"/client", addr, false)
			return code == 0, fmt.Errorf("exit %d", code)
		})
		cap := startRawCapture(t, e.st.NetNetns, "node2")
		var failed []string
		for _, a := range []string{addr, net.JoinHostPort(server6, "8080")} {
			if code, out := labProbe(t, name, ns+"/client", a, false); code != 0 || !strings.Contains(out, `"server"`) {
				failed = append(failed, fmt.Sprintf("TCP %s: exit %d %s", a, code, out))
			}
		}
		for _, a := range []string{server.Status.PodIP + ":53", net.JoinHostPort(server6, "53")} {
			if code, out := labProbe(t, name, ns+"/client", a, true); code != 0 || !strings.Contains(out, `"server"`) {
				failed = append(failed, fmt.Sprintf("UDP %s: exit %d %s", a, code, out))
			}
		}
		raw, err := cap.stop()
		if err != nil {
			t.Fatal(err)
		}
		if len(failed) > 0 {
			t.Fatalf("client -> server through Geneve:\n%s", strings.Join(failed, "\n"))
		}
		src4, dst4 := netip.MustParseAddr(client.Status.PodIP), netip.MustParseAddr(server.Status.PodIP)
		src6, dst6 := podIPv6(t, client), podIPv6(t, server)
		geneve, vxlan := map[string]int{}, 0
		for _, f := range raw {
			if _, ok := parseVXLAN(f); ok {
				vxlan++
			}
			g, ok := parseGeneve(f)
			if !ok {
				continue
			}
			if (g.src == src4 && g.dst == dst4) || (g.src == src6 && g.dst == dst6) {
				geneve[g.src.String()]++
				if g.vni != clientID {
					t.Errorf("Geneve frame %s -> %s with VNI %d, want the client's identity %d", g.src, g.dst, g.vni, clientID)
				}
			}
		}
		if geneve[src4.String()] == 0 || geneve[src6.String()] == 0 || vxlan != 0 {
			t.Fatalf("at node2's port: Geneve frames client -> server by inner source %v, VXLAN frames %d; want both families in Geneve, no VXLAN", geneve, vxlan)
		}
		t.Logf("Geneve frames client -> server at node2's port: %v, VNI %d", geneve, clientID)

		healthEndpointsReachable(t, node1, node2)

		pol := &v1alpha1.TendrilNetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(genevePolicyYAML), pol); err != nil {
			t.Fatal(err)
		}
		if _, err := e.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		before := datapathCount(t, node2, "Policy denied", "ingress")
		eventually(t, "other -> server:8080 denied by the server's policy", func() (bool, error) {
			c, _ := labProbe(t, name, ns+"/other", addr, false)
			return c == 1, fmt.Errorf("exit %d", c)
		})
		if after := datapathCount(t, node2, "Policy denied", "ingress"); after <= before {
			t.Errorf("node2 counted no ingress policy drop (%d before, %d after): the deny was not the receiving pod's policy", before, after)
		}
		if c, _ := labProbe(t, name, ns+"/client", addr, false); c != 0 {
			t.Errorf("client -> server:8080 through Geneve exit %d, want 0 (allowed by the identity in the VNI)", c)
		}
		t.Logf("other (%s) denied, client allowed through Geneve", other.Status.PodIP)
	})

	// DSR through the eBPF Geneve (the agents restarted once more with
	// --bpf-lb-mode=dsr, Geneve kept): the world's request to node1's
	// node port reaches the backend on node2 inside Geneve with the
	// frontend in a Geneve option (IPv4 and IPv6), and the answer leaves
	// node2 straight to the client with the frontend's address, through
	// the router.
	t.Run("Geneve in eBPF: NodePort by DSR across the subnets, both families", func(t *testing.T) {
		tunnelDSR(t, e, name, ns)
		geneveDSR(t, e, name, ns)
	})
}

// genevePolicyYAML admits the client alone to the routed test's server's
// TCP 8080.
const genevePolicyYAML = `
apiVersion: tendril.io/v1alpha1
kind: TendrilNetworkPolicy
metadata:
  name: allow-client
spec:
  endpointSelector:
    matchLabels: {app: server}
  ingress:
  - fromEndpoints:
    - matchLabels: {app: client}
    toPorts:
    - ports: [{port: "8080", protocol: TCP}]
`

// endpointIdentity is the identity of the pod ns/name's TendrilEndpoint,
// once it has one.
func endpointIdentity(t *testing.T, e *env, ns, name string) uint32 {
	t.Helper()
	var id uint32
	eventually(t, "the identity of "+ns+"/"+name, func() (bool, error) {
		tep, err := e.k8.Tendril.TendrilV1alpha1().TendrilEndpoints(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if tep.Status.Identity == nil || tep.Status.Identity.ID == 0 {
			return false, fmt.Errorf("no identity yet")
		}
		id = uint32(tep.Status.Identity.ID)
		return true, nil
	})
	return id
}

// podStreamAcrossAgentKill streams TCP from the pod clientRef to the
// pod serverRef (serverIP:5201) for 10 s (iperf3) in lab name while
// victim's agent is killed with SIGKILL 2 s in and started again a
// second later; the stream must run its whole time without an error.
func podStreamAcrossAgentKill(t *testing.T, e *env, name, serverRef, clientRef, serverIP string, victim lab.Node) iperfSum {
	t.Helper()
	server := exec.Command(tendrilBin, "lab", "--name", name, "exec", serverRef, "--", "iperf3", "-s", "-1", "-p", "5201")
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = server.Process.Kill(); _ = server.Wait() }()
	// iperf3 -s listening (on a loaded machine it takes more than a
	// moment).
	eventually(t, "iperf3 -s listening in "+serverRef, func() (bool, error) {
		out, err := exec.Command(tendrilBin, "lab", "--name", name, "exec", serverRef, "--", "ss", "-Hltn", "sport = :5201").CombinedOutput()
		return err == nil && strings.TrimSpace(string(out)) != "", fmt.Errorf("%v: %s", err, out)
	})
	const seconds = 10
	var out bytes.Buffer
	client := exec.Command(tendrilBin, "lab", "--name", name, "exec", clientRef, "--",
		"iperf3", "-c", serverIP, "-p", "5201", "-t", strconv.Itoa(seconds), "-b", "100M", "-J")
	client.Stdout, client.Stderr = &out, &out
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	argv := killAgent(t, e.st, victim.Name)
	time.Sleep(time.Second)
	startAgent(t, e.st, victim.Name, argv)
	waitAgentAPI(t, victim)
	clientErr := client.Wait()
	var ir struct {
		End struct {
			SumSent iperfSum `json:"sum_sent"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out.Bytes(), &ir); err != nil || clientErr != nil || ir.Error != "" {
		t.Fatalf("iperf3 %s -> %s across the kill of %s's agent: %v / %v / %q\n%s", clientRef, serverRef, victim.Name, clientErr, err, ir.Error, out.String())
	}
	r := ir.End.SumSent
	if r.Seconds < seconds-0.5 || r.Bytes == 0 {
		t.Errorf("stream broken across the kill of %s's agent: ran %.1f s of %d", victim.Name, r.Seconds, seconds)
	}
	return r
}

// peerAnswerAny is peerAnswer for either family (an IPv6 peer in
// brackets).
var peerAnswerAny = regexp.MustCompile(`answered "([a-z0-9-]+) from \[?([0-9a-f.:]+?)\]?:([0-9]+)"`)

// geneveDSROption reads the DSR option (class 0x014b, type 0x81) of a
// Geneve frame on the underlay: the frontend it carries (invalid when it
// has none), and the inner Ethernet frame.
func geneveDSROption(f []byte) (fe netip.AddrPort, inner []byte, ok bool) {
	g, ok := udpPayloadTo(f, 6081)
	if !ok || len(g) < 8 {
		return fe, nil, false
	}
	hlen := 8 + int(g[0]&0x3f)*4
	if len(g) < hlen {
		return fe, nil, false
	}
	for opts := g[8:hlen]; len(opts) >= 4; {
		l := 4 + int(opts[3]&0x1f)*4
		if l > len(opts) {
			break
		}
		if binary.BigEndian.Uint16(opts) == 0x014b && opts[2] == 0x81 {
			switch l {
			case 12:
				fe = netip.AddrPortFrom(netip.AddrFrom4([4]byte(opts[4:8])), binary.BigEndian.Uint16(opts[8:]))
			case 24:
				fe = netip.AddrPortFrom(netip.AddrFrom16([16]byte(opts[4:20])), binary.BigEndian.Uint16(opts[20:]))
			}
		}
		opts = opts[l:]
	}
	return fe, g[hlen:], true
}

// plainTuple reads the addresses and L4 protocol of an Ethernet frame of
// IPv4 or IPv6 (no extension headers), and for IPv4 its header length.
func plainTuple(f []byte) (src, dst netip.Addr, proto uint8, ihl int, ok bool) {
	if len(f) < 14+40 {
		return src, dst, 0, 0, false
	}
	ip := f[14:]
	switch binary.BigEndian.Uint16(f[12:]) {
	case unix.ETH_P_IP:
		return netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])), ip[9], int(ip[0]&0xf) * 4, true
	case unix.ETH_P_IPV6:
		return netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40])), ip[6], 40, true
	}
	return src, dst, 0, 0, false
}

// geneveDSR is the routed test's DSR step over both families, after
// tunnelDSR (agents in dsr mode, the backend dsr-backend on node2): a
// dual-stack NodePort to that backend, probed from the world at node1's
// IPv4 and IPv6 addresses (TCP and UDP, a connected socket: an answer
// from any other source is not read), while the router's port of node2
// is captured. Each answer comes from the backend, which saw the
// client's own address; node1 translates no reply, node2 gives each its
// frontend. On the wire: the requests to the backend in Geneve, each SYN
// and datagram with the DSR option naming node1's address of its family
// and the node port, no inner packet with an IPv4 option; the answers
// leave node2 as plain packets from node1's address to the client.
func geneveDSR(t *testing.T, e *env, name, ns string) {
	t.Helper()
	ctx := context.Background()
	node1, node2 := e.st.Nodes[0], e.st.Nodes[1]
	backend, err := e.cs.CoreV1().Pods(ns).Get(ctx, "dsr-backend", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	be4, be6 := netip.MustParseAddr(backend.Status.PodIP), podIPv6(t, backend)
	svc, err := e.cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "tundsr-dual"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "tundsr"}, IPFamilyPolicy: &preferDualStack,
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 81, TargetPort: intstr.FromInt32(81)},
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodePort := map[bool]uint16{}
	for _, p := range svc.Spec.Ports {
		nodePort[p.Protocol == corev1.ProtocolUDP] = uint16(p.NodePort)
	}
	type family struct {
		name           string
		frontend       netip.Addr
		client, beAddr netip.Addr
	}
	fams := []family{
		{"IPv4", netip.MustParseAddr(node1.Address), netip.MustParseAddr(e.st.World.ClientIP), be4},
		{"IPv6", netip.MustParseAddr(node1.Address6), netip.MustParseAddr(e.st.World.ClientIP6), be6},
	}
	probe := func(f family, udp bool) error {
		addr := netip.AddrPortFrom(f.frontend, nodePort[udp]).String()
		code, out := labProbe(t, name, lab.WorldRef, addr, udp)
		m := peerAnswerAny.FindStringSubmatch(out)
		if code != 0 || m == nil {
			return fmt.Errorf("world -> %s udp=%v: exit %d: %s", addr, udp, code, strings.TrimSpace(out))
		}
		if m[1] != "dsr-backend" || m[2] != f.client.String() {
			return fmt.Errorf("world -> %s udp=%v: answered by %s seeing %s, want dsr-backend seeing the client %s", addr, udp, m[1], m[2], f.client)
		}
		return nil
	}
	for _, f := range fams {
		for _, udp := range []bool{false, true} {
			eventually(t, f.name+" node port of node1 to answer the world by DSR", func() (bool, error) {
				err := probe(f, udp)
				return err == nil, err
			})
		}
	}
	viaNode1 := datapathCount(t, node1, reasonNodePortReply, "egress")
	repliesNode2 := datapathCount(t, node2, reasonNodePortReply, "egress")
	cap := startRawCapture(t, e.st.NetNetns, "node2")
	const probes = 3
	var failed []string
	for _, f := range fams {
		for _, udp := range []bool{false, true} {
			for range probes {
				if err := probe(f, udp); err != nil {
					failed = append(failed, err.Error())
				}
			}
		}
	}
	raw, err := cap.stop()
	if err != nil {
		t.Fatal(err)
	}
	if len(failed) > 0 {
		t.Fatalf("NodePort by DSR through Geneve:\n%s", strings.Join(failed, "\n"))
	}
	if got := datapathCount(t, node1, reasonNodePortReply, "egress"); got != viaNode1 {
		t.Errorf("node1 translated %d replies, want none (DSR: they leave node2 straight to the client)", got-viaNode1)
	}
	if got := datapathCount(t, node2, reasonNodePortReply, "egress") - repliesNode2; got < 4*probes {
		t.Errorf("node2 gave %d replies the frontend's source, want at least %d", got, 4*probes)
	}
	// What the router's port of node2 carried.
	withOpt := map[string]int{} // "IPv4 TCP": requests whose option names the frontend
	badOpt := []string{}        // options naming anything else
	ipv4Opts := 0               // inner IPv4 requests with an IP option
	answers := map[string]int{} // plain answers node1's address -> the client
	for _, fr := range raw {
		if fe, inner, ok := geneveDSROption(fr); ok {
			src, dst, proto, ihl, ok := plainTuple(inner)
			if !ok {
				continue
			}
			for _, f := range fams {
				if src != f.client || dst != f.beAddr {
					continue
				}
				if f.client.Is4() && ihl != 20 {
					ipv4Opts++
				}
				if !fe.IsValid() {
					continue
				}
				want := netip.AddrPortFrom(f.frontend, nodePort[proto == unix.IPPROTO_UDP])
				key := f.name + map[uint8]string{unix.IPPROTO_TCP: " TCP", unix.IPPROTO_UDP: " UDP"}[proto]
				if fe != want {
					badOpt = append(badOpt, fmt.Sprintf("%s: option names %s, want %s", key, fe, want))
					continue
				}
				withOpt[key]++
			}
			continue
		}
		src, dst, _, _, ok := plainTuple(fr)
		if !ok {
			continue
		}
		for _, f := range fams {
			if src == f.frontend && dst == f.client {
				answers[f.name]++
			}
		}
	}
	t.Logf("at node2's port: requests with the Geneve DSR option %v, answers from node1's address leaving node2 %v, inner IPv4 options %d", withOpt, answers, ipv4Opts)
	if len(badOpt) > 0 {
		t.Errorf("Geneve DSR options with the wrong frontend:\n%s", strings.Join(badOpt, "\n"))
	}
	if ipv4Opts != 0 {
		t.Errorf("%d inner IPv4 requests carried an IP option, want none through Geneve", ipv4Opts)
	}
	for _, k := range []string{"IPv4 TCP", "IPv4 UDP", "IPv6 TCP", "IPv6 UDP"} {
		if withOpt[k] < probes {
			t.Errorf("%s: %d requests with the Geneve DSR option naming node1's node port, want at least %d (a SYN or a datagram each)", k, withOpt[k], probes)
		}
	}
	for _, f := range fams {
		if answers[f.name] < 2*probes {
			t.Errorf("%s: %d answers from %s to the client leaving node2, want at least %d (straight from the backend's node)", f.name, answers[f.name], f.frontend, 2*probes)
		}
	}
}
