// Package reconcile holds what the agent's statedb reconcilers of keyed
// backends (the BPF ipcache, the policy CIDR map) share beyond statedb's
// reconciler package: waiting until the backend holds a table's changes,
// the prune of the keys a backend holds and no object backs, and the
// whole set of operations of those keyed by prefix (PrefixOps).
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/statedb"
)

// Defaults the agent's reconcilers share: a failed write is retried from
// 100 ms, backing off to every 30 s; the prune runs once the table is
// initialized and then every 5 minutes; one that refreshes rewrites every
// object every 30 minutes (what someone edited or deleted by hand comes
// back).
const (
	RetryMin      = 100 * time.Millisecond
	RetryMax      = 30 * time.Second
	PruneInterval = 5 * time.Minute
	Refresh       = 30 * time.Minute
)

// Waiter is the part of a reconciler Synced uses.
type Waiter interface {
	WaitUntilReconciled(ctx context.Context, untilRevision statedb.Revision) (statedb.Revision, statedb.Revision, error)
}

// Synced waits until rec has written table revision rev with no write up
// to it left failing (a failing one is retried by the reconciler: Synced
// looks again every 10 ms), or ctx ends. name names the table in errors.
func Synced(ctx context.Context, rec Waiter, rev statedb.Revision, name string) error {
	for {
		got, low, err := rec.WaitUntilReconciled(ctx, rev)
		if err != nil {
			return fmt.Errorf("%s reconciled to revision %d of %d: %w", name, got, rev, err)
		}
		if low == 0 || low > rev {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: writes since revision %d still failing: %w", name, low, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// PruneStale deletes each key of have that want lacks, going on past a
// failed delete; it returns how many went and the failures joined.
func PruneStale[K comparable](have []K, want map[K]struct{}, del func(K) error) (int, error) {
	var errs []error
	pruned := 0
	for _, k := range have {
		if _, ok := want[k]; ok {
			continue
		}
		if err := del(k); err != nil {
			errs = append(errs, fmt.Errorf("prune %v: %w", k, err))
			continue
		}
		pruned++
	}
	return pruned, errors.Join(errs...)
}
