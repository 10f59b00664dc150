package observer

import (
	"sync"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

// DefaultRingCapacity is the number of flows a ring keeps by default (as
// Hubble's: one less than a power of two).
const DefaultRingCapacity = 4095

// Ring keeps the last flows written, each with a sequence number (the
// count of flows written before it). Readers address flows by sequence
// number, so a reader that falls behind learns how many it missed. Safe
// for concurrent use.
type Ring struct {
	mu   sync.Mutex
	buf  []*flowpb.Flow
	next uint64 // sequence number of the next flow written
	// wake is closed (and replaced) at the first write after Bounds
	// handed it out: followers wait on it. Without one (woken is set)
	// a write neither closes nor allocates a channel: every flow is
	// written, few are followed.
	wake  chan struct{}
	woken bool
}

// NewRing returns a ring of capacity flows (DefaultRingCapacity when
// capacity is not positive).
func NewRing(capacity int) *Ring {
	if capacity <= 0 {
		capacity = DefaultRingCapacity
	}
	return &Ring{buf: make([]*flowpb.Flow, capacity), woken: true}
}

// Write adds a flow, overwriting the oldest when full. The ring keeps the
// pointer: the flow must not change afterwards.
func (r *Ring) Write(f *flowpb.Flow) {
	r.mu.Lock()
	r.buf[r.next%uint64(len(r.buf))] = f
	r.next++
	if !r.woken {
		close(r.wake)
		r.woken = true
	}
	r.mu.Unlock()
}

// Cap is the ring's capacity.
func (r *Ring) Cap() int { return len(r.buf) }

// Len is the number of flows the ring holds.
func (r *Ring) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int(min(r.next, uint64(len(r.buf))))
}

// Seen is the number of flows ever written.
func (r *Ring) Seen() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.next
}

// Bounds returns the sequence numbers of the oldest flow held and of the
// next flow to be written, and a channel closed at the next write.
func (r *Ring) Bounds() (oldest, next uint64, wake <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	oldest = 0
	if r.next > uint64(len(r.buf)) {
		oldest = r.next - uint64(len(r.buf))
	}
	if r.woken {
		r.wake = make(chan struct{})
		r.woken = false
	}
	return oldest, r.next, r.wake
}

// At returns the flow of sequence number seq, or false when it was
// overwritten or not written yet.
func (r *Ring) At(seq uint64) (*flowpb.Flow, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq >= r.next || r.next-seq > uint64(len(r.buf)) {
		return nil, false
	}
	return r.buf[seq%uint64(len(r.buf))], true
}
