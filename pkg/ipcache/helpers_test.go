package ipcache

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// startCache runs an IPCache over b in a hive of its own (statedb, jobs,
// the reconciler), stopped when the test ends. (ipcachetest does the same
// for other packages; it cannot serve this package's own tests.)
func startCache(tb testing.TB, b Backend, opts ...reconciler.Option) *IPCache {
	tb.Helper()
	var c *IPCache
	h := hive.New(
		statedb.Cell,
		job.Cell,
		cell.Provide(func() cell.Health { hl, _ := cell.NewSimpleHealth(); return hl }),
		cell.Module("ipcache-test", "ipcache under test",
			cell.Invoke(func(db *statedb.DB, jobs job.Registry, hl cell.Health, id cell.FullModuleID, log *slog.Logger) error {
				var err error
				c, err = New(Params{DB: db, Jobs: jobs.NewGroup(hl), Log: log, ModuleID: id, Backend: b, Options: opts})
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
	return c
}

// synced waits until the backend holds every change so far.
func synced(tb testing.TB, c *IPCache) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Synced(ctx); err != nil {
		tb.Fatal(err)
	}
}
