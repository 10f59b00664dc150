package e2e_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
)

// TestPrivilegedLabSocketLBFlowNamesPod connects from a pod to a
// ClusterIP Service (`lab probe`, run in the pod's container cgroup as
// `kubectl exec` would be) and reads the flows through the lab's relay
// with the stock hubble CLI: the socket load-balancer's translation flow
// (type SOCK, trace-sock) of the connection names the client pod as its
// source (from the connecting process's cgroup ID, which the agent maps
// to the pod through the kubelet-shaped cgroups below its --cgroup-root)
// and the Service as its destination_service.
func TestPrivilegedLabSocketLBFlowNamesPod(t *testing.T) {
	e := labUp(t)
	bin := hubbletest.HubbleCLI(t)
	relay := "unix://" + e.st.RelaySocket()
	ctx := context.Background()

	const ns = "e2e-sockflow"
	e.createNamespace(t, ns)
	e.createPod(t, ns, "client", "node1", map[string]string{"app": "sockflow-client"})
	e.createPod(t, ns, "backend", "node2", map[string]string{"app": "sockflow-backend"}, corev1.ContainerPort{ContainerPort: 80})
	e.waitReady(t, ns, "client")
	e.waitReady(t, ns, "backend")
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "sockflow", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "sockflow-backend"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 8080, TargetPort: intstr.FromInt32(80)}}},
	}
	created, err := e.cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Service's endpoint", func() (bool, error) {
		sl, err := e.cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
		if err != nil {
			return false, err
		}
		n := 0
		for _, s := range sl.Items {
			n += len(s.Endpoints)
		}
		return n == 1, fmt.Errorf("%d endpoints", n)
	})
	frontend := net.JoinHostPort(created.Spec.ClusterIP, "8080")
	eventually(t, "client -> the ClusterIP answered by the backend", func() (bool, error) {
		code, out := tendril(t, "probe", ns+"/client", frontend, "--timeout", "1s")
		return code == 0 && strings.Contains(out, `answered "backend"`), fmt.Errorf("exit %d: %s", code, out)
	})

	// The translation flows of connections to the backend, whoever made
	// them: the test fails, printing them, unless one names the client.
	var seen []string
	eventually(t, "a trace-sock flow naming the client pod and the Service", func() (bool, error) {
		out := hubbletest.RunCLI(t, bin, relay, "observe", "--last", "1000", "-o", "json", "--type", "trace-sock", "--to-pod", ns+"/backend")
		seen = seen[:0]
		for _, f := range hubbletest.JSONFlows(t, out) {
			seen = append(seen, describeSockFlow(f))
			if f.GetType() != flowpb.FlowType_SOCK || f.GetDestination().GetPodName() != "backend" {
				continue
			}
			src, svc := f.GetSource(), f.GetDestinationService()
			if src.GetNamespace() == ns && src.GetPodName() == "client" && src.GetIdentity() != 0 &&
				svc.GetNamespace() == ns && svc.GetName() == "sockflow" &&
				f.GetL4().GetTCP().GetDestinationPort() == 80 {
				return true, nil
			}
		}
		return false, fmt.Errorf("flows to %s/backend: %v", ns, seen)
	})
	t.Logf("trace-sock flows to %s/backend: %v", ns, seen)
}

// describeSockFlow is a flow's source pod, destination pod and port and
// destination service, for failure messages.
func describeSockFlow(f *flowpb.Flow) string {
	src, dst, svc := f.GetSource(), f.GetDestination(), f.GetDestinationService()
	return fmt.Sprintf("%s %s/%s(identity %d) -> %s/%s:%s service %s/%s", f.GetType(), src.GetNamespace(), src.GetPodName(), src.GetIdentity(),
		dst.GetNamespace(), dst.GetPodName(), strconv.Itoa(int(f.GetL4().GetTCP().GetDestinationPort())), svc.GetNamespace(), svc.GetName())
}
