package loader

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// Event types of the ring buffer (bpf/lib/enums.h, through package maps).
const (
	EventDrop          = maps.EventDrop
	EventPolicyVerdict = maps.EventPolicyVerdict
)

// Event is one decoded datapath event.
type Event struct {
	Type        uint8
	Reason      uint8
	Direction   uint8
	EndpointID  uint16
	Proto       uint8
	Allowed     bool
	SrcIdentity uint32
	DstIdentity uint32
	// Cookie is the policy rule that decided, 0 for default deny.
	Cookie           uint32
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Len              uint32
	// Monotonic is the kernel's CLOCK_MONOTONIC time of the event.
	Monotonic time.Duration
}

// String is a one-line description for logs and the CLI.
func (e Event) String() string {
	kind := "DROP"
	if e.Type == EventPolicyVerdict {
		kind = "POLICY-ALLOW"
	}
	return fmt.Sprintf("%s %s ep=%d %s %s:%d -> %s:%d proto=%d identity %d->%d rule=%d", kind, maps.ReasonName(e.Reason),
		e.EndpointID, maps.DirectionName(e.Direction), e.Src, e.SrcPort, e.Dst, e.DstPort, e.Proto, e.SrcIdentity, e.DstIdentity, e.Cookie)
}

// EventReader reads the events ring buffer. The programs wake a reader
// only once unread events pile up (a wakeup per event costs more than the
// event), so Read also looks every EventPollInterval.
type EventReader struct {
	r        *ringbuf.Reader
	deadline time.Time
}

// EventPollInterval bounds how long an event waits in the ring buffer
// before a blocked Read returns it.
const EventPollInterval = 20 * time.Millisecond

// NewEventReader opens a reader on the datapath's ring buffer.
func (l *Loader) NewEventReader() (*EventReader, error) {
	if l.maps == nil {
		return nil, errors.New("datapath not started")
	}
	r, err := ringbuf.NewReader(l.maps.Events)
	if err != nil {
		return nil, fmt.Errorf("open events ring buffer: %w", err)
	}
	return &EventReader{r: r}, nil
}

// Read blocks for the next event; it returns ringbuf.ErrClosed after Close
// and os.ErrDeadlineExceeded once the SetDeadline time passed.
func (er *EventReader) Read() (Event, error) {
	var rec ringbuf.Record
	for {
		wait := time.Now().Add(EventPollInterval)
		if !er.deadline.IsZero() && er.deadline.Before(wait) {
			wait = er.deadline
		}
		er.r.SetDeadline(wait)
		err := er.r.ReadInto(&rec)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || (!er.deadline.IsZero() && !time.Now().Before(er.deadline)) {
			return Event{}, err
		}
	}
	var raw bpf.LxcEvent
	if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &raw); err != nil {
		return Event{}, fmt.Errorf("decode event: %w", err)
	}
	addr := func(b [16]uint8) netip.Addr {
		if raw.Family == maps.FamilyV4 {
			return netip.AddrFrom4([4]byte(b[:4]))
		}
		return netip.AddrFrom16(b)
	}
	return Event{
		Type: raw.Type, Reason: raw.Reason, Direction: raw.Dir, EndpointID: raw.EpId, Proto: raw.Proto,
		Allowed: raw.Verdict == maps.VerdictAllowed, SrcIdentity: raw.SrcIdentity, DstIdentity: raw.DstIdentity, Cookie: raw.Cookie,
		Src: addr(raw.Saddr), Dst: addr(raw.Daddr), SrcPort: maps.Ntohs(raw.Sport), DstPort: maps.Ntohs(raw.Dport),
		Len: raw.Len, Monotonic: time.Duration(raw.Ts),
	}, nil
}

// Close stops the reader; a blocked Read returns.
func (er *EventReader) Close() error { return er.r.Close() }

// SetDeadline makes Read give up at t (os.ErrDeadlineExceeded); the zero
// time waits for ever. Not safe to call while a Read runs.
func (er *EventReader) SetDeadline(t time.Time) { er.deadline = t }
