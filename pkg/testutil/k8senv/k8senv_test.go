package k8senv

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/testutil"
)

var (
	env      *Env
	startErr error
	started  time.Duration
)

func TestMain(m *testing.M) {
	begin := time.Now()
	env, startErr = Start(context.Background(), Options{ControllerManager: true, ClusterCIDR: "10.244.0.0/16"})
	started = time.Since(begin)
	code := m.Run()
	if env != nil {
		env.Stop()
	}
	os.Exit(code)
}

func need(t *testing.T) *Env {
	t.Helper()
	testutil.Require(t, startErr == nil, fmt.Sprintf("no control plane: %v", startErr))
	return env
}

// eventually polls cond; the deadline only bounds a broken control plane.
func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (last error: %v)", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestControlPlaneServesAndControllersRun(t *testing.T) {
	e := need(t)
	t.Logf("control plane with controller-manager ready in %s", started)
	ctx := context.Background()
	cs := e.Clientset()
	v, err := cs.Discovery().ServerVersion()
	// Built from the module proxy without version ldflags, the server
	// reports v0.0.0-master; only reachability is checked.
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	t.Logf("server version %s (built from %s)", v.GitVersion, controlplane.KubernetesVersion)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "k8senv-test"}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The service-account controller makes "default", so pods can be made.
	eventually(t, "the default service account", func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts("k8senv-test").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "k8senv-node"}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Node IPAM gives the node a pod CIDR.
	eventually(t, "a pod CIDR for the node", func() (bool, error) {
		n, err := cs.CoreV1().Nodes().Get(ctx, "k8senv-node", metav1.GetOptions{})
		return err == nil && len(n.Spec.PodCIDRs) == 1, err
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "k8senv-test", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "k8senv-node", Containers: []corev1.Container{{Name: "c", Image: "none",
			Ports: []corev1.ContainerPort{{ContainerPort: 80, Name: "http"}}}}},
	}
	created, err := cs.CoreV1().Pods("k8senv-test").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// With no kubelet the test writes the status a kubelet would.
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.5", PodIPs: []corev1.PodIP{{IP: "10.244.0.5"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := cs.CoreV1().Pods("k8senv-test").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "k8senv-test"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromString("http")}}},
	}
	if _, err := cs.CoreV1().Services("k8senv-test").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "an EndpointSlice with the pod", func() (bool, error) {
		list, err := cs.DiscoveryV1().EndpointSlices("k8senv-test").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
		if err != nil {
			return false, err
		}
		for _, s := range list.Items {
			for _, ep := range s.Endpoints {
				if len(ep.Addresses) == 1 && ep.Addresses[0] == "10.244.0.5" {
					return true, nil
				}
			}
		}
		return false, nil
	})
	// Grace period 0: gone at once without a kubelet.
	zero := int64(0)
	if err := cs.CoreV1().Pods("k8senv-test").Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod to vanish", func() (bool, error) {
		_, err := cs.CoreV1().Pods("k8senv-test").Get(ctx, "web", metav1.GetOptions{})
		return err != nil, nil
	})
}

func TestAPIServerRestart(t *testing.T) {
	e := need(t)
	ctx := context.Background()
	cs := e.Clientset()
	downErr := error(nil)
	if err := e.RestartAPIServer(ctx, func() {
		_, downErr = cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	}); err != nil {
		t.Fatal(err)
	}
	if downErr == nil {
		t.Fatal("the API server answered while stopped")
	}
	if _, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}
