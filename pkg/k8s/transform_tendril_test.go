package k8s

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	want.ManagedFields = nil
	want.Status.Identity.Labels = nil
	sharedIdentity := tep.Status.Identity
	out, err := StripTendril(tep)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, want) {
		t.Fatalf("got %+v\nwant %+v", out, want)
	}
	// The informer may hand the transform an object others hold: the
	// identity is replaced, not edited in place.
	if len(sharedIdentity.Labels) != 2 {
		t.Fatalf("the original identity was edited: %v", sharedIdentity.Labels)
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
