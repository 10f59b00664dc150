package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/lab"
)

// hostMetric sums a node's metric samples named name whose labels hold
// every label of match.
func hostMetric(t *testing.T, socket, name string, match map[string]string) float64 {
	t.Helper()
	var ms []struct {
		Name   string
		Labels map[string]string
		Value  float64
	}
	if err := json.Unmarshal([]byte(runTendril(t, "-H", "unix://"+socket, "metrics", "list", "--match", name, "-o", "json")), &ms); err != nil {
		t.Fatal(err)
	}
	var sum float64
next:
	for _, m := range ms {
		if m.Name != name {
			continue
		}
		for k, v := range match {
			if m.Labels[k] != v {
				continue next
			}
		}
		sum += m.Value
	}
	return sum
}

// worldHTTP reports whether the world's client gets an HTTP answer from
// url (the node health responder's /hello).
func worldHTTP(e *env, url string) error {
	out, err := exec.Command("nsenter", "--net="+lab.NetnsPath(e.st.World.Netns), "curl", "-sS", "-m", "2", "-o", "/dev/null", url).CombinedOutput()
	if err != nil {
		return fmt.Errorf("curl %s from the world: %v: %s", url, err, out)
	}
	return nil
}

// TestPrivilegedLabHostFirewall: a host policy (a cluster-wide policy
// with a nodeSelector for node1, allowing only the cluster in) and real
// traffic from the lab's world to a NodePort of node1:
//   - with --enable-host-firewall --host-firewall-audit on every agent the
//     world still reaches the NodePort, and node1 counts each connection
//     under the host policy (tendril_policy_audited_connections_total) and
//     reports AUDIT flows naming it;
//   - with --enable-host-firewall alone the world is blocked from the
//     NodePort (DROPPED flows naming the policy), a pod of the cluster on node2 still reaches it, and the
//     agent's health port stays open to the world (not named by the
//     policy);
//   - with the policy deleted the world reaches the NodePort again.
//
// The agents go back to their command lines at the end.
func TestPrivilegedLabHostFirewall(t *testing.T) {
	e := labUp(t)
	if e.st.World == nil {
		t.Fatal("the lab has no world")
	}
	ctx := context.Background()
	const ns = "e2e-hostfw"
	e.createNamespace(t, ns)
	t.Cleanup(func() { _ = e.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })
	node1, node2 := e.st.Nodes[0], e.st.Nodes[1]
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hfw-backend", Labels: map[string]string{"app": "hfw"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": node1.Name},
			Containers:   []corev1.Container{{Name: "main", Image: "lab", Args: []string{"--report-peer"}}},
		},
	}
	if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitReady(t, ns, "hfw-backend")
	svc, err := e.cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "hfw"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "hfw"},
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)},
				{Name: "iperf", Protocol: corev1.ProtocolTCP, Port: 5201, TargetPort: intstr.FromInt32(5201)},
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodePort := fmt.Sprintf("%s:%d", node1.Address, svc.Spec.Ports[0].NodePort)
	iperfPort := int(svc.Spec.Ports[1].NodePort)
	reaches := func(what string) {
		t.Helper()
		eventually(t, what, func() (bool, error) {
			name, _, _, err := fromWorld(t, nodePort, false)
			return err == nil && name == "hfw-backend", err
		})
	}
	reaches("the world reaching node1's NodePort before any host policy")

	argvs := restartAgents(t, e, nil, "--enable-host-firewall", "--host-firewall-audit")
	t.Cleanup(func() { restartAgents(t, e, argvs) })

	pol := &v1alpha1.TendrilClusterwideNetworkPolicy{}
	doc := fmt.Sprintf(`
metadata: {name: e2e-host-fw}
spec:
  nodeSelector: {matchLabels: {kubernetes.io/hostname: %s}}
  ingress:
  - fromEntities: [cluster]
`, node1.Name)
	if err := yaml.UnmarshalStrict([]byte(doc), pol); err != nil {
		t.Fatal(err)
	}
	tcnp := e.k8.Tendril.TendrilV1alpha1().TendrilClusterwideNetworkPolicies()
	if _, err := tcnp.Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tcnp.Delete(ctx, "e2e-host-fw", metav1.DeleteOptions{}) })

	// Audit mode: node1 audits ingress, the world still gets in, and
	// each connection is counted under the policy.
	eventually(t, "node1 auditing its ingress", func() (bool, error) {
		v := hostMetric(t, node1.Socket, "tendril_host_firewall_audited", map[string]string{"direction": "ingress"})
		return v == 1, fmt.Errorf("tendril_host_firewall_audited{direction=ingress} = %g", v)
	})
	if v := hostMetric(t, node2.Socket, "tendril_host_firewall_audited", map[string]string{"direction": "ingress"}); v != 0 {
		t.Errorf("node2 audits ingress (%g) under a policy selecting node1 only", v)
	}
	audited := func() float64 {
		return hostMetric(t, node1.Socket, "tendril_policy_audited_connections_total", map[string]string{"name": "e2e-host-fw", "kind": "TendrilClusterwideNetworkPolicy"})
	}
	before := audited()
	const conns = 3
	for i := range conns {
		if name, _, _, err := fromWorld(t, nodePort, false); err != nil || name != "hfw-backend" {
			t.Fatalf("audit mode, connection %d from the world: %s, %v", i, name, err)
		}
	}
	eventually(t, "node1 counting the audited connections", func() (bool, error) {
		n := audited()
		return n >= before+conns, fmt.Errorf("audited connections %g, want at least %g", n, before+conns)
	})
	if v := hostMetric(t, node1.Socket, "tendril_host_firewall_enforced", map[string]string{"direction": "ingress"}); v != 0 {
		t.Errorf("audit mode enforces ingress (%g)", v)
	}
	// ... and reported as AUDIT flows naming the policy.
	relay := "unix://" + e.st.RelaySocket()
	hostFlows := func(verdict string) string {
		return runTendril(t, "observe", "--server", relay, "--last", "1000", "--verdict", verdict,
			"--from-ip", e.st.World.ClientIP, "--to-ip", node1.Address)
	}
	eventually(t, "AUDIT flows of the world to node1 naming the host policy", func() (bool, error) {
		out := hostFlows("AUDIT")
		return strings.Contains(out, "e2e-host-fw"), fmt.Errorf("tendril observe --verdict AUDIT:\n%s", out)
	})

	// Enforced: the world is blocked from the NodePort.
	restartAgents(t, e, argvs, "--enable-host-firewall")
	eventually(t, "node1 enforcing its ingress", func() (bool, error) {
		v := hostMetric(t, node1.Socket, "tendril_host_firewall_enforced", map[string]string{"direction": "ingress"})
		return v == 1, fmt.Errorf("tendril_host_firewall_enforced{direction=ingress} = %g", v)
	})
	eventually(t, "the world blocked from node1's NodePort", func() (bool, error) {
		name, _, _, err := fromWorld(t, nodePort, false)
		return err != nil, fmt.Errorf("the world still reaches the NodePort (answered by %q)", name)
	})
	eventually(t, "DROPPED flows of the world to node1 naming the host policy", func() (bool, error) {
		out := hostFlows("DROPPED")
		return strings.Contains(out, "e2e-host-fw"), fmt.Errorf("tendril observe --verdict DROPPED:\n%s", out)
	})
	// A pod of the cluster, on node2, still gets in.
	from := node2Pod(t, e, node2.Name)
	eventually(t, "a cluster pod reaching node1's NodePort", func() (bool, error) {
		return probe(t, from, nodePort, false) == 0, nil
	})
	// The agent's health port is not named by the policy: open.
	if err := worldHTTP(e, fmt.Sprintf("http://%s:4240/hello", node1.Address)); err != nil {
		t.Errorf("health port under host policy: %v", err)
	}

	// An established flow a policy change denies ends: the world is
	// allowed in, streams to the NodePort, and a deny of the world lands
	// mid-stream (--policy-revoke-established=deny, the default).
	setHostPolicy := func(extra string) {
		t.Helper()
		cur, err := tcnp.Get(ctx, "e2e-host-fw", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		next := &v1alpha1.TendrilClusterwideNetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(doc+extra), next); err != nil {
			t.Fatal(err)
		}
		cur.Spec = next.Spec
		if _, err := tcnp.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setHostPolicy("  - fromEntities: [world]\n")
	reaches("the world reaching node1's NodePort once the host policy allows it")
	deny := func() { setHostPolicy("  - fromEntities: [world]\n  ingressDeny:\n  - fromEntities: [world]\n") }
	if err := iperfUntilDenied(t, ns+"/hfw-backend", node1.Address, iperfPort, deny); err != nil {
		t.Errorf("the world's stream to node1 once a host policy denies the world: %v", err)
	}
	eventually(t, "the world blocked from node1's NodePort under the deny", func() (bool, error) {
		name, _, _, err := fromWorld(t, nodePort, false)
		return err != nil, fmt.Errorf("the world still reaches the NodePort (answered by %q)", name)
	})

	// The policy gone: the world gets in again.
	if err := tcnp.Delete(ctx, "e2e-host-fw", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	reaches("the world reaching node1's NodePort once the host policy is gone")
}

// node2Pod is a lab pod on node as a `tendril lab probe` source.
func node2Pod(t *testing.T, e *env, node string) string {
	t.Helper()
	p := e.labPodOn(t, node)
	return p.Namespace + "/" + p.Name
}

// iperfUntilDenied streams TCP from the world to addr:port (iperf3 for
// 20 s, its server in the pod serverRef on 5201) and calls deny 3 s in.
// The stream must have carried data and then stop: iperf3 gives up on
// unacknowledged data after 3 s (--snd-timeout) and reports an error.
// Without revocation the established flow would run its 20 s.
func iperfUntilDenied(t *testing.T, serverRef, addr string, port int, deny func()) error {
	t.Helper()
	server := exec.Command(tendrilBin, "lab", "--name", labName, "exec", serverRef, "--", "iperf3", "-s", "-1", "-p", "5201")
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = server.Process.Kill(); _ = server.Wait() }()
	time.Sleep(500 * time.Millisecond) // iperf3 -s listening
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	client := exec.CommandContext(ctx, tendrilBin, "lab", "--name", labName, "exec", lab.WorldRef, "--",
		"iperf3", "-c", addr, "-p", strconv.Itoa(port), "-t", "20", "-b", "50M", "--snd-timeout", "3000", "-J")
	client.Stdout, client.Stderr = &out, &out
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	deny()
	clientErr := client.Wait()
	var ir struct {
		Intervals []struct {
			Sum struct {
				Bytes int64 `json:"bytes"`
			} `json:"sum"`
		} `json:"intervals"`
		Error string `json:"error"`
	}
	_ = json.Unmarshal(out.Bytes(), &ir)
	var sent int64
	for _, iv := range ir.Intervals {
		sent += iv.Sum.Bytes
	}
	switch {
	case clientErr == nil && ir.Error == "":
		return fmt.Errorf("iperf3 ran its 20 s after the deny (%d intervals, %d bytes): the established flow was not ended", len(ir.Intervals), sent)
	case sent == 0:
		return fmt.Errorf("nothing streamed before the deny (%v / %q): %s", clientErr, ir.Error, out.String())
	}
	t.Logf("stream ended by the deny after %d intervals, %d bytes: %v / %q", len(ir.Intervals), sent, clientErr, ir.Error)
	return nil
}
