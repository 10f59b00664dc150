package kvstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// EventType is the kind of a ListAndWatch event.
type EventType int

// Event types.
const (
	// EventCreate: a key the watcher had not seen (or had seen deleted).
	EventCreate EventType = iota + 1
	// EventModify: a new value of a key the watcher had seen.
	EventModify
	// EventDelete: a key the watcher had seen is gone.
	EventDelete
	// EventListDone: the initial list is complete; every key that existed
	// then has been delivered. Sent once.
	EventListDone
)

func (t EventType) String() string {
	switch t {
	case EventCreate:
		return "create"
	case EventModify:
		return "modify"
	case EventDelete:
		return "delete"
	case EventListDone:
		return "list-done"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is a change of a key under a watched prefix.
type Event struct {
	Type EventType
	Key  string
	// Value is the new value (nil for deletes and the list marker).
	Value []byte
	// Lease is the lease the key is bound to (0: none).
	Lease int64
	// Revision is the key's modification revision (for a delete, the
	// revision of the deletion or of the list that found the key gone).
	Revision int64
}

// ListAndWatch delivers the keys under prefix and then their changes.
// First every existing key as EventCreate, then one EventListDone, then
// changes as they happen. The watch starts at the list's revision + 1, so
// nothing between list and watch is missed. When the watch fails (etcd
// compacted the revisions it needed, lost its leader, or the stream broke
// for good) the prefix is listed again and the difference against what was
// already delivered is sent: EventCreate for new keys, EventModify for
// changed ones, EventDelete for keys that vanished meanwhile; unchanged
// keys produce nothing. Reconnects inside the etcd client resume the watch
// where it was. The channel is closed when ctx ends or the client closes.
func (c *Client) ListAndWatch(ctx context.Context, prefix string) <-chan Event {
	out := make(chan Event, 64)
	w := &listWatcher{c: c, prefix: prefix, out: out, known: map[string]int64{}}
	ctx, cancel := context.WithCancel(ctx)
	stopWithClient := context.AfterFunc(c.ctx, cancel)
	go func() {
		defer cancel()
		defer stopWithClient()
		w.run(ctx)
	}()
	return out
}

// listWatcher is one ListAndWatch stream.
type listWatcher struct {
	c      *Client
	prefix string
	out    chan<- Event
	// known maps each key delivered (and not deleted since) to the
	// revision delivered, so that a re-list sends only differences.
	known    map[string]int64
	listDone bool
}

// errStopped means ctx ended while sending.
var errStopped = errors.New("list and watch stopped")

func (w *listWatcher) run(ctx context.Context) {
	defer close(w.out)
	b := newBackoff(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		rev, err := w.list(ctx)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, errStopped) {
				w.c.log.Warn("kvstore list failed; retrying", "prefix", w.prefix, "error", err)
				_ = b.wait(ctx)
			}
			continue
		}
		b.reset()
		err = w.watch(ctx, rev+1)
		if ctx.Err() != nil || errors.Is(err, errStopped) {
			return
		}
		w.c.log.Info("kvstore watch ended; listing again", "prefix", w.prefix, "error", err)
		// A watch that fails at once (no leader) would otherwise re-list
		// in a tight loop.
		_ = b.wait(ctx)
	}
}

func (w *listWatcher) send(ctx context.Context, ev Event) error {
	select {
	case w.out <- ev:
		return nil
	case <-ctx.Done():
		return errStopped
	}
}

// list sends the prefix's keys page by page, then deletes for known keys
// that are gone, and returns the list's revision.
func (w *listWatcher) list(ctx context.Context) (int64, error) {
	seen := make(map[string]bool, len(w.known))
	rev, err := w.c.listPages(ctx, w.prefix, func(page []KeyValue) error {
		for _, kv := range page {
			seen[kv.Key] = true
			prev, ok := w.known[kv.Key]
			if ok && prev == kv.ModRevision {
				continue
			}
			typ := EventCreate
			if ok {
				typ = EventModify
			}
			w.known[kv.Key] = kv.ModRevision
			if err := w.send(ctx, Event{Type: typ, Key: kv.Key, Value: kv.Value, Lease: kv.Lease, Revision: kv.ModRevision}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, key := range slices.Sorted(maps.Keys(w.known)) {
		if seen[key] {
			continue
		}
		delete(w.known, key)
		if err := w.send(ctx, Event{Type: EventDelete, Key: key, Revision: rev}); err != nil {
			return 0, err
		}
	}
	if !w.listDone {
		w.listDone = true
		if err := w.send(ctx, Event{Type: EventListDone, Revision: rev}); err != nil {
			return 0, err
		}
	}
	return rev, nil
}

// watch sends changes from revision from on, until the watch fails
// (returned) or ctx ends.
func (w *listWatcher) watch(ctx context.Context, from int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel() // closes the watch stream
	// Require a leader: a member cut off from the cluster would otherwise
	// keep the watch open and silently deliver nothing.
	ch := w.c.etcd.Watch(clientv3.WithRequireLeader(wctx), w.prefix, clientv3.WithPrefix(), clientv3.WithRev(from))
	for resp := range ch {
		if err := resp.Err(); err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) {
				return fmt.Errorf("revision %d compacted (oldest kept %d): %w", from, resp.CompactRevision, err)
			}
			return fmt.Errorf("watch %q: %w", w.prefix, err)
		}
		for _, ev := range resp.Events {
			key := string(ev.Kv.Key)
			if ev.Type == clientv3.EventTypeDelete {
				if _, ok := w.known[key]; !ok {
					continue // never delivered, so nothing to undo
				}
				delete(w.known, key)
				if err := w.send(ctx, Event{Type: EventDelete, Key: key, Revision: ev.Kv.ModRevision}); err != nil {
					return err
				}
				continue
			}
			typ := EventCreate
			if _, ok := w.known[key]; ok {
				typ = EventModify
			}
			w.known[key] = ev.Kv.ModRevision
			if err := w.send(ctx, Event{Type: typ, Key: key, Value: ev.Kv.Value, Lease: ev.Kv.Lease, Revision: ev.Kv.ModRevision}); err != nil {
				return err
			}
		}
	}
	return fmt.Errorf("watch %q: channel closed", w.prefix)
}
