package ipcache

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/pkg/mapevents"
	"github.com/tendril-net/tendril/pkg/reconcile/reconciletest"
)

// TestMapEventsRecordTheWrites: with a ring, the reconciler's writes of
// the map (the batch update, a failed write and its retry, the delete)
// are recorded with the prefix and its identity, in order.
func TestMapEventsRecordTheWrites(t *testing.T) {
	ring := mapevents.NewRing(16)
	b := &batchBackend{fakeBackend: &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}}}
	var c *IPCache
	reconciletest.Start(t, "ipcache-test", func(d reconciletest.Deps) error {
		var err error
		c, err = New(Params{DB: d.DB, Jobs: d.Jobs, Log: d.Log, ModuleID: d.ModuleID, Backend: b, Events: ring})
		return err
	})
	pod, bad := netip.MustParsePrefix("10.244.1.7/32"), netip.MustParsePrefix("10.244.1.8/32")
	b.setFail(bad, true)
	if err := c.Upsert(pod, Entry{Identity: 300, Source: SourceLocal, Owner: "endpoint/7"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Upsert(bad, Entry{Identity: 301, Source: SourceLocal, Owner: "endpoint/8"}); err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, ok func([]models.MapEvent) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !ok(ring.Events()) {
			if time.Now().After(deadline) {
				t.Fatalf("never %s: %+v", what, ring.Events())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	has := func(key, action, desired string, withErr bool) func([]models.MapEvent) bool {
		return func(evs []models.MapEvent) bool {
			for _, ev := range evs {
				if ev.Key == key && ev.Action == action && ev.DesiredAction == desired && (ev.LastError != "") == withErr {
					return true
				}
			}
			return false
		}
	}
	waitFor("the pod's update", has(pod.String(), "update", "ok", false))
	waitFor("the failed write", has(bad.String(), "update", "insert", true))
	b.setFail(bad, false)
	waitFor("the retry", has(bad.String(), "update", "ok", false))
	if err := c.Delete(pod, SourceLocal, "endpoint/7"); err != nil {
		t.Fatal(err)
	}
	waitFor("the delete", has(pod.String(), "delete", "ok", false))
	for _, ev := range ring.Events() {
		if ev.Key == pod.String() && ev.Action == "update" && ev.Value != "identity=300 source=local" {
			t.Errorf("value %q", ev.Value)
		}
	}
}
