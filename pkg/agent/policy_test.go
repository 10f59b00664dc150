package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/cilium/api/v1/models"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/client"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// apiRulesJSON is the JSON of the repository's API-imported rules, in
// repository order: what the policy file must hold.
func apiRulesJSON(t *testing.T, a *testAgent) string {
	t.Helper()
	stored, _ := a.policy.Repository().Rules(nil)
	out := api.Rules{}
	for _, s := range stored {
		if s.Source == "api" {
			out = append(out, s.Rule)
		}
	}
	data, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// importDoc is a policy document of n rules labelled team=t<team>,
// round=r<round> (in the string form, which both the old and the
// CiliumNetworkPolicy label form accept); many rules make the file large,
// so that concurrent writes of it overlap.
func importDoc(team, round, n int) string {
	rules := make([]string, 0, n)
	for i := 0; i < n; i++ {
		rules = append(rules, fmt.Sprintf(`{"endpointSelector":{"matchLabels":{"app":"svc-%d-%d"}},`+
			`"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"client-%d"}}],"toPorts":[{"ports":[{"port":"%d","protocol":"TCP"}]}]}],`+
			`"labels":["team=t%d","round=r%d"],`+
			`"description":"rule %d of team %d round %d"}`, team, i, round, 1000+i, team, round, i, team, round))
	}
	return "[" + strings.Join(rules, ",") + "]"
}

// TestPolicyFileUnderConcurrentImportsAndKubernetesEvents imports policies
// through the REST API while the Kubernetes paths (NetworkPolicy and
// TendrilNetworkPolicy events, as the watchers deliver them) change the
// repository too, all at once, and every writer's last change lands at the
// same moment. The policy file must end up valid and hold exactly the
// API-imported rules present at the end, none of the Kubernetes ones, and
// an agent restarted on the state directory must restore exactly those.
// Several start-burst-stop cycles run on one state directory, so each
// cycle also starts from the file the previous one left.
func TestPolicyFileUnderConcurrentImportsAndKubernetesEvents(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "state")
	run := t.TempDir()
	ctx := context.Background()
	want := ""
	for cycle := 0; cycle < 8; cycle++ {
		a, c := startAgent(t, map[string]string{"state-dir": stateDir, "socket": filepath.Join(run, fmt.Sprintf("cycle-%d.sock", cycle))})
		if cycle > 0 {
			if got := apiRulesJSON(t, a); got != want {
				t.Fatalf("cycle %d: restored rules differ from those at the end of the last cycle:\ngot  %.400s\nwant %.400s", cycle, got, want)
			}
		}
		policyBurst(t, a, c, cycle)
		want = apiRulesJSON(t, a)
		if strings.Contains(want, "io.cilium.k8s.policy") {
			t.Fatalf("the API rules hold Kubernetes rules: %s", want)
		}
		all, _ := a.policy.Repository().Rules(nil)
		k8sRules := 0
		for _, s := range all {
			if s.Source != "api" {
				k8sRules++
			}
		}
		if k8sRules == 0 {
			t.Fatal("the burst left no Kubernetes rules in the repository: the test checks nothing about them")
		}
		if err := a.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(stateDir, "policy.json"))
		if err != nil {
			t.Fatal(err)
		}
		rules, err := api.ParseRules(data)
		if err != nil {
			t.Fatalf("cycle %d: the policy file is not valid: %v\n%.600s", cycle, err, data)
		}
		got, _ := json.Marshal(rules)
		if string(got) != want {
			t.Fatalf("cycle %d: the policy file holds %d rules, not the %d API rules at the end:\ngot  %.400s\nwant %.400s",
				cycle, len(rules), strings.Count(want, `"endpointSelector"`), got, want)
		}
		if files, _ := filepath.Glob(filepath.Join(stateDir, "*policy.json*")); len(files) != 1 {
			t.Fatalf("cycle %d: temporary files left behind: %v", cycle, files)
		}
	}
}

// policyBurst runs API imports and deletions (through the socket) beside
// NetworkPolicy and TendrilNetworkPolicy events (through the handlers the
// watchers call); every goroutine's last change waits for the others', so
// the last changes are concurrent.
func policyBurst(t *testing.T, a *testAgent, c *client.Client, cycle int) {
	t.Helper()
	ctx := context.Background()
	k := agentk8s.NewPolicySource(a.log, a.policy, nil)
	const teams, rounds, rulesPerImport, k8sWriters = 4, 6, 10, 2
	var wg, ready sync.WaitGroup
	gate := make(chan struct{})
	last := func() { ready.Done(); <-gate }
	errs := make(chan error, teams*rounds*2)
	for team := 0; team < teams; team++ {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			// What the team imported in the last cycle goes first (it
			// was restored).
			if err := c.Do(ctx, http.MethodDelete, "/policy", nil, nil, []string{fmt.Sprintf("team=t%d", team)}, nil); err != nil && cycle > 0 {
				errs <- fmt.Errorf("delete team %d: %w", team, err)
				return
			}
			for round := 0; round <= rounds; round++ {
				if round == rounds {
					last()
				}
				if err := c.Do(ctx, http.MethodPut, "/policy", nil, nil, importDoc(team, cycle*100+round, rulesPerImport), nil); err != nil {
					errs <- fmt.Errorf("import team %d round %d: %w", team, round, err)
					return
				}
				if round%3 == 2 {
					// Delete an earlier round by its labels.
					sel := []string{fmt.Sprintf("team=t%d", team), fmt.Sprintf("round=r%d", cycle*100+round-1)}
					if err := c.Do(ctx, http.MethodDelete, "/policy", nil, nil, sel, nil); err != nil {
						errs <- fmt.Errorf("delete %v: %w", sel, err)
						return
					}
				}
			}
		}()
	}
	for w := 0; w < k8sWriters; w++ {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i <= rounds*2; i++ {
				if i == rounds*2 {
					last()
				}
				np := &networkingv1.NetworkPolicy{
					ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("np-%d-%d", w, i%4), UID: "uid"},
					Spec: networkingv1.NetworkPolicySpec{
						PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprint(i)}},
						PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
					},
				}
				kind := watchers.Upsert
				if i%5 == 4 {
					kind = watchers.Delete
				}
				k.OnNetworkPolicy(watchers.Event[*networkingv1.NetworkPolicy]{Kind: kind, Key: np.Namespace + "/" + np.Name, Object: np})

				// A TendrilNetworkPolicy event whose status already says
				// Valid for this generation (no status write: there is no
				// API server here).
				gen := int64(cycle*1000 + i + 1)
				conds := []metav1.Condition{{Type: v1alpha1.ConditionValid, Status: metav1.ConditionTrue, Reason: "Valid", Message: "policy imported", ObservedGeneration: gen}}
				spec := &api.Rule{EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": fmt.Sprint(i)}},
					Ingress: []api.IngressRule{{FromEntities: []string{"cluster"}}}}
				k.Apply(kind, "TendrilNetworkPolicy", "ns", fmt.Sprintf("tnp-%d", w), "uid", gen, spec, nil, conds)
			}
		}()
	}
	ready.Wait()
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestCorruptPolicyFileStopsTheStart: a policy file that does not load
// fails the start with a message naming the file and the way out, and the
// file stays as it was for the operator to look at.
func TestCorruptPolicyFileStopsTheStart(t *testing.T) {
	flags := testFlags(t.TempDir(), map[string]string{"node-name": "n"})
	if err := os.MkdirAll(flags["state-dir"], 0o750); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(flags["state-dir"], "policy.json")
	corrupt := `[{"endpointSelector":{"matchLabels":{"app":"a"}},"ingress":[{"fromEnti`
	if err := os.WriteFile(path, []byte(corrupt), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := newTestAgent(Deps{Log: testLogger(t)}, flags)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Start(context.Background())
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	want := "policy file " + path + " is corrupt: "
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "move it away") {
		t.Fatalf("Start = %v, want an error saying %q and how to recover", err, want)
	}
	if got, _ := os.ReadFile(path); string(got) != corrupt {
		t.Fatalf("the failed start changed the file: %q", got)
	}
}

// ciliumDbgImport is a rule list the way `cilium-dbg policy import` sends
// it: sanitized selectors ("any:" keys) and labels as objects, the whole
// document JSON-encoded as a string.
const ciliumDbgImport = `[
  {
    "endpointSelector": {"matchLabels": {"any:app": "web"}},
    "ingress": [{"fromEndpoints": [{"matchLabels": {"any:app": "client"}}],
                 "toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}]}]}],
    "labels": [{"key": "team", "value": "blue", "source": "unspec"},
               {"key": "io.cilium.k8s.policy.name", "value": "web", "source": "k8s"}],
    "description": "web from client"
  },
  {
    "endpointSelector": {"matchLabels": {"any:app": "db"}},
    "ingress": [{"fromEndpoints": [{"matchLabels": {"any:app": "web"}}]}],
    "labels": [{"key": "team", "value": "green", "source": "unspec"}]
  }
]`

// TestPolicyLabelsImportSelectAndDelete imports rules with labels in the
// CiliumNetworkPolicy form through the REST API, selects and deletes them
// by labels (a label without source matches any source, one with a source
// only that source), and checks that rules saved in the older string form
// still load after a restart.
func TestPolicyLabelsImportSelectAndDelete(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "state")
	run := t.TempDir()
	ctx := context.Background()
	a, c := startAgent(t, map[string]string{"state-dir": stateDir, "socket": filepath.Join(run, "first.sock")})
	if err := c.Do(ctx, http.MethodPut, "/policy", nil, nil, ciliumDbgImport, nil); err != nil {
		t.Fatalf("import: %v", err)
	}
	rulesWith := func(sel ...string) (api.Rules, error) {
		var body any
		if len(sel) > 0 {
			body = sel
		}
		var pol models.Policy
		if err := c.Do(ctx, http.MethodGet, "/policy", nil, nil, body, &pol); err != nil {
			return nil, err
		}
		var rules api.Rules
		if err := json.Unmarshal([]byte(pol.Policy), &rules); err != nil {
			t.Fatalf("policy %q: %v", pol.Policy, err)
		}
		return rules, nil
	}
	all, err := rulesWith()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].Labels.Key() != "k8s:io.cilium.k8s.policy.name=web;unspec:team=blue" || all[1].Labels.Key() != "unspec:team=green" {
		t.Fatalf("imported rules' labels: %+v", all)
	}
	if rules, err := rulesWith("team=blue"); err != nil || len(rules) != 1 || rules[0].Description != "web from client" {
		t.Fatalf("get team=blue: %v, %v", rules, err)
	}
	// A source that the rule's label does not have selects nothing.
	_, err = rulesWith("k8s:team=blue")
	assertAPIError(t, err, http.StatusNotFound, "no policy rule has labels k8s:team=blue")
	err = c.Do(ctx, http.MethodDelete, "/policy", nil, nil, []string{"k8s:team=blue"}, nil)
	assertAPIError(t, err, http.StatusNotFound, "no policy rule has labels k8s:team=blue")
	err = c.Do(ctx, http.MethodDelete, "/policy", nil, nil, []string{"k8s:=x"}, nil)
	assertAPIError(t, err, http.StatusBadRequest, "empty key")

	if err := c.Do(ctx, http.MethodDelete, "/policy", nil, nil, []string{"io.cilium.k8s.policy.name=web", "unspec:team=blue"}, nil); err != nil {
		t.Fatalf("delete by labels: %v", err)
	}
	if rules, err := rulesWith(); err != nil || len(rules) != 1 || rules[0].Labels.Key() != "unspec:team=green" {
		t.Fatalf("after delete: %+v, %v", rules, err)
	}
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	saved, err := os.ReadFile(filepath.Join(stateDir, "policy.json"))
	if err != nil || !strings.Contains(string(saved), `"key": "team"`) {
		t.Fatalf("saved policy (%v):\n%s", err, saved)
	}

	// A file of the older form: labels as "source:key=value" strings.
	old := `[{"endpointSelector":{"matchLabels":{"app":"b"}},"labels":["test=restart","k8s:io.cilium.k8s.policy.name=old"],` +
		`"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"a"}}]}]}]`
	if err := os.WriteFile(filepath.Join(stateDir, "policy.json"), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	_, c = startAgent(t, map[string]string{"state-dir": stateDir, "socket": filepath.Join(run, "second.sock")})
	rules, err := rulesWith("k8s:io.cilium.k8s.policy.name=old")
	if err != nil || len(rules) != 1 || rules[0].Labels.Key() != "k8s:io.cilium.k8s.policy.name=old;unspec:test=restart" {
		t.Fatalf("rules restored from the older form: %+v, %v", rules, err)
	}
	if err := c.Do(ctx, http.MethodDelete, "/policy", nil, nil, []string{"test=restart"}, nil); err != nil {
		t.Fatalf("delete a restored rule by labels: %v", err)
	}
}
