package agentk8s

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/agent/agentpolicy"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/policy"
)

// labelTriggerCounter is a Policy counting the passes asked for.
type labelTriggerCounter struct{ n int }

func (c *labelTriggerCounter) Repository() *policy.Repository { return nil }
func (c *labelTriggerCounter) TriggerRegeneration()           { c.n++ }
func (c *labelTriggerCounter) AuditCounts() (map[agentpolicy.AuditedRule]uint64, error) {
	return nil, nil
}

// TestLocalNodeLabelsTriggerPolicy: host policies select the node by its
// labels, so a change of this node's labels asks for a policy pass; an
// update of the Node that keeps them (status, heartbeats) and other nodes'
// changes do not.
func TestLocalNodeLabelsTriggerPolicy(t *testing.T) {
	c := &labelTriggerCounter{}
	k := &Module{settings: settings{NodeName: "node1"}, policy: c}
	node := func(name string, labels map[string]string) watchers.Event[*corev1.Node] {
		return watchers.Event[*corev1.Node]{Kind: watchers.Upsert, Key: name, Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}}
	}
	for i, step := range []struct {
		ev   watchers.Event[*corev1.Node]
		want int
	}{
		{node("node1", map[string]string{"role": "worker"}), 1},
		{node("node1", map[string]string{"role": "worker"}), 1}, // a heartbeat
		{node("node2", map[string]string{"role": "edge"}), 1},
		{node("node1", map[string]string{"role": "edge"}), 2},
		{watchers.Event[*corev1.Node]{Kind: watchers.Delete, Key: "node1"}, 3},
	} {
		k.onLocalLabels(step.ev)
		if c.n != step.want {
			t.Fatalf("step %d: %d passes asked for, want %d", i, c.n, step.want)
		}
	}
}
