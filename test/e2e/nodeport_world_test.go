package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/lab"
)

// staticLBClass is the loadBalancerClass of Services whose address a test
// sets itself: the lab's tendril-operator assigns none to them.
var staticLBClass = "e2e.tendril.io/static"

// peerAnswer is a --report-peer workload's answer: its name and the
// source it saw.
var peerAnswer = regexp.MustCompile(`answered "([a-z0-9-]+) from ([0-9.]+):([0-9]+)"`)

// worldRoute sends dst from the world through a node until the test ends:
// addresses outside the lab bridge's subnet, which no L2 announcement
// covers (TestPrivilegedLabL2Announcements covers those on it).
func worldRoute(t *testing.T, e *env, dst, via string) {
	t.Helper()
	ns := "--net=" + lab.NetnsPath(e.st.World.Netns)
	if out, err := exec.Command("nsenter", ns, "ip", "route", "replace", dst+"/32", "via", via).CombinedOutput(); err != nil {
		t.Fatalf("world route %s via %s: %v: %s", dst, via, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("nsenter", ns, "ip", "route", "del", dst+"/32").Run() })
}

// fromWorld probes addr from the world client and returns the answer's
// pod name and source address and port, or the probe's error.
func fromWorld(t *testing.T, addr string, udp bool) (name, src string, port int, err error) {
	t.Helper()
	code, out := tendril(t, "probe", lab.WorldRef, addr, "--timeout", "2s", fmt.Sprintf("--udp=%v", udp))
	m := peerAnswer.FindStringSubmatch(out)
	if code != 0 || m == nil {
		return "", "", 0, fmt.Errorf("probe world -> %s udp=%v: exit %d: %s", addr, udp, code, strings.TrimSpace(out))
	}
	port, _ = strconv.Atoi(m[3])
	return m[1], m[2], port, nil
}

// TestPrivilegedLabNodePortFromWorld: clients outside the cluster (the
// lab's world) reach a service through the host device programs:
//   - a node port on each node, TCP and UDP: node 1 holds the backend and
//     delivers with the client's own address; node 2 sends it to node 1
//     with its own address (a masquerade-range port) and the reply comes
//     back to the client from the node port;
//   - an external IP routed to node 2 (remote backend), a load-balancer
//     address (status.loadBalancer.ingress, set here: the Services have a
//     loadBalancerClass the lab's operator leaves alone) routed to node 1;
//   - externalTrafficPolicy Local: node 1 keeps the client's address,
//     node 2 (no local backend) refuses, and the health check node port
//     answers the world 200 on node 1 and 503 on node 2;
//   - loadBalancerSourceRanges: a range holding the world client admits
//     it, one that does not refuses it;
//   - the local backend's NetworkPolicy decides by the client's own
//     address (an ipBlock of the client admits, another refuses);
//   - a pod on node 2 reaches node 1's node port the same way (node 2
//     translates only its own addresses), its address kept.
func TestPrivilegedLabNodePortFromWorld(t *testing.T) {
	e := labUp(t)
	if e.st.World == nil {
		t.Fatal("the lab has no world")
	}
	ctx := context.Background()
	const ns = "e2e-npworld"
	e.createNamespace(t, ns)
	t.Cleanup(func() { _ = e.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "npw-backend", Labels: map[string]string{"app": "npw"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": e.st.Nodes[0].Name},
			Containers:   []corev1.Container{{Name: "main", Image: "lab", Args: []string{"--report-peer"}}},
		},
	}
	if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitReady(t, ns, "npw-backend")
	node1, node2 := e.st.Nodes[0], e.st.Nodes[1]
	client := e.st.World.ClientIP
	const extIP, lbIP, lbLocalIP, lbAllowIP, lbDenyIP = "203.0.113.10", "203.0.113.20", "203.0.113.21", "203.0.113.22", "203.0.113.23"
	worldRoute(t, e, extIP, node2.Address)
	for _, a := range []string{lbIP, lbLocalIP, lbAllowIP, lbDenyIP} {
		worldRoute(t, e, a, node1.Address)
	}
	ports := []corev1.ServicePort{
		{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)},
		{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 81, TargetPort: intstr.FromInt32(81)},
	}
	mk := func(name, lbAddr string, etp corev1.ServiceExternalTrafficPolicy, ranges, ext []string) *corev1.Service {
		t.Helper()
		s, err := e.cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: etp, Selector: map[string]string{"app": "npw"},
				Ports: ports, LoadBalancerSourceRanges: ranges, ExternalIPs: ext, LoadBalancerClass: &staticLBClass},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbAddr}}
		s, err = e.cs.CoreV1().Services(ns).UpdateStatus(ctx, s, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cluster := mk("npw", lbIP, corev1.ServiceExternalTrafficPolicyCluster, nil, []string{extIP})
	local := mk("npw-local", lbLocalIP, corev1.ServiceExternalTrafficPolicyLocal, nil, nil)
	mk("npw-allow", lbAllowIP, corev1.ServiceExternalTrafficPolicyCluster, []string{client + "/32"}, nil)
	mk("npw-deny", lbDenyIP, corev1.ServiceExternalTrafficPolicyCluster, []string{e.st.World.ServerIP + "/32"}, nil)

	// want checks an address answers from the backend with the client's
	// source (keep) or the node's address and a masquerade-range port.
	want := func(what, addr string, udp bool, keep bool, node string) {
		t.Helper()
		eventually(t, what, func() (bool, error) {
			name, src, port, err := fromWorld(t, addr, udp)
			if err != nil {
				return false, err
			}
			if name != "npw-backend" {
				return false, fmt.Errorf("answered by %s", name)
			}
			if keep && src != client {
				return false, fmt.Errorf("backend saw %s:%d, want the client %s", src, port, client)
			}
			if !keep && (src != node || port < 61000 || port > 65535) {
				return false, fmt.Errorf("backend saw %s:%d, want %s with a masquerade-range port", src, port, node)
			}
			t.Logf("%s: world -> %s udp=%v: the backend saw %s:%d", what, addr, udp, src, port)
			return true, nil
		})
	}
	for i, p := range cluster.Spec.Ports {
		udp := i == 1
		want("node port on node 1 (local backend)", net.JoinHostPort(node1.Address, strconv.Itoa(int(p.NodePort))), udp, true, "")
		want("node port on node 2 (remote backend)", net.JoinHostPort(node2.Address, strconv.Itoa(int(p.NodePort))), udp, false, node2.Address)
		want("external IP via node 2", net.JoinHostPort(extIP, strconv.Itoa(int(p.Port))), udp, false, node2.Address)
		want("load-balancer address via node 1", net.JoinHostPort(lbIP, strconv.Itoa(int(p.Port))), udp, true, "")
		want("externalTrafficPolicy Local on node 1", net.JoinHostPort(node1.Address, strconv.Itoa(int(local.Spec.Ports[i].NodePort))), udp, true, "")
		want("load-balancer source range admitting the client", net.JoinHostPort(lbAllowIP, strconv.Itoa(int(p.Port))), udp, true, "")
	}
	// Node 2's NAT table names its node port mappings (client -> remote
	// backend).
	if out, err := exec.Command(tendrilBin, "bpf", "--bpf-root", node2.BPFRoot, "nat", "list").CombinedOutput(); err != nil ||
		!strings.Contains(string(out), client+":") || !strings.Contains(string(out), "service from outside") {
		t.Errorf("bpf nat list on node 2 (%v) shows no service mapping of %s:\n%s", err, client, out)
	}

	// A pod on node 2 to node 1's node port: node 2 translates only its
	// own addresses, so node 1's host program serves the pod like an
	// outside client (the reply's source turned back at node 1).
	other := e.labPodOn(t, node2.Name)
	eventually(t, "a pod on node 2 through node 1's node port", func() (bool, error) {
		for _, udp := range []bool{false, true} {
			np := net.JoinHostPort(node1.Address, strconv.Itoa(int(cluster.Spec.Ports[map[bool]int{false: 0, true: 1}[udp]].NodePort)))
			code, out := tendril(t, "probe", "default/"+other.Name, np, "--timeout", "2s", fmt.Sprintf("--udp=%v", udp))
			m := peerAnswer.FindStringSubmatch(out)
			if code != 0 || m == nil || m[1] != "npw-backend" || m[2] != other.Status.PodIP {
				return false, fmt.Errorf("%s -> %s udp=%v: exit %d: %s (want the backend seeing the pod %s)", other.Name, np, udp, code, strings.TrimSpace(out), other.Status.PodIP)
			}
		}
		return true, nil
	})

	// Refusals: node 2 has no local backend for the Local service; the
	// client is outside the other load balancer's range.
	for _, addr := range []string{
		net.JoinHostPort(node2.Address, strconv.Itoa(int(local.Spec.Ports[0].NodePort))),
		net.JoinHostPort(lbDenyIP, "80"),
	} {
		if _, _, _, err := fromWorld(t, addr, false); err == nil {
			t.Fatalf("world -> %s answered, want refused", addr)
		}
	}
	drops := func(node lab.Node, reason string) {
		t.Helper()
		out, err := exec.Command(tendrilBin, "bpf", "--bpf-root", node.BPFRoot, "metrics", "list").CombinedOutput()
		if err != nil || !strings.Contains(string(out), reason) {
			t.Errorf("%s's datapath counts no %q drop (%v):\n%s", node.Name, reason, err, out)
		}
	}
	drops(node2, "no local backend")
	drops(node1, "source ranges")

	// The local backend's ingress policy sees the client's own address:
	// a NetworkPolicy admitting only the world client's /32 keeps the
	// node port answering through node 1, one admitting only another
	// address refuses it there (node 2's source NAT makes the client
	// node 2, which neither admits).
	np1 := net.JoinHostPort(node1.Address, strconv.Itoa(int(cluster.Spec.Ports[0].NodePort)))
	setPolicy := func(cidr string) {
		t.Helper()
		pol := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "npw-ingress", Namespace: ns},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "npw"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr}}}}},
			},
		}
		cur, err := e.cs.NetworkingV1().NetworkPolicies(ns).Get(ctx, pol.Name, metav1.GetOptions{})
		if err == nil {
			cur.Spec = pol.Spec
			_, err = e.cs.NetworkingV1().NetworkPolicies(ns).Update(ctx, cur, metav1.UpdateOptions{})
		} else {
			_, err = e.cs.NetworkingV1().NetworkPolicies(ns).Create(ctx, pol, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	setPolicy(e.st.World.ServerIP + "/32")
	eventually(t, "the backend's policy to refuse the world client through node 1", func() (bool, error) {
		_, _, _, err := fromWorld(t, np1, false)
		return err != nil, fmt.Errorf("still answered")
	})
	setPolicy(client + "/32")
	want("node port on node 1 with a policy admitting the client's address", np1, false, true, "")
	if err := e.cs.NetworkingV1().NetworkPolicies(ns).Delete(ctx, "npw-ingress", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// The health check node port, from the world.
	hc := local.Spec.HealthCheckNodePort
	for i, wantCode := range []string{"200", "503"} {
		n := e.st.Nodes[i]
		url := "http://" + net.JoinHostPort(n.Address, strconv.Itoa(int(hc))) + "/"
		eventually(t, "health check node port of "+n.Name, func() (bool, error) {
			code, out := tendril(t, "exec", lab.WorldRef, "--", "curl", "-s", "-o", "/dev/null", "--max-time", "2", "-w", "%{http_code}", url)
			return code == 0 && strings.TrimSpace(out) == wantCode, fmt.Errorf("curl %s: exit %d: %q, want %s", url, code, out, wantCode)
		})
	}
}

// TestPrivilegedLabNodePortStreamAcrossAgentKill: the world streams TCP
// (iperf3, 10 s) to a node port of node 2 whose backend is on node 1 —
// translated and source-NATed by node 2's host program, the reply
// translated back there — while one node's agent is killed with SIGKILL,
// stays down a second and starts again; once for node 2 (the translating
// node), once for node 1 (the backend's). The pinned programs and maps
// (service, conntrack, NAT) carry the stream: iperf3 runs its whole time
// without an error.
func TestPrivilegedLabNodePortStreamAcrossAgentKill(t *testing.T) {
	e := labUp(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Fatal("iperf3 is missing (hack/install-deps.sh installs it)")
	}
	ctx := context.Background()
	const ns = "e2e-nprestart"
	e.createNamespace(t, ns)
	t.Cleanup(func() { _ = e.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })
	node1, node2 := e.st.Nodes[0], e.st.Nodes[1]
	e.createPod(t, ns, "backend", node1.Name, map[string]string{"app": "nprestart"})
	e.waitReady(t, ns, "backend")
	svc, err := e.cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "iperf"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "nprestart"},
			Ports: []corev1.ServicePort{
				{Name: "iperf", Protocol: corev1.ProtocolTCP, Port: 5201, TargetPort: intstr.FromInt32(5201)},
				{Name: "probe", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)},
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var iperfPort, probePort int32
	for _, p := range svc.Spec.Ports {
		if p.Name == "iperf" {
			iperfPort = p.NodePort
		} else {
			probePort = p.NodePort
		}
	}
	eventually(t, "the node port of node 2 to answer the world", func() (bool, error) {
		code, out := tendril(t, "probe", lab.WorldRef, net.JoinHostPort(node2.Address, strconv.Itoa(int(probePort))), "--timeout", "1s")
		return code == 0 && strings.Contains(out, `"backend"`), fmt.Errorf("exit %d: %s", code, out)
	})
	for _, victim := range []lab.Node{node2, node1} {
		r := iperfAcrossAgentKill(t, e, ns+"/backend", node2.Address, int(iperfPort), victim, "")
		t.Logf("iperf3 world -> %s:%d (backend on %s) across kill -9 of %s's agent: %.1f s, %d MB, %d retransmits", node2.Address, iperfPort,
			node1.Name, victim.Name, r.Seconds, r.Bytes>>20, r.Retransmits)
	}
}

// iperfSum is the sender's summary of an iperf3 run.
type iperfSum struct {
	Seconds     float64 `json:"seconds"`
	Bytes       int64   `json:"bytes"`
	Retransmits int     `json:"retransmits"`
}

// iperfAcrossAgentKill streams TCP from the world to addr:port for 10 s
// (iperf3, its server in the pod serverRef on port 5201) while victim's
// agent is killed with SIGKILL 2 s in and started again a second later.
// The stream must run its whole time without an error; what qualifies
// the stream in the failures ("" none). Returns the sender's summary.
func iperfAcrossAgentKill(t *testing.T, e *env, serverRef, addr string, port int, victim lab.Node, what string) iperfSum {
	t.Helper()
	server := exec.Command(tendrilBin, "lab", "--name", labName, "exec", serverRef, "--", "iperf3", "-s", "-1", "-p", "5201")
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // iperf3 -s listening
	const seconds = 10
	var out bytes.Buffer
	client := exec.Command(tendrilBin, "lab", "--name", labName, "exec", lab.WorldRef, "--",
		"iperf3", "-c", addr, "-p", strconv.Itoa(port), "-t", strconv.Itoa(seconds), "-b", "100M", "-J")
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
	_ = server.Process.Kill()
	_ = server.Wait()
	var ir struct {
		End struct {
			SumSent iperfSum `json:"sum_sent"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if what != "" {
		what = " (" + what + ")"
	}
	if err := json.Unmarshal(out.Bytes(), &ir); err != nil || clientErr != nil || ir.Error != "" {
		t.Fatalf("iperf3 world -> %s:%d%s across the kill of %s's agent: %v / %v / %q\n%s", addr, port, what, victim.Name, clientErr, err, ir.Error, out.String())
	}
	r := ir.End.SumSent
	if r.Seconds < seconds-0.5 || r.Bytes == 0 {
		t.Errorf("stream%s broken across the kill of %s's agent: ran %.1f s of %d", what, victim.Name, r.Seconds, seconds)
	}
	return r
}

// waitAgentAPI waits until the (restarted) agent of n answers on its API
// socket.
func waitAgentAPI(t *testing.T, n lab.Node) {
	t.Helper()
	eventually(t, "the restarted agent's API", func() (bool, error) {
		out, err := runCLI(tendrilBin, "-H", n.Socket, "status")
		return err == nil, fmt.Errorf("%v: %s", err, out)
	})
}
