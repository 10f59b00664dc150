package agentk8s

import (
	"fmt"
	"log/slog"
	"sync"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/k8s/policystatus"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/policy/api"
	policyk8s "github.com/tendril-net/tendril/pkg/policy/k8s"
)

// PolicySource imports the Kubernetes policies the watchers see into the
// policy repository: NetworkPolicies (translated with the Kubernetes
// semantics) and Tendril policies (their rules, labelled with the object
// they come from), reporting on the latter in the policy status.
type PolicySource struct {
	log    *slog.Logger
	policy Policy
	status *policystatus.Publisher // nil: no report

	mu  sync.Mutex
	gen map[string]int64 // policy source -> generation imported
}

// NewPolicySource is the policy source over policy; status may be nil.
func NewPolicySource(log *slog.Logger, policy Policy, status *policystatus.Publisher) *PolicySource {
	return &PolicySource{log: log, policy: policy, status: status, gen: map[string]int64{}}
}

// OnNetworkPolicy puts a Kubernetes NetworkPolicy into the repository (its
// translation with the exact Kubernetes semantics) or takes it out. A
// policy that does not translate is rejected whole and logged; its earlier
// version stays, as the API server would not have accepted it either.
func (s *PolicySource) OnNetworkPolicy(ev watchers.Event[*networkingv1.NetworkPolicy]) {
	repo := s.policy.Repository()
	switch ev.Kind {
	case watchers.Upsert:
		rev, err := policyk8s.Apply(repo, ev.Object)
		if err != nil {
			s.log.Warn("NetworkPolicy rejected", "policy", ev.Key, "error", err)
			return
		}
		s.log.Info("NetworkPolicy imported", "policy", ev.Key, "revision", rev)
	case watchers.Delete:
		rev, n := policyk8s.Delete(repo, ev.Object.Namespace, ev.Object.Name)
		s.log.Info("NetworkPolicy removed", "policy", ev.Key, "rules", n, "revision", rev)
	}
}

// Apply puts a Tendril policy's rules in the repository, replacing
// what the same object had; a policy that does not validate is rejected
// whole (its previous rules go too) and its status says why.
func (s *PolicySource) Apply(kind watchers.EventKind, derivedFrom, ns, name, uid string,
	gen int64, spec *api.Rule, specs api.Rules, conds []metav1.Condition) {
	source := "k8s/" + derivedFrom + "/" + ns + "/" + name
	repo := s.policy.Repository()
	if kind == watchers.Delete {
		s.mu.Lock()
		delete(s.gen, source)
		s.mu.Unlock()
		if _, err := repo.ReplaceSource(source, ns, nil); err != nil {
			s.log.Error("Remove policy", "policy", source, "error", err)
		}
		s.status.Removed(derivedFrom, ns, name)
		return
	}
	s.mu.Lock()
	if g, ok := s.gen[source]; ok && g == gen {
		s.mu.Unlock()
		return // a status write or a resync: the spec is unchanged
	}
	s.gen[source] = gen
	s.mu.Unlock()

	var rules api.Rules
	if spec != nil {
		rules = append(rules, spec.DeepCopy())
	}
	for _, r := range specs {
		rules = append(rules, r.DeepCopy())
	}
	origin := api.LabelArray{
		{Source: labels.SourceK8s, Key: policyk8s.KeyPolicyName, Value: name},
		{Source: labels.SourceK8s, Key: policyk8s.KeyPolicyDerivedFrom, Value: derivedFrom},
		{Source: labels.SourceK8s, Key: policyk8s.KeyPolicyUID, Value: uid},
	}
	if ns != "" {
		origin = append(origin, labels.Label{Source: labels.SourceK8s, Key: policyk8s.KeyPolicyNamespace, Value: ns})
	}
	for _, r := range rules {
		r.Labels = append(r.Labels, origin...)
	}
	var err error
	var rev uint64
	if len(rules) == 0 {
		err = fmt.Errorf("the policy has neither spec nor specs")
	} else {
		rev, err = repo.ReplaceSource(source, ns, rules)
	}
	if err != nil {
		// Rejected whole: nothing of this object stays enforced from an
		// earlier, valid version either, as the object now says otherwise.
		_, _ = repo.ReplaceSource(source, ns, nil)
		s.log.Warn("Policy rejected", "policy", source, "error", err)
	} else {
		s.log.Info("Policy imported", "policy", source, "rules", len(rules), "revision", rev)
	}
	s.status.Imported(derivedFrom, ns, name, gen, rev, conds, err)
}
