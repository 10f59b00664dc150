package ipcache

import (
	"context"
	"testing"
	"time"

	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/reconcile/reconciletest"
)

// startCache runs an IPCache over b in a hive of its own (statedb, jobs,
// the reconciler), stopped when the test ends. (ipcachetest does the same
// for other packages; it cannot serve this package's own tests.)
func startCache(tb testing.TB, b Backend, opts ...reconciler.Option) *IPCache {
	tb.Helper()
	var c *IPCache
	reconciletest.Start(tb, "ipcache-test", func(d reconciletest.Deps) error {
		var err error
		c, err = New(Params{DB: d.DB, Jobs: d.Jobs, Log: d.Log, ModuleID: d.ModuleID, Backend: b, Options: opts})
		return err
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
