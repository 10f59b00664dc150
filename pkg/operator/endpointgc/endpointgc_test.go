package endpointgc

import (
	"context"
	"github.com/tendril-net/tendril/pkg/operator/operatortest"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var env k8senv.Package

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, k8senv.Options{}, operatortest.InstallCRDs))
}

// TestEndpointGC: endpoints of a running pod and of a pod created just
// before the pass stay; those of a gone, a Failed and a Succeeded pod go.
func TestEndpointGC(t *testing.T) {
	e := env.Need(t)
	c, err := k8s.NewClientsForConfig(e.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pods := c.Core.CoreV1().Pods("default")
	mkPod := func(name string, phase corev1.PodPhase) {
		p, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if phase != "" {
			p.Status.Phase = phase
			if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	mkEP := func(name string) {
		ep := &v1alpha1.TendrilEndpoint{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Status: v1alpha1.EndpointStatus{Identity: &v1alpha1.EndpointIdentity{ID: 70000}}}
		if _, err := c.Tendril.TendrilV1alpha1().TendrilEndpoints("default").Create(ctx, ep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkPod("running", corev1.PodRunning)
	mkPod("failed", corev1.PodFailed)
	mkPod("succeeded", corev1.PodSucceeded)
	for _, n := range []string{"running", "failed", "succeeded", "gone"} {
		mkEP(n)
	}
	res, stop, err := resources.Start(ctx, c, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for {
		eps, _ := res.Endpoints.List(everything())
		ps, _ := res.Pods.List(everything())
		if len(eps) == 4 && len(ps) == 3 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A pod and its endpoint created now: the caches may not have the pod
	// yet when the pass runs; the live check keeps the endpoint.
	mkPod("new", "")
	mkEP("new")
	for {
		if eps, _ := res.Endpoints.List(everything()); len(eps) == 5 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	gc := New(operatortest.Quiet(), c, res)
	r, err := gc.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Deleted != 3 {
		t.Fatalf("pass: %s", r)
	}
	teps := c.Tendril.TendrilV1alpha1().TendrilEndpoints("default")
	for name, want := range map[string]bool{"running": true, "new": true, "failed": false, "succeeded": false, "gone": false} {
		_, err := teps.Get(ctx, name, metav1.GetOptions{})
		if want && err != nil {
			t.Errorf("endpoint %s deleted: %v", name, err)
		}
		if !want && !apierrors.IsNotFound(err) {
			t.Errorf("endpoint %s kept (%v)", name, err)
		}
	}
}
