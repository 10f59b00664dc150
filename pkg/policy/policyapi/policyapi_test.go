package policyapi

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// serve registers the handlers on a real API server and serves it.
func serve(t *testing.T, h *Handlers) *httptest.Server {
	t.Helper()
	srv, err := server.New(server.DefaultConfig(), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h.Register(srv)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts
}

func put(t *testing.T, ts *httptest.Server, query, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, ts.URL+"/v1/policy"+query, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const (
	oldRule = `[{"endpointSelector":{"matchLabels":{"app":"db"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"web"}}]}],"labels":["team=db","v=1"]}]`
	newRule = `[{"endpointSelector":{"matchLabels":{"app":"db"}},"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"api"}}]}],"labels":["team=db","v=2"]}]`
)

// ruleWatch records, for each revision a subscriber of the repository is
// told of, how many rules select app=db: what a resolution of that
// endpoint at that revision would enforce.
type ruleWatch struct {
	mu   sync.Mutex
	seen map[uint64]int
}

func watch(repo *policy.Repository) *ruleWatch {
	w := &ruleWatch{seen: map[uint64]int{}}
	repo.Subscribe(func(rev uint64) {
		rules, _ := repo.Rules(nil)
		w.mu.Lock()
		defer w.mu.Unlock()
		w.seen[rev] = len(rules)
	})
	return w
}

// TestPutReplaceIsOneRevision: PUT /v1/policy?replace-with-labels swaps
// the rules in one revision, so no subscriber (the policy file, endpoint
// regeneration) ever sees the endpoint without rules in between.
func TestPutReplaceIsOneRevision(t *testing.T) {
	for _, query := range []string{"?replace-with-labels=team=db", "?replace-with-labels=team=db&replace=true"} {
		t.Run(query, func(t *testing.T) {
			repo := policy.NewRepository()
			ts := serve(t, &Handlers{Repo: repo, Source: "api"})
			if code, body := put(t, ts, "", oldRule); code != http.StatusOK {
				t.Fatalf("PUT old rule: %d %s", code, body)
			}
			w := watch(repo)
			before := repo.Revision()
			if code, body := put(t, ts, query, newRule); code != http.StatusOK {
				t.Fatalf("PUT %s: %d %s", query, code, body)
			}
			if got := repo.Revision(); got != before+1 {
				t.Errorf("revision went from %d to %d, want one step", before, got)
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			for rev, n := range w.seen {
				if n != 1 {
					t.Errorf("a subscriber saw %d rules at revision %d (want the new rule alone)", n, rev)
				}
			}
			rules, _ := repo.Rules(nil)
			if len(rules) != 1 || !rules[0].Rule.Labels.HasAll(mustSelect(t, "v=2")) {
				t.Errorf("rules after the replace: %v", rules)
			}
		})
	}
}

func mustSelect(t *testing.T, strs ...string) []labels.Label {
	t.Helper()
	sel, err := api.ParseSelectLabels(strs)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}
