package ui

import (
	"sync"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

// Store keeps the most recent flows read from the relay and hands each new
// one to the live subscribers (the page's streams).
type Store struct {
	mu   sync.Mutex
	buf  []*flowpb.Flow
	next uint64 // flows ever added; buf[next%len] is the oldest when full
	subs map[*Subscription]struct{}
}

// NewStore keeps up to capacity flows.
func NewStore(capacity int) *Store {
	if capacity <= 0 {
		capacity = 1
	}
	return &Store{buf: make([]*flowpb.Flow, capacity), subs: map[*Subscription]struct{}{}}
}

// Add keeps f and offers it to every subscription. A subscriber that does
// not keep up loses flows (counted in its Skipped) rather than slowing the
// reader of the relay.
func (s *Store) Add(f *flowpb.Flow) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf[s.next%uint64(len(s.buf))] = f
	s.next++
	for sub := range s.subs {
		if sub.match != nil && !sub.match.Match(f) {
			continue
		}
		select {
		case sub.C <- f:
		default:
			sub.skipped++
		}
	}
}

// Len is how many flows the store holds.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(min(s.next, uint64(len(s.buf))))
}

// Seen is how many flows were ever added.
func (s *Store) Seen() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next
}

// Flows are the flows held, oldest first, that match m (all when nil).
func (s *Store) Flows(m *Matcher) []*flowpb.Flow {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(s.next, uint64(len(s.buf)))
	out := make([]*flowpb.Flow, 0, n)
	for i := s.next - n; i < s.next; i++ {
		f := s.buf[i%uint64(len(s.buf))]
		if m == nil || m.Match(f) {
			out = append(out, f)
		}
	}
	return out
}

// Subscription receives the flows added after it was made that match its
// query.
type Subscription struct {
	C       chan *flowpb.Flow
	match   *Matcher
	skipped uint64
}

// Subscribe starts a subscription with room for buffer flows.
func (s *Store) Subscribe(m *Matcher, buffer int) *Subscription {
	sub := &Subscription{C: make(chan *flowpb.Flow, buffer), match: m}
	s.mu.Lock()
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	return sub
}

// Unsubscribe ends sub.
func (s *Store) Unsubscribe(sub *Subscription) {
	s.mu.Lock()
	delete(s.subs, sub)
	s.mu.Unlock()
}

// Skipped is how many flows sub lost because it fell behind.
func (s *Store) Skipped(sub *Subscription) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sub.skipped
}
