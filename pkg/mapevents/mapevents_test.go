package mapevents

import (
	"context"
	"errors"
	"io"
	"iter"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
)

// TestRingKeepsTheLastEvents: a ring of 3 keeps the last three events,
// oldest first; a failed write says what is still to do and why.
func TestRingKeepsTheLastEvents(t *testing.T) {
	r := NewRing(3)
	for i, k := range []string{"a", "b", "c", "d"} {
		var err error
		if i == 3 {
			err = errors.New("map full")
		}
		r.Record(models.MapEventActionUpdate, k, "v", err)
	}
	r.Record(models.MapEventActionDelete, "e", "", errors.New("busy"))
	evs := r.Events()
	if len(evs) != 3 || evs[0].Key != "c" || evs[1].Key != "d" || evs[2].Key != "e" {
		t.Fatalf("events %+v, want c, d, e", evs)
	}
	if evs[0].DesiredAction != models.MapEventDesiredActionOk || evs[0].LastError != "" {
		t.Errorf("a write that worked: %+v", evs[0])
	}
	if evs[1].DesiredAction != models.MapEventDesiredActionInsert || evs[1].LastError != "map full" {
		t.Errorf("a failed update: %+v", evs[1])
	}
	if evs[2].DesiredAction != models.MapEventDesiredActionDelete || evs[2].Action != models.MapEventActionDelete {
		t.Errorf("a failed delete: %+v", evs[2])
	}

	ctx, cancel := context.WithCancel(context.Background())
	past, next := r.Follow(ctx)
	if len(past) != 3 {
		t.Fatalf("follow's past: %d events", len(past))
	}
	r.Record(models.MapEventActionUpdate, "f", "v", nil)
	if ev := <-next; ev.Key != "f" {
		t.Fatalf("followed event %+v", ev)
	}
	cancel()
	for range next {
	}
}

type obj struct {
	Key    string
	Status reconciler.Status
}

func (o *obj) TableHeader() []string { return []string{"Key"} }
func (o *obj) TableRow() []string    { return []string{o.Key} }

// flakyOps fails its first write.
type flakyOps struct {
	mu     sync.Mutex
	failed bool
}

func (f *flakyOps) Update(context.Context, statedb.ReadTxn, statedb.Revision, *obj) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.failed {
		f.failed = true
		return errors.New("injected write error")
	}
	return nil
}

func (f *flakyOps) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *obj) error {
	return nil
}

func (f *flakyOps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*obj, statedb.Revision]) error {
	return nil
}

// TestOpsRecordsAReconcilersWrites: a statedb reconciler over wrapped
// operations records its failed write, the retry that lands and the
// delete, in that order.
func TestOpsRecordsAReconcilersWrites(t *testing.T) {
	ring := NewRing(16)
	idx := statedb.Index[*obj, string]{Name: "key", FromObject: func(o *obj) index.KeySet { return index.NewKeySet(index.String(o.Key)) }, FromKey: index.String, Unique: true}
	var db *statedb.DB
	var tbl statedb.RWTable[*obj]
	h := hive.New(statedb.Cell, job.Cell,
		cell.Provide(func() cell.Health { hl, _ := cell.NewSimpleHealth(); return hl }),
		cell.Module("mapevents-test", "map events under test",
			cell.Invoke(func(d *statedb.DB, jobs job.Registry, hl cell.Health, id cell.FullModuleID, log *slog.Logger) error {
				db = d
				var err error
				if tbl, err = statedb.NewTable(d, "objs", idx); err != nil {
					return err
				}
				_, err = reconciler.Register(reconciler.Params{Log: log, DB: d, JobGroup: jobs.NewGroup(hl), ModuleID: id}, tbl,
					func(o *obj) *obj { c := *o; return &c }, func(o *obj, s reconciler.Status) *obj { o.Status = s; return o }, func(o *obj) reconciler.Status { return o.Status },
					Ops[*obj](&flakyOps{}, ring, func(o *obj) (string, string) { return o.Key, "value of " + o.Key }), nil,
					reconciler.WithRetry(10*time.Millisecond, 10*time.Millisecond))
				return err
			})))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := h.Start(quiet, context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Stop(quiet, context.Background()) }()
	k := netip.MustParsePrefix("10.0.0.0/8").String()
	w := db.WriteTxn(tbl)
	_, _, _ = tbl.Insert(w, &obj{Key: k, Status: reconciler.StatusPending()})
	w.Commit()
	wait := func(n int) []models.MapEvent {
		deadline := time.Now().Add(30 * time.Second)
		for {
			if evs := ring.Events(); len(evs) >= n {
				return evs
			}
			if time.Now().After(deadline) {
				t.Fatalf("never %d events: %+v", n, ring.Events())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	evs := wait(2)
	if evs[0].LastError == "" || evs[0].DesiredAction != models.MapEventDesiredActionInsert || evs[1].DesiredAction != models.MapEventDesiredActionOk || evs[1].Value != "value of "+k {
		t.Fatalf("failed write then retry: %+v", evs)
	}
	w = db.WriteTxn(tbl)
	_, _, _ = tbl.Delete(w, &obj{Key: k})
	w.Commit()
	evs = wait(3)
	if evs[2].Action != models.MapEventActionDelete || evs[2].Key != k {
		t.Fatalf("delete: %+v", evs[2])
	}
}
