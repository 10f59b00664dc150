package endpointmanager

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// regenQueue holds the endpoints due for a regeneration, each at most once,
// ordered by when they are due (now, or after a failure's backoff). An
// endpoint being regenerated is never handed out a second time: a request
// for it waits until its regeneration is done, so no regeneration is lost
// and none runs twice at once.
type regenQueue struct {
	now func() time.Time

	mu     sync.Mutex
	byID   map[uint16]*queued
	due    dueHeap
	busy   map[uint16]*queued // handed out; a non-nil value is queued on done
	wakeup chan struct{}
}

// queued is one endpoint waiting for its regeneration.
type queued struct {
	id     uint16
	at     time.Time
	reason string
	index  int // in the heap
}

func newRegenQueue(now func() time.Time) *regenQueue {
	return &regenQueue{now: now, byID: map[uint16]*queued{}, busy: map[uint16]*queued{}, wakeup: make(chan struct{}, 1)}
}

// add asks for a regeneration of id after delay. A request for an endpoint
// already waiting keeps the earlier of the two times; one for an endpoint
// being regenerated is queued when that regeneration is done.
func (q *regenQueue) add(id uint16, reason string, delay time.Duration) {
	at := q.now().Add(delay)
	q.mu.Lock()
	defer q.mu.Unlock()
	if next, isBusy := q.busy[id]; isBusy {
		if next == nil || at.Before(next.at) {
			q.busy[id] = &queued{id: id, at: at, reason: reason}
		}
		return
	}
	q.pushLocked(&queued{id: id, at: at, reason: reason})
}

// ensure queues id now unless it is already waiting or being regenerated
// (a waiting endpoint keeps its backoff).
func (q *regenQueue) ensure(id uint16, reason string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, isBusy := q.busy[id]; isBusy {
		return
	}
	if _, waiting := q.byID[id]; waiting {
		return
	}
	q.pushLocked(&queued{id: id, at: q.now(), reason: reason})
}

func (q *regenQueue) pushLocked(it *queued) {
	if cur, ok := q.byID[it.id]; ok {
		if it.at.Before(cur.at) {
			cur.at, cur.reason = it.at, it.reason
			heap.Fix(&q.due, cur.index)
			q.signal()
		}
		return
	}
	q.byID[it.id] = it
	heap.Push(&q.due, it)
	q.signal()
}

// signal wakes one waiting worker (a wakeup already pending is enough).
func (q *regenQueue) signal() {
	select {
	case q.wakeup <- struct{}{}:
	default:
	}
}

// remove forgets a deleted endpoint's request.
func (q *regenQueue) remove(id uint16) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it, ok := q.byID[id]; ok {
		heap.Remove(&q.due, it.index)
		delete(q.byID, id)
	}
	if _, isBusy := q.busy[id]; isBusy {
		q.busy[id] = nil
	}
}

// get waits for the next due endpoint and marks it busy; false when ctx
// ends.
func (q *regenQueue) get(ctx context.Context) (uint16, string, bool) {
	for {
		q.mu.Lock()
		var wait time.Duration
		if len(q.due) > 0 {
			top := q.due[0]
			if wait = top.at.Sub(q.now()); wait <= 0 {
				heap.Pop(&q.due)
				delete(q.byID, top.id)
				q.busy[top.id] = nil
				if len(q.due) > 0 {
					q.signal() // another worker may take the next one
				}
				q.mu.Unlock()
				return top.id, top.reason, true
			}
		}
		q.mu.Unlock()
		var timer *time.Timer
		var fired <-chan time.Time
		if wait > 0 {
			timer = time.NewTimer(wait)
			fired = timer.C
		}
		select {
		case <-ctx.Done():
		case <-q.wakeup:
		case <-fired:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return 0, "", false
		}
	}
}

// done ends id's regeneration and queues what was asked for meanwhile.
func (q *regenQueue) done(id uint16) {
	q.mu.Lock()
	defer q.mu.Unlock()
	next := q.busy[id]
	delete(q.busy, id)
	if next != nil {
		q.pushLocked(next)
	}
}

// state reports whether id waits (and until when) or is being regenerated.
func (q *regenQueue) state(id uint16) (waitingUntil time.Time, waiting, busy bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it, ok := q.byID[id]; ok {
		return it.at, true, false
	}
	_, busy = q.busy[id]
	return time.Time{}, false, busy
}

// dueHeap orders waiting endpoints by due time.
type dueHeap []*queued

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *dueHeap) Push(x any) {
	it := x.(*queued)
	it.index = len(*h)
	*h = append(*h, it)
}
func (h *dueHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}
