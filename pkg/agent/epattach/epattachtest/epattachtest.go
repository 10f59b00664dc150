// Package epattachtest runs the endpoints table, with its reconciler,
// over a given kernel in a hive of its own, for tests and benchmarks of
// what writes endpoints without starting the agent's hive.
package epattachtest

import (
	"testing"

	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/agent/epattach"
	"github.com/tendril-net/tendril/pkg/reconcile/reconciletest"
)

// Start runs the endpoints table over k (statedb, jobs, the reconciler),
// stopped when the test ends.
func Start(tb testing.TB, k epattach.Kernel, opts ...reconciler.Option) *epattach.Table {
	tb.Helper()
	var t *epattach.Table
	reconciletest.Start(tb, "endpoints-table-test", func(d reconciletest.Deps) error {
		var err error
		t, err = epattach.Register(epattach.Deps{DB: d.DB, Jobs: d.Jobs, Log: d.Log, ModuleID: d.ModuleID, Kernel: k, Options: opts})
		return err
	})
	return t
}
