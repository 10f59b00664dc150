// Package epattachtest runs the endpoints table, with its reconciler,
// over a given kernel in a hive of its own, for tests and benchmarks of
// what writes endpoints without starting the agent's hive.
package epattachtest

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/datapath/epattach"
)

// Start runs the endpoints table over k (statedb, jobs, the reconciler),
// stopped when the test ends.
func Start(tb testing.TB, k epattach.Kernel, opts ...reconciler.Option) *epattach.Table {
	tb.Helper()
	var t *epattach.Table
	h := hive.New(
		statedb.Cell,
		job.Cell,
		cell.Provide(func() cell.Health { hl, _ := cell.NewSimpleHealth(); return hl }),
		cell.Module("endpoints-table-test", "endpoints table under test",
			cell.Invoke(func(db *statedb.DB, jobs job.Registry, hl cell.Health, id cell.FullModuleID, log *slog.Logger) error {
				var err error
				t, err = epattach.Register(epattach.Deps{DB: db, Jobs: jobs.NewGroup(hl), Log: log, ModuleID: id, Kernel: k, Options: opts})
				return err
			})),
	)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := h.Start(quiet, context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := h.Stop(quiet, context.Background()); err != nil {
			tb.Error(err)
		}
	})
	return t
}
