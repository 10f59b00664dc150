package k8s

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// The transform drops what the agent never reads from a cached
// TendrilEndpoint and keeps everything it does read.
func TestStripTendrilKeepsWhatTheAgentReads(t *testing.T) {
	tep := &v1alpha1.TendrilEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", ResourceVersion: "7",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "tendril-agent"}}},
		Status: v1alpha1.EndpointStatus{ID: 12, State: "ready",
			Identity:   &v1alpha1.EndpointIdentity{ID: 40000, Labels: []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=shop"}},
			Networking: &v1alpha1.EndpointNetworking{Addressing: []v1alpha1.AddressPair{{IPv4: "10.0.1.5"}}, NodeIP: "172.18.0.2"},
			NamedPorts: []v1alpha1.NamedPort{{Name: "http", Port: 8080, Protocol: "TCP"}}},
	}
	want := tep.DeepCopy()
	sharedIdentity := tep.Status.Identity
	out, err := StripTendril(tep)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := out.(*CachedEndpoint)
	if !ok {
		t.Fatalf("the transform made a %T", out)
	}
	// What the agent reads: key, resource version, the status without
	// the identity's labels.
	wantStatus := *want.Status.DeepCopy()
	wantStatus.Identity.Labels = nil
	if key, _ := cache.MetaNamespaceKeyFunc(got); key != "shop/web" || got.ResourceVersion != "7" || !reflect.DeepEqual(got.Status, wantStatus) {
		t.Fatalf("got %q %q %+v\nwant %+v", key, got.ResourceVersion, got.Status, wantStatus)
	}
	// Idempotent: converting again changes nothing.
	if again, _ := StripTendril(got); again != got {
		t.Fatal("a cached endpoint converted again")
	}
	// The informer may hand the transform an object others hold: it is
	// not edited.
	if !reflect.DeepEqual(tep, want) || len(sharedIdentity.Labels) != 2 {
		t.Fatalf("the original was edited: %+v", tep)
	}
	// As an API object again (the publisher's prune lists them), and a
	// copy for the cache's readers, equal and separate.
	if back := got.TendrilEndpoint(); back.Name != "web" || back.Namespace != "shop" || !reflect.DeepEqual(back.Status, wantStatus) {
		t.Fatalf("as a TendrilEndpoint: %+v", back)
	}
	c := got.DeepCopyObject().(*CachedEndpoint)
	if !reflect.DeepEqual(c, got) || c.Status.Networking == got.Status.Networking {
		t.Fatal("DeepCopyObject")
	}
	// Other objects: managed fields only.
	tid := &v1alpha1.TendrilIdentity{ObjectMeta: metav1.ObjectMeta{Name: "40000", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}},
		SecurityLabels: map[string]string{"k8s:app": "web"}}
	out, err = StripTendril(tid)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.(*v1alpha1.TendrilIdentity); got.ManagedFields != nil || got.SecurityLabels["k8s:app"] != "web" {
		t.Fatalf("identity: %+v", got)
	}
}
