package e2e_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPrivilegedLabHostPort: a pod's hostPort works without the portmap
// plugin: the world reaches node 1's address on the host port (TCP and
// UDP) and gets the pod, which sees the world client's own address; a pod
// on node 2 reaches it through node 1's address too; node 2's address on
// the same port answers nothing; deleting the pod closes the port.
func TestPrivilegedLabHostPort(t *testing.T) {
	e := labUp(t)
	if e.st.World == nil {
		t.Fatal("the lab has no world")
	}
	ctx := context.Background()
	const ns = "e2e-hostport"
	e.createNamespace(t, ns)
	t.Cleanup(func() { _ = e.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })
	node1, node2 := e.st.Nodes[0], e.st.Nodes[1]
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hp", Labels: map[string]string{"app": "hp"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": node1.Name},
			Containers: []corev1.Container{{Name: "main", Image: "lab", Args: []string{"--report-peer"}, Ports: []corev1.ContainerPort{
				{ContainerPort: 80, HostPort: 8080, Protocol: corev1.ProtocolTCP},
				{ContainerPort: 81, HostPort: 8081, Protocol: corev1.ProtocolUDP},
			}}},
		},
	}
	if _, err := e.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitReady(t, ns, "hp")
	e.createPod(t, ns, "client", node2.Name, map[string]string{"app": "hp-client"})
	client := e.waitReady(t, ns, "client")
	at := func(addr string, port int) string { return net.JoinHostPort(addr, strconv.Itoa(port)) }
	for _, c := range []struct {
		port int
		udp  bool
	}{{8080, false}, {8081, true}} {
		eventually(t, fmt.Sprintf("the world reaches the pod on %s:%d (udp %v)", node1.Address, c.port, c.udp), func() (bool, error) {
			name, src, _, err := fromWorld(t, at(node1.Address, c.port), c.udp)
			if err != nil {
				return false, err
			}
			return name == "hp" && src == e.st.World.ClientIP, fmt.Errorf("answered by %s from %s, want hp seeing %s", name, src, e.st.World.ClientIP)
		})
	}
	eventually(t, "a pod on node 2 reaches the host port of node 1", func() (bool, error) {
		code, out := tendril(t, "probe", ns+"/client", at(node1.Address, 8080), "--timeout", "2s")
		m := peerAnswer.FindStringSubmatch(out)
		if code != 0 || m == nil {
			return false, fmt.Errorf("exit %d: %s", code, out)
		}
		return m[1] == "hp" && m[2] == client.Status.PodIP, fmt.Errorf("answered by %s from %s, want hp seeing %s", m[1], m[2], client.Status.PodIP)
	})
	if _, _, _, err := fromWorld(t, at(node2.Address, 8080), false); err == nil {
		t.Fatal("node 2's address answers node 1's pod's host port")
	}
	zero := int64(0)
	if err := e.cs.CoreV1().Pods(ns).Delete(ctx, "hp", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the host port closes with the pod", func() (bool, error) {
		_, _, _, err := fromWorld(t, at(node1.Address, 8080), false)
		return err != nil, fmt.Errorf("still answered")
	})
}
