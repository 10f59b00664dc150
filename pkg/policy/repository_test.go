package policy

import (
	"fmt"
	"sync"
	"testing"

	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// TestListenersSeeRevisionsInOrder changes the repository from many
// goroutines at once. Every listener call must come after its change is
// complete (the repository already holds that revision), once per
// revision, in revision order, and a listener may read the repository.
func TestListenersSeeRevisionsInOrder(t *testing.T) {
	repo := NewRepository()
	var (
		mu   sync.Mutex
		seen []uint64
		bad  []string
	)
	repo.Subscribe(func(rev uint64) {
		rules, now := repo.Rules(nil) // reading from a listener must not deadlock
		mu.Lock()
		defer mu.Unlock()
		if now < rev {
			bad = append(bad, fmt.Sprintf("revision %d notified while the repository is at %d (%d rules)", rev, now, len(rules)))
		}
		seen = append(seen, rev)
	})
	const writers, changes = 8, 60
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < changes; i++ {
				label := fmt.Sprintf("writer=w%d", w)
				switch i % 3 {
				case 0:
					doc := fmt.Sprintf(`[{"endpointSelector":{},"labels":[%q],"ingress":[{"fromEntities":["host"]}]}]`, label)
					if _, err := repo.Add(mustRules(t, doc), "", "api", false); err != nil {
						t.Error(err)
						return
					}
				case 1:
					doc := `[{"endpointSelector":{},"ingress":[{"fromEntities":["world"]}]}]`
					if _, err := repo.ReplaceSource(fmt.Sprintf("k8s/w%d", w), "x", mustRules(t, doc)); err != nil {
						t.Error(err)
						return
					}
				case 2:
					// Always removes the rule case 0 added.
					if _, n := repo.DeleteByLabels(mustSelect(t, label)); n != 1 {
						t.Errorf("writer %d deleted %d rules", w, n)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, b := range bad {
		t.Error(b)
	}
	if len(seen) != writers*changes {
		t.Fatalf("%d listener calls for %d changes", len(seen), writers*changes)
	}
	for i, rev := range seen {
		if want := uint64(i + 2); rev != want {
			t.Fatalf("listener call %d saw revision %d, want %d (calls out of order)", i, rev, want)
		}
	}
}

// mustSelect parses labels that select rules, as the API does.
func mustSelect(t testing.TB, ss ...string) []labels.Label {
	t.Helper()
	sel, err := api.ParseSelectLabels(ss)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}
