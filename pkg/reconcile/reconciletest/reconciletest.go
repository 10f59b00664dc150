// Package reconciletest runs a reconciled statedb table's constructor in a
// hive of its own (statedb, jobs, a health reporter), for the tests of the
// packages that register such tables, without the agent's hive.
package reconciletest

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
)

// Deps are what a table's constructor takes from the hive.
type Deps struct {
	DB       *statedb.DB
	Jobs     job.Group
	Log      *slog.Logger
	ModuleID cell.FullModuleID
}

// Run builds the hive, calls register in a module named name with its
// deps, starts the hive and returns stop (idempotent; a failed stop fails
// the test). A benchmark stops each iteration's hive so that their tables
// do not pile up in the heap.
func Run(tb testing.TB, name string, register func(Deps) error) (stop func()) {
	tb.Helper()
	h := hive.New(
		statedb.Cell,
		job.Cell,
		cell.Provide(func() cell.Health { hl, _ := cell.NewSimpleHealth(); return hl }),
		cell.Module(name, name+" under test",
			cell.Invoke(func(db *statedb.DB, jobs job.Registry, hl cell.Health, id cell.FullModuleID, log *slog.Logger) error {
				return register(Deps{DB: db, Jobs: jobs.NewGroup(hl), Log: log, ModuleID: id})
			})),
	)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := h.Start(quiet, context.Background()); err != nil {
		tb.Fatal(err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if err := h.Stop(quiet, context.Background()); err != nil {
				tb.Error(err)
			}
		})
	}
}

// Start is Run with the hive stopped when the test ends.
func Start(tb testing.TB, name string, register func(Deps) error) {
	tb.Helper()
	tb.Cleanup(Run(tb, name, register))
}
