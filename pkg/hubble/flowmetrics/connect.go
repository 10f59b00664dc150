package flowmetrics

import (
	"sync"
	"time"
)

// connKey is a TCP connection as its SYN goes: client to server.
type connKey struct {
	src, dst     string
	sport, dport uint32
}

// pendingConnect is a SYN waiting for its SYN-ACK, with the labels its
// round trip will be recorded under (taken from the SYN: the destination
// the client asked for).
type pendingConnect struct {
	at                time.Time
	service, workload string
}

// connectTracker holds the SYNs waiting for their SYN-ACK: at most max,
// the oldest evicted first, and none older than PendingTimeout once a
// newer SYN arrives (a SYN whose SYN-ACK never came, or was lost to the
// event rate limit, must not stay forever).
type connectTracker struct {
	mu      sync.Mutex
	max     int
	pending map[connKey]pendingConnect
	// order is the keys in the order their SYN came (with stale keys of
	// connections already answered, skipped when reached).
	order []orderEntry
}

type orderEntry struct {
	key connKey
	at  time.Time
}

func newConnectTracker(max int) *connectTracker {
	return &connectTracker{max: max, pending: make(map[connKey]pendingConnect)}
}

// syn records a connection's SYN; a retransmitted SYN keeps the first
// one's time (the client has been waiting since then).
func (t *connectTracker) syn(k connKey, p pendingConnect) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.pending[k]; ok {
		return
	}
	t.expire(p.at.Add(-PendingTimeout))
	for len(t.pending) >= t.max && t.evictOldest() {
	}
	t.pending[k] = p
	t.order = append(t.order, orderEntry{key: k, at: p.at})
	if len(t.order) > 2*t.max+16 {
		t.compact()
	}
}

// synAck takes the connection's SYN, if it is waiting.
func (t *connectTracker) synAck(k connKey) (pendingConnect, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.pending[k]
	if ok {
		delete(t.pending, k)
	}
	return p, ok
}

// Len is the number of SYNs waiting.
func (t *connectTracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// live tells whether an order entry still stands for a waiting SYN.
func (t *connectTracker) live(e orderEntry) bool {
	p, ok := t.pending[e.key]
	return ok && p.at.Equal(e.at)
}

// expire drops the waiting SYNs sent before the deadline.
func (t *connectTracker) expire(before time.Time) {
	for len(t.order) > 0 {
		e := t.order[0]
		if t.live(e) && !e.at.Before(before) {
			return
		}
		if t.live(e) {
			delete(t.pending, e.key)
		}
		t.order = t.order[1:]
	}
}

// evictOldest drops the oldest waiting SYN; false when none is left.
func (t *connectTracker) evictOldest() bool {
	for len(t.order) > 0 {
		e := t.order[0]
		t.order = t.order[1:]
		if t.live(e) {
			delete(t.pending, e.key)
			return true
		}
	}
	return false
}

// compact drops the order entries of answered connections.
func (t *connectTracker) compact() {
	kept := make([]orderEntry, 0, len(t.pending))
	for _, e := range t.order {
		if t.live(e) {
			kept = append(kept, e)
		}
	}
	t.order = kept
}
