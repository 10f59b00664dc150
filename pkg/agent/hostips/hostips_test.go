package hostips

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
)

// TestNilWithoutDatapath: without the datapath (a nil module) the cell
// builds and starts, its Sync is nil and it appends no "host-ips-ct-gc"
// step: nothing reads the host's addresses or runs a conntrack GC.
func TestNilWithoutDatapath(t *testing.T) {
	var (
		s     *Sync
		steps *lifecycle.Steps
	)
	h := hive.New(
		cell.Invoke(func(lifecycle.InvokedAll) {}),
		statedb.Cell,
		job.Cell,
		cell.Provide(
			func() *agentdatapath.Module { return nil },
			func() *hostdev.Masquerade { return nil },
			func() Endpoints { return nil },
			health.NewRegistry,
			lifecycle.NewSteps,
		),
		Cell,
		cell.Invoke(func(sync *Sync, st *lifecycle.Steps) { s, steps = sync, st }),
	)
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := h.Stop(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	if s != nil {
		t.Fatalf("host IPs' sync %+v without the datapath, want nil", s)
	}
	if slices.Contains(steps.Names(), "host-ips-ct-gc") {
		t.Fatalf("steps %v without the datapath include host-ips-ct-gc", steps.Names())
	}
}

// TestNextCTGCInterval: the conntrack GC's interval halves when a run
// deleted more than a quarter of the entries, doubles when it deleted
// less than 5% (or saw none), stays otherwise, within [min, max].
func TestNextCTGCInterval(t *testing.T) {
	const minI, maxI = 10 * time.Second, 12 * time.Minute
	for _, tc := range []struct {
		cur           time.Duration
		seen, deleted int
		want          time.Duration
	}{
		{time.Minute, 100, 26, 30 * time.Second}, // churn: halve
		{time.Minute, 100, 25, time.Minute},      // a quarter exactly: stay
		{time.Minute, 100, 5, time.Minute},       // 5% exactly: stay
		{time.Minute, 100, 4, 2 * time.Minute},   // quiet: double
		{time.Minute, 0, 0, 2 * time.Minute},     // empty table: double
		{15 * time.Second, 10, 10, minI},         // not below min
		{10 * time.Minute, 1000, 0, maxI},        // not above max
	} {
		if got := NextCTGCInterval(tc.cur, tc.seen, tc.deleted, minI, maxI); got != tc.want {
			t.Errorf("NextCTGCInterval(%s, seen %d, deleted %d) = %s, want %s", tc.cur, tc.seen, tc.deleted, got, tc.want)
		}
	}
}
