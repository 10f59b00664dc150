package ui

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

// Store keeps the most recent flows read from the relay and hands each new
// one to the live subscribers (the page's streams).
//
// Every flow added has a sequence number (the count of flows added before
// it). A Cursor names a position in that sequence, so a list of the flows
// held and a stream that starts where the list ended see each flow once:
// the page lists, then streams from the list's cursor, and whatever was
// added between the two comes first in the stream.
type Store struct {
	// epoch tells this store's cursors from those of another process (a
	// page reconnecting its stream after the UI restarted).
	epoch string

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
	var e [8]byte
	_, _ = rand.Read(e[:]) // crypto/rand.Read does not fail (Go 1.24)
	return &Store{epoch: hex.EncodeToString(e[:]), buf: make([]*flowpb.Flow, capacity), subs: map[*Subscription]struct{}{}}
}

// Entry is a flow with its sequence number.
type Entry struct {
	Seq  uint64
	Flow *flowpb.Flow
}

// Add keeps f and offers it to every subscription. A subscriber that does
// not keep up loses flows (counted in its Skipped) rather than slowing the
// reader of the relay.
func (s *Store) Add(f *flowpb.Flow) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq := s.next
	s.buf[seq%uint64(len(s.buf))] = f
	s.next++
	for sub := range s.subs {
		sub.offer(Entry{Seq: seq, Flow: f})
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
	flows, _ := s.Snapshot(m)
	return flows
}

// Snapshot is Flows and the cursor of the position after them: a
// subscription from that cursor gets every later flow.
func (s *Store) Snapshot(m *Matcher) ([]*flowpb.Flow, string) {
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
	return out, s.Cursor(s.next)
}

// Cursor names the position before the flow numbered seq.
func (s *Store) Cursor(seq uint64) string {
	return s.epoch + "-" + strconv.FormatUint(seq, 10)
}

// position reads a cursor: ok is false for one of another store (another
// UI process), which names no position here.
func (s *Store) position(cursor string) (seq uint64, ok bool, err error) {
	epoch, n, found := strings.Cut(cursor, "-")
	if found {
		seq, err = strconv.ParseUint(n, 10, 64)
	}
	if !found || err != nil || epoch == "" {
		return 0, false, fmt.Errorf("cursor %q: want the cursor of a flow list or the id of a stream message", cursor)
	}
	return seq, epoch == s.epoch, nil
}

// Subscription receives the flows that match its query, from the position
// it was made at.
type Subscription struct {
	C chan Entry
	// From is the position the subscription starts at.
	From  uint64
	match *Matcher
	// The fields below are guarded by the store's mutex.
	skipped uint64
	// scanned is the position after the last flow offered (matching or
	// not): with C drained, the subscription has seen everything before.
	scanned uint64
}

func (sub *Subscription) offer(e Entry) {
	sub.scanned = e.Seq + 1
	if sub.match != nil && !sub.match.Match(e.Flow) {
		return
	}
	select {
	case sub.C <- e:
	default:
		sub.skipped++
	}
}

// Subscribe starts a subscription with room for buffer flows. With a
// cursor (from Snapshot, or the Cursor of the position after the last
// entry received) it first gets the matching flows held from that
// position on, in order, then the new ones; flows of that range the store
// no longer holds are counted as skipped (they may have matched). With no
// cursor, or one of another store, it gets only new flows.
func (s *Store) Subscribe(m *Matcher, buffer int, from string) (*Subscription, error) {
	var seq uint64
	replay := false
	if from != "" {
		var err error
		if seq, replay, err = s.position(from); err != nil {
			return nil, err
		}
	}
	sub := &Subscription{C: make(chan Entry, buffer), match: m}
	s.mu.Lock()
	defer s.mu.Unlock()
	sub.scanned = s.next
	if replay {
		// A cursor past the end (not one this store gave) starts at it.
		seq = min(seq, s.next)
		oldest := s.next - min(s.next, uint64(len(s.buf)))
		if seq < oldest {
			sub.skipped += oldest - seq
			seq = oldest
		}
		sub.From = seq
		for i := seq; i < s.next; i++ {
			sub.offer(Entry{Seq: i, Flow: s.buf[i%uint64(len(s.buf))]})
		}
	} else {
		sub.From = s.next
	}
	s.subs[sub] = struct{}{}
	return sub, nil
}

// Unsubscribe ends sub.
func (s *Store) Unsubscribe(sub *Subscription) {
	s.mu.Lock()
	delete(s.subs, sub)
	s.mu.Unlock()
}

// Progress is how many flows sub lost because it fell behind, and, when
// every entry sent to it has been received (C is empty), the position
// after the last flow offered to it; otherwise idle is false.
func (s *Store) Progress(sub *Subscription) (skipped, scanned uint64, idle bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sub.skipped, sub.scanned, len(sub.C) == 0
}
