// Package ipcachetest runs an ipcache, with its statedb table and its
// reconciler, over a given backend in a hive of its own, for tests and
// benchmarks of what writes through the ipcache.
package ipcachetest

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/ipcache"
)

// Start runs an IPCache over b (statedb, jobs, the reconciler), stopped
// when the test ends.
func Start(tb testing.TB, b ipcache.Backend, opts ...reconciler.Option) *ipcache.IPCache {
	tb.Helper()
	c, stop := Run(tb, b, opts...)
	tb.Cleanup(stop)
	return c
}

// Run runs an IPCache over b until stop is called (a benchmark stops each
// iteration's, so that their tables do not pile up in the heap).
func Run(tb testing.TB, b ipcache.Backend, opts ...reconciler.Option) (c *ipcache.IPCache, stop func()) {
	tb.Helper()
	h := hive.New(
		statedb.Cell,
		job.Cell,
		cell.Provide(func() cell.Health { hl, _ := cell.NewSimpleHealth(); return hl }),
		cell.Module("ipcache-test", "ipcache under test",
			cell.Invoke(func(db *statedb.DB, jobs job.Registry, hl cell.Health, id cell.FullModuleID, log *slog.Logger) error {
				var err error
				c, err = ipcache.New(ipcache.Params{DB: db, Jobs: jobs.NewGroup(hl), Log: log, ModuleID: id, Backend: b, Options: opts})
				return err
			})),
	)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := h.Start(quiet, context.Background()); err != nil {
		tb.Fatal(err)
	}
	var once sync.Once
	return c, func() {
		once.Do(func() {
			if err := h.Stop(quiet, context.Background()); err != nil {
				tb.Error(err)
			}
		})
	}
}

// Synced waits (up to 30 s) until the backend holds every change so far.
func Synced(tb testing.TB, c *ipcache.IPCache) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Synced(ctx); err != nil {
		tb.Fatal(err)
	}
}
