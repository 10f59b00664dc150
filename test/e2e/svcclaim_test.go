package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/lab"
)

// TestPrivilegedLabExternalIPCannotTakeClusterIP: a tenant's Service in
// "default" names kube-dns's cluster IP and port 53 in its externalIPs,
// with the lab's echo pods behind it. Every agent restarts (its first
// listing has default/ before kube-system/): the pods on both nodes still
// resolve names through CoreDNS, each time. On the old writer the Service
// seen first kept the address, so the restarted agents sent the pods' DNS
// to the echo pods.
func TestPrivilegedLabExternalIPCannotTakeClusterIP(t *testing.T) {
	e := labUp(t)
	ctx := context.Background()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "aaa-takes-dns", Namespace: "default"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{lab.LabelApp: lab.LabApp},
			ExternalIPs: []string{lab.ClusterDNSIP},
			Ports: []corev1.ServicePort{
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(81)},
				{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(80)},
			}},
	}
	if _, err := e.cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.cs.CoreV1().Services("default").Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	})
	restartAgents(t, e, nil)
	for _, pod := range []string{"default/pod-1", "default/pod-2"} {
		// Once the restarted agent has the services again, every lookup
		// is CoreDNS's: five in a row, over UDP (glibc) and TCP.
		eventually(t, "kubernetes.default resolved from "+pod+" after the restart", func() (bool, error) {
			code, out := tendril(t, "exec", pod, "--", "getent", "ahostsv4", "kubernetes.default")
			return code == 0 && strings.HasPrefix(out, controlplane.KubernetesSvcIP+" "), fmt.Errorf("exit %d: %s", code, out)
		})
		for i := range 5 {
			code, out := tendril(t, "exec", pod, "--", "getent", "ahostsv4", "kubernetes.default")
			if code != 0 || !strings.HasPrefix(out, controlplane.KubernetesSvcIP+" ") {
				t.Fatalf("lookup %d from %s after the restart: exit %d: %s", i, pod, code, out)
			}
			code, out = tendril(t, "probe", pod, "kubernetes.default:443", "--tls", "--dns-tcp", "--timeout", "3s")
			if code != 0 || !strings.Contains(out, `answered "kube-apiserver"`) {
				t.Fatalf("probe over DNS/TCP %d from %s after the restart: exit %d:\n%s", i, pod, code, out)
			}
		}
	}
}
