package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestPrivilegedLabHealthCheckNodePort: a LoadBalancer Service (the API
// server gives a health check node port to those only) with
// externalTrafficPolicy Local and its one backend on node 1:
// node 1's agent answers the health check node port with 200 and one local
// endpoint, node 2's with 503 and none (kube-proxy's format, read with
// curl from a pod); when the backend moves to node 2 the answers swap;
// `tendril service list` shows the node port frontends with their type.
func TestPrivilegedLabHealthCheckNodePort(t *testing.T) {
	e := labUp(t)
	ctx := context.Background()
	const ns = "e2e-hcnp"
	e.createNamespace(t, ns)
	e.createPod(t, ns, "backend", "node1", map[string]string{"app": "hc-backend"})
	e.createPod(t, ns, "client", "node2", map[string]string{"app": "hc-client"})
	e.waitReady(t, ns, "backend")
	e.waitReady(t, ns, "client")
	svc, err := e.cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "hc"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Selector: map[string]string{"app": "hc-backend"},
			Ports:    []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hc := svc.Spec.HealthCheckNodePort
	if hc == 0 {
		t.Fatal("the API server gave no health check node port")
	}
	type answer struct {
		code  int
		local int
	}
	ask := func(node int) (answer, error) {
		url := "http://" + net.JoinHostPort(e.st.Nodes[node].Address, strconv.Itoa(int(hc))) + "/"
		code, out := tendril(t, "exec", ns+"/client", "--", "curl", "-sS", "--max-time", "2", "-w", "\n%{http_code}", url)
		if code != 0 {
			return answer{}, fmt.Errorf("curl %s: exit %d: %s", url, code, out)
		}
		out = strings.TrimSpace(out)
		i := strings.LastIndexByte(out, '\n')
		if i < 0 {
			return answer{}, fmt.Errorf("curl %s: no status line: %q", url, out)
		}
		body, status := out[:i], strings.TrimSpace(out[i+1:])
		var r struct {
			Service             struct{ Namespace, Name string }
			LocalEndpoints      int  `json:"localEndpoints"`
			ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
		}
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			return answer{}, fmt.Errorf("%s: %v: %q", url, err, out)
		}
		if r.Service.Namespace != ns || r.Service.Name != "hc" || !r.ServiceProxyHealthy {
			return answer{}, fmt.Errorf("%s: answer %+v names another service", url, r)
		}
		c, _ := strconv.Atoi(status)
		return answer{c, r.LocalEndpoints}, nil
	}
	expect := func(what string, n1, n2 answer) {
		t.Helper()
		eventually(t, what, func() (bool, error) {
			a1, err := ask(0)
			if err != nil {
				return false, err
			}
			a2, err := ask(1)
			if err != nil {
				return false, err
			}
			return a1 == n1 && a2 == n2, fmt.Errorf("node1 %+v node2 %+v, want %+v and %+v", a1, a2, n1, n2)
		})
	}
	expect("node 1 healthy, node 2 not", answer{200, 1}, answer{503, 0})

	// The node port frontends carry their type in the service list.
	out, err := runCLI(tendrilBin, "-H", e.st.Nodes[0].Socket, "service", "list")
	if err != nil {
		t.Fatal(err)
	}
	np := fmt.Sprintf("%s:%d/TCP", e.st.Nodes[0].Address, svc.Spec.Ports[0].NodePort)
	found := false
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, np) && strings.Contains(line, "NodePort (external: Local)") && strings.Contains(line, ns+"/hc") {
			found = true
		}
	}
	if !found {
		t.Errorf("service list lacks the node port frontend %s (NodePort, external Local):\n%s", np, out)
	}

	// The backend moves to node 2: the answers swap.
	zero := int64(0)
	if err := e.cs.CoreV1().Pods(ns).Delete(ctx, "backend", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	e.createPod(t, ns, "backend2", "node2", map[string]string{"app": "hc-backend"})
	e.waitReady(t, ns, "backend2")
	expect("node 2 healthy, node 1 not", answer{503, 0}, answer{200, 1})
	if err := e.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
