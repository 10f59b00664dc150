package e2e_test

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// peerAnswer6 is peerAnswer for either family (an IPv6 peer in brackets).
var peerAnswer6 = regexp.MustCompile(`answered "([a-z0-9-]+) from \[?([0-9a-f.:]+?)\]?:([0-9]+)"`)

// TestPrivilegedLabNodePortDSRIPv6: DSR over IPv6 (the Destination
// Options extension header, bpf/lib/nodeport_dsr.h) on a dual-stack lab
// of its own whose agents run --bpf-lb-mode=dsr, in native routing and
// through the VXLAN tunnel: the world reaches a node port on node 1's
// IPv6 address whose backend is on node 2, TCP and UDP:
//   - the backend sees the world's own IPv6 address, and the client's
//     connected socket gets the answer from the node port's address (a
//     TCP handshake or a connected UDP socket takes nothing else);
//   - the reply does not pass through node 1: its reply counter stays
//     where it was while node 2 counts a reply per answer, and node 1
//     counts the requests it sent on.
func TestPrivilegedLabNodePortDSRIPv6(t *testing.T) {
	testutil.Privileged(t)
	for _, m := range []struct {
		name, suffix string
		extra        []string
	}{
		{"native routing", "d6", nil},
		{"VXLAN", "d6v", []string{"--routing-mode", "tunnel"}},
	} {
		t.Run(m.name, func(t *testing.T) {
			args := append([]string{"--ip-family", "dual", "--agent-arg=--bpf-lb-mode=dsr"}, m.extra...)
			name, e := ownLab(t, m.suffix, args...)
			checkDSR6(t, name, e)
		})
	}
}

// checkDSR6 is TestPrivilegedLabNodePortDSRIPv6 on the lab name.
func checkDSR6(t *testing.T, name string, e *env) {
	ctx := context.Background()
	node1, node2 := e.st.Nodes[0], e.st.Nodes[1]
	if node1.Address6 == "" || e.st.World.ClientIP6 == "" {
		t.Fatalf("lab %s is not dual stack (node address %q, world client %q)", name, node1.Address6, e.st.World.ClientIP6)
	}
	const ns = "e2e-npdsr6"
	e.createNamespace(t, ns)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dsr6-backend", Labels: map[string]string{"app": "npdsr6"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": node2.Name},
			Containers:   []corev1.Container{{Name: "main", Image: "lab", Args: []string{"--report-peer"}}},
		},
	}
	if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitReady(t, ns, "dsr6-backend")
	svc, err := e.cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dsr6"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "npdsr6"}, IPFamilyPolicy: &preferDualStack,
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 81, TargetPort: intstr.FromInt32(81)},
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodePort := map[bool]int{}
	for _, p := range svc.Spec.Ports {
		nodePort[p.Protocol == corev1.ProtocolUDP] = int(p.NodePort)
	}
	probe := func(addr string, udp bool) (string, string, error) {
		out, err := runCLI(tendrilBin, "lab", "--name", name, "probe", "world", addr, "--timeout", "2s", fmt.Sprintf("--udp=%v", udp))
		m := peerAnswer6.FindStringSubmatch(out)
		if err != nil || m == nil {
			return "", "", fmt.Errorf("probe world -> %s udp=%v: %v: %s", addr, udp, err, strings.TrimSpace(out))
		}
		return m[1], m[2], nil
	}
	for _, udp := range []bool{false, true} {
		addr := net.JoinHostPort(node1.Address6, strconv.Itoa(nodePort[udp]))
		eventually(t, "the IPv6 node port of node 1 to answer the world", func() (bool, error) {
			_, _, err := probe(addr, udp)
			return err == nil, err
		})
	}
	viaNode1 := datapathCount(t, node1, reasonNodePortReply, "egress")
	repliesNode2 := datapathCount(t, node2, reasonNodePortReply, "egress")
	dsrNode1 := datapathCount(t, node1, reasonDSR, "ingress")
	const probes = 5
	for _, udp := range []bool{false, true} {
		addr := net.JoinHostPort(node1.Address6, strconv.Itoa(nodePort[udp]))
		for range probes {
			who, src, err := probe(addr, udp)
			if err != nil {
				t.Fatal(err)
			}
			if who != "dsr6-backend" || src != e.st.World.ClientIP6 {
				t.Fatalf("world -> %s udp=%v: answered by %s seeing %s, want dsr6-backend seeing the client %s", addr, udp, who, src, e.st.World.ClientIP6)
			}
		}
		t.Logf("world -> %s udp=%v: %d answers from that address, the backend seeing the client %s", addr, udp, probes, e.st.World.ClientIP6)
	}
	if got := datapathCount(t, node1, reasonNodePortReply, "egress"); got != viaNode1 {
		t.Errorf("node 1 translated %d replies during the DSR probes, want none (they leave node 2 straight to the client)", got-viaNode1)
	}
	if got := datapathCount(t, node2, reasonNodePortReply, "egress") - repliesNode2; got < 2*probes {
		t.Errorf("node 2 gave %d replies the frontend's source, want at least %d", got, 2*probes)
	}
	if got := datapathCount(t, node1, reasonDSR, "ingress") - dsrNode1; got < 2*probes {
		t.Errorf("node 1 translated %d packets from the world to node 2's backend, want at least %d", got, 2*probes)
	}
}
