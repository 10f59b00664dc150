package reconcile

import (
	"errors"
	"slices"
	"testing"
)

func TestPruneStale(t *testing.T) {
	var deleted []string
	n, err := PruneStale([]string{"a", "b", "c", "d"}, map[string]struct{}{"b": {}}, func(k string) error {
		if k == "c" {
			return errors.New("busy")
		}
		deleted = append(deleted, k)
		return nil
	})
	if n != 2 || !slices.Equal(deleted, []string{"a", "d"}) {
		t.Fatalf("pruned %d %v, want 2 [a d]", n, deleted)
	}
	if err == nil || err.Error() != "prune c: busy" {
		t.Fatalf("error %v, want the failed delete of c", err)
	}
}
