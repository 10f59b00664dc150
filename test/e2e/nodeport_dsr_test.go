package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/lab"
)

// datapathCount is a node's datapath counter of packets for a reason
// name in a direction, from its pinned metrics map.
func datapathCount(t *testing.T, n lab.Node, reason, dir string) uint64 {
	t.Helper()
	out, err := exec.Command(tendrilBin, "bpf", "--bpf-root", n.BPFRoot, "metrics", "list", "-o", "json").Output()
	if err != nil {
		t.Fatalf("bpf metrics list on %s: %v", n.Name, err)
	}
	var rows []struct {
		Reason, Direction string
		Packets           uint64
	}
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("bpf metrics list on %s: %v\n%s", n.Name, err, out)
	}
	var sum uint64
	for _, r := range rows {
		if r.Reason == reason && r.Direction == dir {
			sum += r.Packets
		}
	}
	return sum
}

// restartAgents kills every node's agent and starts it again with its
// command line plus extra (nil: as it was); returns the command lines
// the agents had.
func restartAgents(t *testing.T, e *env, argvs map[string][]string, extra ...string) map[string][]string {
	t.Helper()
	old := map[string][]string{}
	for _, n := range e.st.Nodes {
		argv := killAgent(t, e.st, n.Name)
		old[n.Name] = argv
		if a, ok := argvs[n.Name]; ok {
			argv = a
		}
		startAgent(t, e.st, n.Name, append(append([]string(nil), argv...), extra...))
	}
	for _, n := range e.st.Nodes {
		eventually(t, "the restarted agent of "+n.Name, func() (bool, error) {
			o, err := runCLI(tendrilBin, "-H", n.Socket, "status")
			return err == nil, fmt.Errorf("%v: %s", err, o)
		})
	}
	return old
}

const (
	// A DSR forward is counted as any translation from outside: the
	// replies' absence at node 2 (below) is what tells DSR apart.
	reasonDSR           = "Service from outside translated to a backend"
	reasonNodePortReply = "Service reply translated back to an outside client"
)

// TestPrivilegedLabNodePortDSR: with every agent in --bpf-lb-mode=dsr,
// the world reaches a node port of node 2 whose backend is on node 1:
//   - TCP and UDP: the backend sees the client's own address, and the
//     client's connected socket gets the answer from node 2's address and
//     node port (a TCP handshake or a connected UDP socket takes nothing
//     else);
//   - the reply does not pass through node 2: its reply counter stays
//     where it was while node 1 counts a reply per answer, and node 2
//     counts the requests it sent on by DSR;
//   - a pod beside the backend (an in-cluster client) through the same
//     node port goes the SNAT way and is answered;
//   - an iperf3 stream through it keeps going across kill -9 of node 1's
//     agent (the backend's: the option's record and the programs are
//     pinned) and of node 2's.
//
// The agents go back to their command lines at the end.
func TestPrivilegedLabNodePortDSR(t *testing.T) {
	e := labUp(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Fatal("iperf3 is missing (hack/install-deps.sh installs it)")
	}
	ctx := context.Background()
	node1, node2 := e.st.Nodes[0], e.st.Nodes[1]
	client := e.st.World.ClientIP
	argvs := restartAgents(t, e, nil, "--bpf-lb-mode=dsr")
	t.Cleanup(func() { restartAgents(t, e, argvs) })

	const ns = "e2e-npdsr"
	e.createNamespace(t, ns)
	t.Cleanup(func() { _ = e.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dsr-backend", Labels: map[string]string{"app": "npdsr"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": node1.Name},
			Containers:   []corev1.Container{{Name: "main", Image: "lab", Args: []string{"--report-peer"}}},
		},
	}
	if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitReady(t, ns, "dsr-backend")
	svc, err := e.cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dsr"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "npdsr"},
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 81, TargetPort: intstr.FromInt32(81)},
				{Name: "iperf", Protocol: corev1.ProtocolTCP, Port: 5201, TargetPort: intstr.FromInt32(5201)},
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodePort := map[string]int{}
	for _, p := range svc.Spec.Ports {
		nodePort[p.Name] = int(p.NodePort)
	}

	// Once answered (the services programmed), count a round of probes.
	for _, udp := range []bool{false, true} {
		addr := net.JoinHostPort(node2.Address, strconv.Itoa(nodePort[map[bool]string{false: "tcp", true: "udp"}[udp]]))
		eventually(t, "the node port of node 2 to answer the world", func() (bool, error) {
			_, _, _, err := fromWorld(t, addr, udp)
			return err == nil, err
		})
	}
	viaNode2 := datapathCount(t, node2, reasonNodePortReply, "egress")
	repliesNode1 := datapathCount(t, node1, reasonNodePortReply, "egress")
	dsrNode2 := datapathCount(t, node2, reasonDSR, "ingress")
	const probes = 5
	for _, udp := range []bool{false, true} {
		addr := net.JoinHostPort(node2.Address, strconv.Itoa(nodePort[map[bool]string{false: "tcp", true: "udp"}[udp]]))
		for range probes {
			name, src, port, err := fromWorld(t, addr, udp)
			if err != nil {
				t.Fatal(err)
			}
			if name != "dsr-backend" || src != client {
				t.Fatalf("world -> %s udp=%v: answered by %s seeing %s:%d, want dsr-backend seeing the client %s", addr, udp, name, src, port, client)
			}
		}
		t.Logf("world -> %s udp=%v: %d answers from that address, the backend seeing the client %s", addr, udp, probes, client)
	}
	if got := datapathCount(t, node2, reasonNodePortReply, "egress"); got != viaNode2 {
		t.Errorf("node 2 translated %d replies during the DSR probes, want none (they leave node 1 straight to the client)", got-viaNode2)
	}
	// A TCP probe's answer is several packets (SYN-ACK, data, FIN...), a
	// UDP probe's one.
	if got := datapathCount(t, node1, reasonNodePortReply, "egress") - repliesNode1; got < 2*probes {
		t.Errorf("node 1 gave %d replies the frontend's source, want at least %d", got, 2*probes)
	}
	if got := datapathCount(t, node2, reasonDSR, "ingress") - dsrNode2; got < 2*probes {
		t.Errorf("node 2 translated %d packets from the world to node 1's backend, want at least %d", got, 2*probes)
	}

	// A pod beside the backend (node 1) through node 2's node port: an
	// in-cluster client goes the SNAT way (the backend's reply to it
	// would never leave node 1 by its uplink), and is answered.
	beside := e.labPodOn(t, node1.Name)
	for _, udp := range []bool{false, true} {
		addr := net.JoinHostPort(node2.Address, strconv.Itoa(nodePort[map[bool]string{false: "tcp", true: "udp"}[udp]]))
		code, out := tendril(t, "probe", "default/"+beside.Name, addr, "--timeout", "2s", fmt.Sprintf("--udp=%v", udp))
		m := peerAnswer.FindStringSubmatch(out)
		if code != 0 || m == nil || m[1] != "dsr-backend" || m[2] != node2.Address {
			t.Fatalf("pod %s on %s -> %s udp=%v: exit %d: %s (want the backend seeing node 2 %s)", beside.Name, node1.Name, addr, udp, code, out, node2.Address)
		}
	}
	// Those replies came back through node 2; the stream's must not.
	viaNode2 = datapathCount(t, node2, reasonNodePortReply, "egress")

	// A stream across kill -9 of the backend's node's agent, then of the
	// forwarding node's.
	for _, victim := range []lab.Node{node1, node2} {
		r := iperfAcrossAgentKill(t, e, ns+"/dsr-backend", node2.Address, nodePort["iperf"], victim, "DSR")
		t.Logf("iperf3 world -> %s:%d (DSR, backend on %s) across kill -9 of %s's agent: %.1f s, %d MB", node2.Address, nodePort["iperf"],
			node1.Name, victim.Name, r.Seconds, r.Bytes>>20)
		if got := datapathCount(t, node2, reasonNodePortReply, "egress"); got != viaNode2 {
			t.Errorf("node 2 translated %d replies of the stream, want none", got-viaNode2)
		}
	}
}
