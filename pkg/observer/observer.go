package observer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
)

// EventSource is where events come from: the datapath's ring buffer
// reader (loader.EventReader) in the agent. Close makes a blocked Read
// return.
type EventSource interface {
	Read() (loader.Event, error)
	Close() error
}

// Observer decodes events into flows and keeps them in its ring.
type Observer struct {
	log     *slog.Logger
	decoder *Decoder
	ring    *Ring
	start   time.Time

	// publish serialises the consumers and the ring's write: flows come
	// from the decoding goroutine and from the proxies' (Publish), and
	// the consumers (the export) are written for one caller at a time.
	publish   sync.Mutex
	consumers []func(*flowpb.Flow)

	decodeErrors atomic.Uint64
	followers    atomic.Int64
}

// Followers is the number of follow queries running.
func (o *Observer) Followers() int { return int(o.followers.Load()) }

// Config configures an Observer.
type Config struct {
	// Capacity is the ring's size in flows; DefaultRingCapacity when 0.
	Capacity int
	// Clock places event times in wall time; SystemClock when nil.
	Clock Clock
	// Consumers get every flow decoded, in order, in the decoding
	// goroutine, before it enters the ring (flow metrics, export): each
	// must be quick and must not change the flow.
	Consumers []func(*flowpb.Flow)
}

// New returns an observer decoding with what node knows.
func New(cfg Config, node NodeKnowledge, log *slog.Logger) *Observer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Observer{log: log, decoder: &Decoder{Node: node, Clock: cfg.Clock}, ring: NewRing(cfg.Capacity), start: time.Now(),
		consumers: cfg.Consumers}
}

// Ring is the observer's flow ring.
func (o *Observer) Ring() *Ring { return o.ring }

// NodeName is the name of the node observed.
func (o *Observer) NodeName() string { return o.decoder.Node.NodeName() }

// Uptime is how long the observer has run.
func (o *Observer) Uptime() time.Duration { return time.Since(o.start) }

// DecodeErrors counts events that could not be decoded.
func (o *Observer) DecodeErrors() uint64 { return o.decodeErrors.Load() }

// Observe decodes one event into the ring.
func (o *Observer) Observe(ev loader.Event) error {
	f, err := o.decoder.Decode(ev)
	if err != nil {
		o.decodeErrors.Add(1)
		return err
	}
	o.write(f)
	return nil
}

// write hands a complete flow to the consumers, then to the ring.
func (o *Observer) write(f *flowpb.Flow) {
	o.publish.Lock()
	defer o.publish.Unlock()
	for _, c := range o.consumers {
		c(f)
	}
	o.ring.Write(f)
}

// L7Sink takes the L7 flows the node's proxies build (the DNS proxy's,
// the HTTP proxy's) into the flows the observer serves.
type L7Sink interface {
	// PublishL7 records one flow; the sink owns it afterwards (the caller
	// must not change it). Safe for concurrent use.
	PublishL7(f *flowpb.Flow)
}

// PublishL7 completes a flow a proxy built (the node's name, a UUID, the
// time when it has none, the endpoints' pods and labels from what the
// node knows) and records it as a decoded one: the consumers (metrics,
// export) see it and the ring keeps it. Safe for concurrent use with
// Observe.
func (o *Observer) PublishL7(f *flowpb.Flow) {
	if f == nil {
		return
	}
	o.decoder.complete(f)
	o.write(f)
}

var _ L7Sink = (*Observer)(nil)

// Run feeds the ring from src until ctx ends or src fails; it closes src
// and returns once its reading goroutine has stopped.
func (o *Observer) Run(ctx context.Context, src EventSource) error {
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-ctx.Done():
		case <-stop:
		}
		_ = src.Close()
	}()
	defer wg.Wait()
	defer close(stop)
	for {
		ev, err := src.Read()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read datapath event: %w", err)
		}
		if err := o.Observe(ev); err != nil {
			o.log.Debug("Cannot decode datapath event", "error", err)
		}
	}
}

// Query is what GetFlows asks: the semantics of Hubble's GetFlowsRequest.
type Query struct {
	// Number of flows: the last Number (or, with First, the first Number)
	// matching flows; 0 is every flow the ring holds (none with Follow
	// and no Since: following starts now).
	Number uint64
	First  bool
	// Follow keeps sending new matching flows until the context ends
	// (or Until passes).
	Follow       bool
	Since, Until time.Time
	Filters      *Filters
}

// ErrUntilPassed is returned by a follow query that reached its Until
// time; callers treat it as the stream's normal end.
var ErrUntilPassed = errors.New("until time reached")

// Lost reports flows a query missed: the ring overwrote them before the
// query read them.
type Lost func(n uint64) error

// Flows runs a query, calling send for each flow in order (oldest first),
// and lost when a follower fell behind the ring.
func (o *Observer) Flows(ctx context.Context, q Query, send func(*flowpb.Flow) error, lost Lost) error {
	if q.Follow {
		o.followers.Add(1)
		defer o.followers.Add(-1)
	}
	r := o.ring
	oldest, next, _ := r.Bounds()
	inTime := func(f *flowpb.Flow) (ok, past bool) {
		t := f.GetTime().AsTime()
		if !q.Since.IsZero() && t.Before(q.Since) {
			return false, false
		}
		if !q.Until.IsZero() && t.After(q.Until) {
			return false, true
		}
		return true, false
	}
	match := func(f *flowpb.Flow) (ok, past bool) {
		ok, past = inTime(f)
		return ok && q.Filters.Match(f), past
	}
	// The starting point: from the oldest (First, Since, or all), from
	// the last Number matches, or (Follow alone) from now.
	start := oldest
	switch {
	case q.First:
	case q.Number > 0:
		found := uint64(0)
		start = next
		for seq := next; seq > oldest && found < q.Number; seq-- {
			f, ok := r.At(seq - 1)
			if !ok {
				break
			}
			if m, _ := match(f); m {
				found++
				start = seq - 1
			}
		}
	case q.Follow && q.Since.IsZero():
		start = next
	}
	sent := uint64(0)
	seq := start
	for {
		lo, hi, wake := r.Bounds()
		if seq < lo {
			if err := lost(lo - seq); err != nil {
				return err
			}
			seq = lo
		}
		for ; seq < hi; seq++ {
			f, ok := r.At(seq)
			if !ok {
				break // overwritten meanwhile: the bounds say how many
			}
			m, past := match(f)
			if past {
				if q.Follow {
					return ErrUntilPassed
				}
				return nil
			}
			if !m {
				continue
			}
			if err := send(f); err != nil {
				return err
			}
			sent++
			if q.First && q.Number > 0 && sent >= q.Number {
				return nil
			}
		}
		if seq < hi {
			continue
		}
		if !q.Follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		}
	}
}
