// Package mapevents keeps, per BPF map, a bounded ring of the recent
// changes the agent's reconcilers made to it (GET /v1/map/{name}/events,
// as the Cilium v1 API's MapEvent stream): what key was updated or
// deleted with what value, when, and whether the write succeeded (the
// desired action still to do and the error when not). A reconciler's
// operations are wrapped (Ops), so every write is recorded where it is
// made, retries included.
package mapevents

import (
	"context"
	"iter"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/go-openapi/strfmt"
)

// DefaultSize is how many events a map's ring keeps.
const DefaultSize = 1024

// Ring is one map's recent events, oldest dropped first.
type Ring struct {
	mu     sync.Mutex
	events []models.MapEvent
	next   int
	full   bool
	// subs are the followers; a follower that does not keep up loses
	// events rather than slowing the reconciler.
	subs map[chan models.MapEvent]struct{}
	now  func() time.Time
}

// NewRing keeps the last size events.
func NewRing(size int) *Ring {
	if size <= 0 {
		size = DefaultSize
	}
	return &Ring{events: make([]models.MapEvent, size), subs: map[chan models.MapEvent]struct{}{}, now: time.Now}
}

// Record adds one event: action is update or delete; err is the write's
// outcome (nil: done, "ok").
func (r *Ring) Record(action, key, value string, err error) {
	if r == nil {
		return
	}
	ev := models.MapEvent{Action: action, Key: key, Value: value, DesiredAction: models.MapEventDesiredActionOk}
	if err != nil {
		ev.LastError = err.Error()
		ev.DesiredAction = models.MapEventDesiredActionInsert
		if action == models.MapEventActionDelete {
			ev.DesiredAction = models.MapEventDesiredActionDelete
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ev.Timestamp = strfmt.DateTime(r.now())
	r.events[r.next] = ev
	r.next = (r.next + 1) % len(r.events)
	if r.next == 0 {
		r.full = true
	}
	for ch := range r.subs {
		select {
		case ch <- ev:
		default:
		}
	}
}

// Events returns the ring's events, oldest first.
func (r *Ring) Events() []models.MapEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.snapshotLocked()
}

func (r *Ring) snapshotLocked() []models.MapEvent {
	var out []models.MapEvent
	if r.full {
		out = append(out, r.events[r.next:]...)
	}
	return append(out, r.events[:r.next]...)
}

// Follow returns the events so far and a channel of those after, until
// ctx ends (the channel is then closed).
func (r *Ring) Follow(ctx context.Context) ([]models.MapEvent, <-chan models.MapEvent) {
	ch := make(chan models.MapEvent, 256)
	r.mu.Lock()
	past := r.snapshotLocked()
	r.subs[ch] = struct{}{}
	r.mu.Unlock()
	go func() {
		<-ctx.Done()
		r.mu.Lock()
		delete(r.subs, ch)
		close(ch)
		r.mu.Unlock()
	}()
	return past, ch
}

// Registry holds the rings of the maps that record events, by the map's
// pinned name.
type Registry struct {
	mu    sync.Mutex
	rings map[string]*Ring
	size  int
}

// NewRegistry makes rings of size events.
func NewRegistry(size int) *Registry { return &Registry{rings: map[string]*Ring{}, size: size} }

// Ring returns the ring of map name, made on first use. A nil Registry
// returns a nil Ring, which records nothing.
func (g *Registry) Ring(name string) *Ring {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.rings[name]
	if !ok {
		r = NewRing(g.size)
		g.rings[name] = r
	}
	return r
}

// Lookup returns map name's ring, if it records events.
func (g *Registry) Lookup(name string) (*Ring, bool) {
	if g == nil {
		return nil, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.rings[name]
	return r, ok
}

// Names are the maps that record events.
func (g *Registry) Names() iter.Seq[string] {
	return func(yield func(string) bool) {
		if g == nil {
			return
		}
		g.mu.Lock()
		names := make([]string, 0, len(g.rings))
		for n := range g.rings {
			names = append(names, n)
		}
		g.mu.Unlock()
		for _, n := range names {
			if !yield(n) {
				return
			}
		}
	}
}

// Describe says what an object is in a map: its key and value as text.
type Describe[Obj any] func(Obj) (key, value string)

// Ops records every Update and Delete of the wrapped operations in ring
// (nil: records nothing). Prune is passed through.
func Ops[Obj any](ops reconciler.Operations[Obj], ring *Ring, describe Describe[Obj]) reconciler.Operations[Obj] {
	if ring == nil {
		return ops
	}
	return recordingOps[Obj]{ops: ops, ring: ring, describe: describe}
}

type recordingOps[Obj any] struct {
	ops      reconciler.Operations[Obj]
	ring     *Ring
	describe Describe[Obj]
}

func (o recordingOps[Obj]) Update(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, obj Obj) error {
	err := o.ops.Update(ctx, txn, rev, obj)
	k, v := o.describe(obj)
	o.ring.Record(models.MapEventActionUpdate, k, v, err)
	return err
}

func (o recordingOps[Obj]) Delete(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, obj Obj) error {
	err := o.ops.Delete(ctx, txn, rev, obj)
	k, v := o.describe(obj)
	o.ring.Record(models.MapEventActionDelete, k, v, err)
	return err
}

func (o recordingOps[Obj]) Prune(ctx context.Context, txn statedb.ReadTxn, objs iter.Seq2[Obj, statedb.Revision]) error {
	return o.ops.Prune(ctx, txn, objs)
}

// BatchOps records every entry of the wrapped batch operations' rounds.
func BatchOps[Obj any](ops reconciler.BatchOperations[Obj], ring *Ring, describe Describe[Obj]) reconciler.BatchOperations[Obj] {
	if ring == nil || ops == nil {
		return ops
	}
	return recordingBatch[Obj]{ops: ops, ring: ring, describe: describe}
}

type recordingBatch[Obj any] struct {
	ops      reconciler.BatchOperations[Obj]
	ring     *Ring
	describe Describe[Obj]
}

func (o recordingBatch[Obj]) UpdateBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[Obj]) {
	o.ops.UpdateBatch(ctx, txn, batch)
	for _, e := range batch {
		k, v := o.describe(e.Object)
		o.ring.Record(models.MapEventActionUpdate, k, v, e.Result)
	}
}

func (o recordingBatch[Obj]) DeleteBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[Obj]) {
	o.ops.DeleteBatch(ctx, txn, batch)
	for _, e := range batch {
		k, v := o.describe(e.Object)
		o.ring.Record(models.MapEventActionDelete, k, v, e.Result)
	}
}
