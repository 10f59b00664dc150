package crdinstall

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var controlPlane k8senv.Package

func TestMain(m *testing.M) { os.Exit(controlPlane.Main(m, k8senv.Options{}, nil)) }

func clients(t *testing.T) *k8s.Clients {
	t.Helper()
	env := controlPlane.Need(t)
	c, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestInstallCreatesUpdatesAndValidates installs into a real API server:
// every CRD is created and served, a second install changes nothing, a CRD
// whose schema hash differs (an older agent's) is updated, and the server's
// OpenAPI validation rejects malformed objects.
func TestInstallCreatesUpdatesAndValidates(t *testing.T) {
	c := clients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	res, err := Install(ctx, c.Dynamic, quiet())
	if err != nil {
		t.Fatalf("install: %v", err)
	}
	if len(res) != 10 {
		t.Fatalf("installed %d CRDs, want 10: %v", len(res), res)
	}
	for name, action := range res {
		if action != "created" {
			t.Errorf("%s: %s, want created", name, action)
		}
	}
	res, err = Install(ctx, c.Dynamic, quiet())
	if err != nil {
		t.Fatalf("second install: %v", err)
	}
	for name, action := range res {
		if action != "unchanged" {
			t.Errorf("second install %s: %s, want unchanged", name, action)
		}
	}

	// An older schema: the hash differs, so the next install updates it.
	name := "tendrilnodes.tendril.io"
	cur, err := c.Dynamic.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ann := cur.GetAnnotations()
	ann[SchemaHashAnnotation] = "old"
	cur.SetAnnotations(ann)
	if _, err := c.Dynamic.Resource(crdGVR).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err = Install(ctx, c.Dynamic, quiet())
	if err != nil {
		t.Fatalf("third install: %v", err)
	}
	if res[name] != "updated" {
		t.Fatalf("%s after a schema change: %s, want updated", name, res[name])
	}

	// Typed clients work against the served CRDs.
	ns := "crd-test"
	createNS(t, c, ns)
	port := api.PortProtocol{Port: "80", Protocol: "TCP"}
	good := &v1alpha1.TendrilNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-web", Namespace: ns},
		Spec: &api.Rule{
			EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []api.IngressRule{{
				FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": "client"}}},
				ToPorts:       []api.PortRule{{Ports: []api.PortProtocol{port}}},
				ICMPs:         []api.ICMPRule{{Fields: []api.ICMPField{{Type: &api.ICMPValue{Value: 8}}}}},
			}},
		},
	}
	got, err := c.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns).Create(ctx, good, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a valid policy: %v", err)
	}
	if got.Spec.Ingress[0].ToPorts[0].Ports[0] != port || got.Spec.Ingress[0].ICMPs[0].Fields[0].Type.Value != 8 {
		t.Fatalf("policy did not round-trip: %+v", got.Spec)
	}

	// The server's schema rejects malformed objects, each with a message
	// naming the field.
	bad := []struct {
		name, field string
		obj         map[string]any
	}{
		{"bad-protocol", "protocol", map[string]any{"spec": map[string]any{
			"endpointSelector": map[string]any{},
			"ingress":          []any{map[string]any{"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": "80", "protocol": "HTTP"}}}}}}}}},
		{"bad-operator", "operator", map[string]any{"spec": map[string]any{
			"endpointSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": "app", "operator": "Maybe"}}}}}},
		{"bad-endport", "endPort", map[string]any{"spec": map[string]any{
			"endpointSelector": map[string]any{},
			"ingress":          []any{map[string]any{"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": "80", "endPort": 70000}}}}}}}}},
		{"bad-port", "port", map[string]any{"spec": map[string]any{
			"endpointSelector": map[string]any{},
			"ingress":          []any{map[string]any{"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": "-80!"}}}}}}}}},
		{"ingress-not-a-list", "ingress", map[string]any{"spec": map[string]any{"ingress": "everything"}}},
	}
	tnp := v1alpha1.SchemeGroupVersion.WithResource(v1alpha1.ResourceNetworkPolicies)
	for _, b := range bad {
		u := &unstructured.Unstructured{Object: b.obj}
		u.SetAPIVersion(v1alpha1.SchemeGroupVersion.String())
		u.SetKind("TendrilNetworkPolicy")
		u.SetName(b.name)
		_, err := c.Dynamic.Resource(tnp).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) {
			t.Errorf("%s: got %v, want the server's validation to reject it", b.name, err)
			continue
		}
		if !strings.Contains(err.Error(), b.field) {
			t.Errorf("%s: error %q does not name %s", b.name, err, b.field)
		}
	}

	// Cluster-scoped kinds: a node with a malformed address type and an
	// identity without labels are rejected.
	tn := v1alpha1.SchemeGroupVersion.WithResource(v1alpha1.ResourceNodes)
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"addresses": []any{map[string]any{"type": "Bogus", "ip": "10.0.0.1"}}}}}
	u.SetAPIVersion(v1alpha1.SchemeGroupVersion.String())
	u.SetKind("TendrilNode")
	u.SetName("n1")
	if _, err := c.Dynamic.Resource(tn).Create(ctx, u, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("node with address type Bogus: got %v, want invalid", err)
	}
	tid := v1alpha1.SchemeGroupVersion.WithResource(v1alpha1.ResourceIdentities)
	u = &unstructured.Unstructured{Object: map[string]any{}}
	u.SetAPIVersion(v1alpha1.SchemeGroupVersion.String())
	u.SetKind("TendrilIdentity")
	u.SetName("300")
	if _, err := c.Dynamic.Resource(tid).Create(ctx, u, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("identity without security-labels: got %v, want invalid", err)
	}
	id := &v1alpha1.TendrilIdentity{ObjectMeta: metav1.ObjectMeta{Name: "300"}, SecurityLabels: map[string]string{"k8s:app": "web"}}
	if _, err := c.Tendril.TendrilV1alpha1().TendrilIdentities().Create(ctx, id, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create identity: %v", err)
	}
	if _, err := c.Tendril.TendrilV1alpha1().TendrilIdentities().Create(ctx, id, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("second create of identity 300: got %v, want AlreadyExists (the allocator relies on it)", err)
	}
}

func createNS(t *testing.T, c *k8s.Clients, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.Core.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
