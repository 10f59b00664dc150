package agentk8s

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/policy"
)

// TestRemoteNamedPorts: named ports other nodes publish in TendrilEndpoints
// reach the policy universe under the endpoint's identity, and leave with
// the object.
func TestRemoteNamedPorts(t *testing.T) {
	pol := &triggerCounter{}
	k := &Module{policy: pol, client: &Client{}}
	tep := &v1alpha1.TendrilEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "x"}, Status: v1alpha1.EndpointStatus{
		Identity:   &v1alpha1.EndpointIdentity{ID: 4242},
		NamedPorts: []v1alpha1.NamedPort{{Name: "sql", Port: 5432, Protocol: "TCP"}, {Name: "dns", Port: 53, Protocol: "UDP"}},
	}}
	k.recordRemotePorts(watchers.Event[*k8s.CachedEndpoint]{Kind: watchers.Upsert, Key: "x/db", Object: k8s.NewCachedEndpoint(tep)})
	out := map[identity.NumericIdentity]map[string]policy.NamedPort{}
	k.client.AddRemoteNamedPorts(out)
	if got := fmt.Sprint(out); got != "map[4242:map[dns:{53 17} sql:{5432 6}]]" {
		t.Fatalf("universe named ports %s", got)
	}
	if pol.triggers == 0 {
		t.Fatal("no regeneration triggered")
	}
	k.recordRemotePorts(watchers.Event[*k8s.CachedEndpoint]{Kind: watchers.Delete, Key: "x/db", Object: k8s.NewCachedEndpoint(tep)})
	out = map[identity.NumericIdentity]map[string]policy.NamedPort{}
	k.client.AddRemoteNamedPorts(out)
	if len(out) != 0 {
		t.Fatalf("after delete: %v", out)
	}
}

// triggerCounter is the policy as the Kubernetes sources use it, counting
// the regenerations asked for.
type triggerCounter struct {
	Policy
	triggers int
}

func (c *triggerCounter) TriggerRegeneration() { c.triggers++ }
