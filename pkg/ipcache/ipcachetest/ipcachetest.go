// Package ipcachetest runs an ipcache, with its statedb table and its
// reconciler, over a given backend in a hive of its own, for tests and
// benchmarks of what writes through the ipcache.
package ipcachetest

import (
	"context"
	"testing"
	"time"

	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/reconcile/reconciletest"
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
	stop = reconciletest.Run(tb, "ipcache-test", func(d reconciletest.Deps) error {
		var err error
		c, err = ipcache.New(ipcache.Params{DB: d.DB, Jobs: d.Jobs, Log: d.Log, ModuleID: d.ModuleID, Backend: b, Options: opts})
		return err
	})
	return c, stop
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
