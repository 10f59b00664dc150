package loader

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// Event types of the ring buffer (bpf/lib/enums.h, through package maps).
const (
	EventDrop          = maps.EventDrop
	EventPolicyVerdict = maps.EventPolicyVerdict
	EventTrace         = maps.EventTrace
	EventSockXlate     = maps.EventSockXlate
)

// TraceMode is how the programs report forwarded packets (trace events).
type TraceMode string

const (
	// TraceOff reports no forwarded packet (drops and verdicts still are).
	TraceOff TraceMode = ""
	// TracePerConnection reports a connection's first packet through each
	// endpoint, its first reply, and each packet that shows a TCP flag
	// among SYN, ACK, FIN and RST the connection had not shown yet: a
	// bounded number of events per connection, whatever its length.
	TracePerConnection TraceMode = "per-connection"
	// TraceEveryPacket reports every forwarded packet (within the
	// per-CPU event rate): for debugging; it costs a ring buffer write
	// per packet.
	TraceEveryPacket TraceMode = "every-packet"
)

// set writes the mode into the programs' load-time constants.
func (m TraceMode) set(spec *ebpf.CollectionSpec) error {
	var on, every uint8
	switch m {
	case TraceOff:
	case TracePerConnection:
		on = 1
	case TraceEveryPacket:
		on, every = 1, 1
	default:
		return fmt.Errorf("trace events mode %q: want %q, %q or empty (off)", m, TracePerConnection, TraceEveryPacket)
	}
	for name, v := range map[string]uint8{"TRACE_EVENTS": on, "TRACE_EVERY_PACKET": every} {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("datapath object has no constant %s", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return nil
}

// Event is one decoded datapath event.
type Event struct {
	Type       uint8
	Reason     uint8
	Direction  uint8
	EndpointID uint16
	Proto      uint8
	Allowed    bool
	// Audit: an audited policy would have denied the flow (Cookie names
	// its rule); it passed (Allowed).
	Audit       bool
	SrcIdentity uint32
	DstIdentity uint32
	// Cookie is the policy rule that decided, 0 for default deny.
	Cookie           uint32
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Len              uint32
	// TCPFlags are the packet's TCP flags (FIN 0x01, SYN 0x02, RST 0x04,
	// PSH 0x08, ACK 0x10, URG 0x20, ECE 0x40, CWR 0x80); 0 for others.
	TCPFlags uint8
	// ObsPoint is where a trace event saw the packet (maps.ObsFromEndpoint,
	// maps.ObsToEndpoint); 0 for drops and verdicts.
	ObsPoint uint8
	// MatchType is what the allowing entry's key matched
	// (maps.PolicyMatch*) in policy verdict events; 0 otherwise.
	MatchType uint8
	// Monotonic is the kernel's CLOCK_MONOTONIC time of the event.
	Monotonic time.Duration
	// CgroupID is the client's cgroup of a socket translation event
	// (EventSockXlate; 0 for others): the socket hook's event carries it
	// in its identity fields, which such an event has no other use for.
	CgroupID uint64
}

// EventSize is the size of one event record as the programs write it.
const EventSize = int(unsafe.Sizeof(bpf.LxcEvent{}))

// DecodeEvent decodes one ring buffer record.
func DecodeEvent(sample []byte) (Event, error) {
	var raw bpf.LxcEvent
	if len(sample) < EventSize {
		return Event{}, fmt.Errorf("decode event: %d bytes, want %d", len(sample), EventSize)
	}
	if err := binary.Read(bytes.NewReader(sample), binary.NativeEndian, &raw); err != nil {
		return Event{}, fmt.Errorf("decode event: %w", err)
	}
	addr := func(b [16]uint8) netip.Addr {
		if raw.Family == maps.FamilyV4 {
			return netip.AddrFrom4([4]byte(b[:4]))
		}
		return netip.AddrFrom16(b)
	}
	ev := Event{
		Type: raw.Type, Reason: raw.Reason, Direction: raw.Dir, EndpointID: raw.EpId, Proto: raw.Proto,
		Allowed: raw.Verdict == maps.VerdictAllowed || raw.Verdict == maps.VerdictAudit, Audit: raw.Verdict == maps.VerdictAudit, SrcIdentity: raw.SrcIdentity, DstIdentity: raw.DstIdentity, Cookie: raw.Cookie,
		Src: addr(raw.Saddr), Dst: addr(raw.Daddr), SrcPort: maps.Ntohs(raw.Sport), DstPort: maps.Ntohs(raw.Dport),
		Len: raw.Len, TCPFlags: raw.TcpFlags, ObsPoint: raw.Obs, MatchType: raw.Match, Monotonic: time.Duration(raw.Ts),
	}
	if ev.Type == EventSockXlate {
		ev.CgroupID = uint64(raw.DstIdentity)<<32 | uint64(raw.SrcIdentity)
		ev.SrcIdentity, ev.DstIdentity = 0, 0
	}
	return ev, nil
}

// EventsLost counts the events that never reached the ring buffer since
// the counters' map was created, summed over CPUs.
type EventsLost struct {
	// RingFull: the ring buffer had no room (the reader lags).
	RingFull uint64
	// RateLimited: over the per-CPU event rate (EVENTS_PER_SEC).
	RateLimited uint64
}

// Total is every lost event.
func (e EventsLost) Total() uint64 { return e.RingFull + e.RateLimited }

// EventsLost reads the lost-event counters.
func (l *Loader) EventsLost() (EventsLost, error) {
	m := l.objs.TdrEventsLostV1
	if m == nil {
		return EventsLost{}, errors.New("datapath not started")
	}
	sum := func(k uint32) (uint64, error) {
		var per []uint64
		if err := m.Lookup(&k, &per); err != nil {
			return 0, fmt.Errorf("read lost events counter %d: %w", k, err)
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		return n, nil
	}
	var out EventsLost
	var err error
	if out.RingFull, err = sum(maps.EventsLostRingFull); err != nil {
		return out, err
	}
	out.RateLimited, err = sum(maps.EventsLostRateLimited)
	return out, err
}

// String is a one-line description for logs and the CLI.
func (e Event) String() string {
	kind := "DROP"
	switch e.Type {
	case EventPolicyVerdict:
		kind = "POLICY-ALLOW"
		if e.Audit {
			kind = "POLICY-AUDIT"
		}
	case EventTrace:
		kind = "TRACE"
	case EventSockXlate:
		kind = "SOCK-XLATE"
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
	return DecodeEvent(rec.RawSample)
}

// Close stops the reader; a blocked Read returns.
func (er *EventReader) Close() error { return er.r.Close() }

// SetDeadline makes Read give up at t (os.ErrDeadlineExceeded); the zero
// time waits for ever. Not safe to call while a Read runs.
func (er *EventReader) SetDeadline(t time.Time) { er.deadline = t }
