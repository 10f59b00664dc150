package observer

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"sync"
	"time"
	"unicode/utf8"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// Event types of flows (flow.CiliumEventType.Type), as Cilium's monitor
// numbers them: the hubble CLI's --type filter sends these.
const (
	MessageTypeDrop          = 1
	MessageTypeTrace         = 4
	MessageTypePolicyVerdict = 5
	// MessageTypeTraceSock: a socket translated at connect (Cilium's
	// CILIUM_NOTIFY_TRACE_SOCK; `hubble observe --type trace-sock`).
	MessageTypeTraceSock = 7
	// MessageTypeAccessLog: an L7 flow of a proxy (DNS, HTTP), Cilium's
	// access log record; `hubble observe --type l7` asks for it.
	MessageTypeAccessLog = 129
)

// Sub-types of trace flows (flow.CiliumEventType.SubType): the observation
// point as Cilium's monitor numbers it (hubble --type trace:to-endpoint).
const (
	TraceToEndpoint   = 0
	TraceFromEndpoint = 5
)

// dropReasons maps the datapath's drop reasons to Hubble's.
var dropReasons = map[uint8]flowpb.DropReason{
	maps.ReasonPolicyDenied:     flowpb.DropReason_POLICY_DENIED,
	maps.ReasonPolicyDenyRule:   flowpb.DropReason_POLICY_DENY,
	maps.ReasonTruncated:        flowpb.DropReason_CT_TRUNCATED_OR_INVALID_HEADER,
	maps.ReasonMalformed:        flowpb.DropReason_INVALID_PACKET_DROPPED,
	maps.ReasonInvalidSource:    flowpb.DropReason_INVALID_SOURCE_IP,
	maps.ReasonUnknownL3:        flowpb.DropReason_UNSUPPORTED_L3_PROTOCOL,
	maps.ReasonNoEndpoint:       flowpb.DropReason_UNKNOWN_L3_TARGET_ADDRESS,
	maps.ReasonFragment:         flowpb.DropReason_IP_FRAGMENTATION_NOT_SUPPORTED,
	maps.ReasonUnknownInterface: flowpb.DropReason_NO_CONFIGURATION_AVAILABLE_TO_PERFORM_POLICY_DECISION,
	maps.ReasonSvcNoBackend:     flowpb.DropReason_SERVICE_BACKEND_NOT_FOUND,
	maps.ReasonNatFailed:        flowpb.DropReason_ERROR_WRITING_TO_PACKET,
	maps.ReasonUnencrypted:      flowpb.DropReason_UNENCRYPTED_TRAFFIC, // Cilium's reason for its strict mode too
	// The DNS fallback's denied name: policy, as the proxy's REFUSED
	// is (the flow's summary names the datapath's reason).
	maps.ReasonDnsNameDenied: flowpb.DropReason_POLICY_DENIED,
	// Cilium drops on an exhausted or full SNAT table, and on a failed
	// rewrite, with these.
	maps.ReasonMasqNoPort:    flowpb.DropReason_NO_MAPPING_FOR_NAT_MASQUERADE,
	maps.ReasonMasqTableFull: flowpb.DropReason_NO_MAPPING_FOR_NAT_MASQUERADE,
	maps.ReasonMasqFailed:    flowpb.DropReason_ERROR_WRITING_TO_PACKET,
	// externalTrafficPolicy Local without a local backend: Cilium's
	// "no service" drop, as for a service without backends.
	maps.ReasonSvcNoLocalBackend: flowpb.DropReason_SERVICE_BACKEND_NOT_FOUND,
	maps.ReasonSourceRangeDenied: flowpb.DropReason_DENIED_BY_LB_SRC_RANGE_CHECK,
	maps.ReasonNodeportNoRoute:   flowpb.DropReason_FIB_LOOKUP_FAILED,
	// The tunnel: a packet for the overlay with no node owning its
	// destination (sent), or one that arrived without tunnel metadata;
	// one from an address of no known node.
	maps.ReasonNoTunnelKey:    flowpb.DropReason_NO_TUNNEL_OR_ENCAPSULATION_ENDPOINT,
	maps.ReasonTunnelNotANode: flowpb.DropReason_UNKNOWN_SENDER,
	// ReasonDsrMtuExceeded has no counterpart in Hubble's list (Cilium
	// sends an ICMP "fragmentation needed" instead): DROP_REASON_UNKNOWN,
	// the flow's drop_reason field keeping it apart is the datapath's
	// metric (tendril bpf metrics).
}

// DropReason is Hubble's drop reason for a datapath reason.
func DropReason(reason uint8) flowpb.DropReason {
	if r, ok := dropReasons[reason]; ok {
		return r
	}
	return flowpb.DropReason_DROP_REASON_UNKNOWN
}

// traceReasons maps the conntrack classification of a trace event.
var traceReasons = map[uint8]flowpb.TraceReason{
	maps.ReasonForwarded:     flowpb.TraceReason_NEW,
	maps.ReasonCTEstablished: flowpb.TraceReason_ESTABLISHED,
	maps.ReasonCTReply:       flowpb.TraceReason_REPLY,
	maps.ReasonCTRelated:     flowpb.TraceReason_RELATED,
}

// Clock gives the wall time and CLOCK_MONOTONIC now, to place the events'
// monotonic timestamps in wall time.
type Clock func() (wall time.Time, monotonic time.Duration)

// SystemClock reads the system's clocks.
func SystemClock() (time.Time, time.Duration) {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Now(), time.Duration(ts.Nano())
}

// Decoder builds flows from datapath events. Use it through a pointer.
type Decoder struct {
	Node  NodeKnowledge
	Clock Clock

	// offset is wall time minus CLOCK_MONOTONIC, as last adopted: the
	// events' monotonic times are placed in wall time by one offset, so
	// that flows keep the order of their events. Reading the two clocks
	// per event gives an offset that jitters by microseconds, enough to
	// swap two close events; a new reading is adopted only when it moved
	// by more than maxOffsetJitter (the wall clock was stepped).
	mu        sync.Mutex
	offset    time.Duration
	hasOffset bool
}

// maxOffsetJitter is how far the wall-minus-monotonic offset may wander
// before the decoder adopts the new one.
const maxOffsetJitter = time.Millisecond

// wallTime places a CLOCK_MONOTONIC timestamp in wall time.
func (d *Decoder) wallTime(mono time.Duration) time.Time {
	clock := d.Clock
	if clock == nil {
		clock = SystemClock
	}
	wall, now := clock()
	off := time.Duration(wall.UnixNano()) - now
	d.mu.Lock()
	if !d.hasOffset || off-d.offset > maxOffsetJitter || d.offset-off > maxOffsetJitter {
		d.offset, d.hasOffset = off, true
	}
	off = d.offset
	d.mu.Unlock()
	return time.Unix(0, int64(off+mono))
}

// Decode builds the flow of one event.
func (d *Decoder) Decode(ev loader.Event) (*flowpb.Flow, error) {
	f := &flowpb.Flow{
		Time:     timestamppb.New(d.wallTime(ev.Monotonic)),
		Uuid:     newUUID(),
		Type:     flowpb.FlowType_L3_L4,
		NodeName: d.Node.NodeName(),
		IP:       &flowpb.IP{Source: ev.Src.String(), Destination: ev.Dst.String(), IpVersion: flowpb.IPVersion_IPv4},
		L4:       layer4(ev),
	}
	if ev.Src.Is6() {
		f.IP.IpVersion = flowpb.IPVersion_IPv6
	}
	if ev.Direction == maps.DirIngress {
		f.TrafficDirection = flowpb.TrafficDirection_INGRESS
	} else {
		f.TrafficDirection = flowpb.TrafficDirection_EGRESS
	}
	if ev.Type == maps.EventSockXlate {
		return d.sockXlate(f, ev), nil
	}
	f.Source, f.Destination = d.endpoints(ev)
	if svc, ok := d.Node.(ServiceKnowledge); ok {
		f.SourceService = service(svc, ev.Src, ev.SrcPort, ev.Proto)
		f.DestinationService = service(svc, ev.Dst, ev.DstPort, ev.Proto)
	}
	switch ev.Type {
	case maps.EventDrop:
		f.Verdict = flowpb.Verdict_DROPPED
		reason := DropReason(ev.Reason)
		f.DropReasonDesc = reason
		f.DropReason = uint32(reason)
		f.EventType = &flowpb.CiliumEventType{Type: MessageTypeDrop, SubType: int32(reason)}
		if ev.Reason == maps.ReasonPolicyDenied || ev.Reason == maps.ReasonPolicyDenyRule {
			// Policy decides new flows only: a denied packet starts one.
			f.IsReply = wrapperspb.Bool(false)
		}
		if ev.Reason == maps.ReasonPolicyDenyRule && ev.Cookie != 0 {
			d.attachPolicy(f, ev, true)
		}
		if ev.Reason == maps.ReasonPolicyDenied {
			// Endpoint 0 is the host endpoint (the host firewall): its
			// policy drops name the host policies selecting the node.
			d.attachDefaultDeny(f, ev)
		}
	case maps.EventPolicyVerdict:
		f.Verdict = flowpb.Verdict_FORWARDED
		if !ev.Allowed {
			f.Verdict = flowpb.Verdict_DROPPED
		}
		if ev.Audit {
			// An audited policy would have denied it; it passed. The
			// policy is named among those that deny.
			f.Verdict = flowpb.Verdict_AUDIT
		}
		f.EventType = &flowpb.CiliumEventType{Type: MessageTypePolicyVerdict}
		f.IsReply = wrapperspb.Bool(false)
		// The datapath's match types are numbered as Cilium's.
		f.PolicyMatchType = uint32(ev.MatchType)
		if ev.Cookie != 0 {
			d.attachPolicy(f, ev, !ev.Allowed || ev.Audit)
		}
	case maps.EventTrace:
		f.Verdict = flowpb.Verdict_FORWARDED
		sub := int32(TraceToEndpoint)
		f.TraceObservationPoint = flowpb.TraceObservationPoint_TO_ENDPOINT
		if ev.ObsPoint == maps.ObsFromEndpoint {
			sub = TraceFromEndpoint
			f.TraceObservationPoint = flowpb.TraceObservationPoint_FROM_ENDPOINT
		}
		f.EventType = &flowpb.CiliumEventType{Type: MessageTypeTrace, SubType: sub}
		f.TraceReason = traceReasons[ev.Reason]
		if f.TraceReason != flowpb.TraceReason_RELATED {
			f.IsReply = wrapperspb.Bool(f.TraceReason == flowpb.TraceReason_REPLY)
		}
	default:
		return nil, fmt.Errorf("decode event: unknown type %d", ev.Type)
	}
	return f, nil
}

// sockXlate is the flow of a connection the socket load-balancer
// translated at connect: from the client's socket (no address yet) to the
// backend, naming the service whose frontend it asked for. The event
// carries the frontend as its source and the backend as its destination.
func (d *Decoder) sockXlate(f *flowpb.Flow, ev loader.Event) *flowpb.Flow {
	f.Type = flowpb.FlowType_SOCK
	f.Verdict = flowpb.Verdict_TRACED
	f.EventType = &flowpb.CiliumEventType{Type: MessageTypeTraceSock}
	f.SockXlatePoint = flowpb.SocketTranslationPoint_SOCK_XLATE_POINT_POST_DIRECTION_FWD
	f.TrafficDirection = flowpb.TrafficDirection_EGRESS
	f.IsReply = wrapperspb.Bool(false)
	f.IP.Source = ""
	// The event's source port is the frontend's: the flow's layer 4 has
	// the backend's port and no source port (none is chosen yet).
	switch l4 := f.GetL4().GetProtocol().(type) {
	case *flowpb.Layer4_TCP:
		l4.TCP.SourcePort = 0
	case *flowpb.Layer4_UDP:
		l4.UDP.SourcePort = 0
	}
	dstEv := ev
	dstEv.Direction, dstEv.EndpointID, dstEv.SrcIdentity = maps.DirEgress, 0, 0
	_, f.Destination = d.endpoints(dstEv)
	f.Source = &flowpb.Endpoint{}
	// The client is the pod whose cgroup the connecting process is in.
	if ck, ok := d.Node.(CgroupKnowledge); ok && ev.CgroupID != 0 {
		if e, ok := ck.EndpointByCgroup(ev.CgroupID); ok {
			f.Source = &flowpb.Endpoint{ID: e.ID, Identity: e.Identity, Namespace: e.Namespace, PodName: e.PodName, Labels: e.Labels}
			if len(f.Source.Labels) == 0 && e.Identity != 0 {
				f.Source.Labels = d.Node.IdentityLabels(e.Identity)
			}
			if e.WorkloadName != "" {
				f.Source.Workloads = []*flowpb.Workload{{Name: e.WorkloadName, Kind: e.WorkloadKind}}
			}
		}
	}
	if svc, ok := d.Node.(ServiceKnowledge); ok {
		f.DestinationService = service(svc, ev.Src, ev.SrcPort, ev.Proto)
	}
	return f
}

// attachPolicy names the rule that decided the flow.
func (d *Decoder) attachPolicy(f *flowpb.Flow, ev loader.Event, denied bool) {
	p, ok := d.Node.PolicyByCookie(ev.Cookie)
	if !ok {
		return
	}
	pol := []*flowpb.Policy{{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, Revision: p.Revision, Kind: p.Kind}}
	switch {
	case ev.Direction == maps.DirIngress && denied:
		f.IngressDeniedBy = pol
	case ev.Direction == maps.DirIngress:
		f.IngressAllowedBy = pol
	case denied:
		f.EgressDeniedBy = pol
	default:
		f.EgressAllowedBy = pol
	}
}

// service names the service of one side, or nil.
func service(k ServiceKnowledge, addr netip.Addr, port uint16, proto uint8) *flowpb.Service {
	if port == 0 {
		return nil
	}
	s, ok := k.ServiceByAddr(netip.AddrPortFrom(addr.Unmap(), port), proto)
	if !ok {
		return nil
	}
	return &flowpb.Service{Namespace: s.Namespace, Name: s.Name}
}

// attachDefaultDeny names, on a default-deny drop, the policies whose
// rules select the endpoint in the drop's direction: they are why it
// denies what they do not allow. The drop reason (POLICY_DENIED, not
// POLICY_DENY) still tells it from a deny rule's.
func (d *Decoder) attachDefaultDeny(f *flowpb.Flow, ev loader.Event) {
	k, ok := d.Node.(DefaultDenyKnowledge)
	if !ok {
		return
	}
	ingress := ev.Direction == maps.DirIngress
	var pols []*flowpb.Policy
	for _, p := range k.DefaultDenyPolicies(ev.EndpointID, ingress) {
		pols = append(pols, &flowpb.Policy{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, Revision: p.Revision, Kind: p.Kind})
	}
	if ingress {
		f.IngressDeniedBy = pols
	} else {
		f.EgressDeniedBy = pols
	}
}

// endpoints fills both sides: the event's endpoint is the source of what
// it sends (egress) and the destination of what it receives (ingress).
func (d *Decoder) endpoints(ev loader.Event) (src, dst *flowpb.Endpoint) {
	local, haveLocal := Endpoint{}, false
	if ev.EndpointID != 0 {
		local, haveLocal = d.Node.EndpointByID(ev.EndpointID)
	}
	side := func(addr netip.Addr, identity uint32, isLocal bool) *flowpb.Endpoint {
		e, ok := local, haveLocal && isLocal
		if !ok {
			e, ok = d.Node.EndpointByIP(addr)
		}
		if identity == 0 {
			identity = e.Identity
		}
		out := &flowpb.Endpoint{ID: e.ID, Identity: identity, Namespace: e.Namespace, PodName: e.PodName, Labels: e.Labels}
		if len(out.Labels) == 0 && identity != 0 {
			out.Labels = d.Node.IdentityLabels(identity)
		}
		if e.WorkloadName != "" {
			out.Workloads = []*flowpb.Workload{{Name: e.WorkloadName, Kind: e.WorkloadKind}}
		}
		return out
	}
	egress := ev.Direction == maps.DirEgress
	return side(ev.Src, ev.SrcIdentity, egress), side(ev.Dst, ev.DstIdentity, !egress)
}

func layer4(ev loader.Event) *flowpb.Layer4 {
	switch ev.Proto {
	case 6:
		t := &flowpb.TCP{SourcePort: uint32(ev.SrcPort), DestinationPort: uint32(ev.DstPort), Flags: TCPFlags(ev.TCPFlags)}
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_TCP{TCP: t}}
	case 17:
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_UDP{UDP: &flowpb.UDP{SourcePort: uint32(ev.SrcPort), DestinationPort: uint32(ev.DstPort)}}}
	case 132:
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_SCTP{SCTP: &flowpb.SCTP{SourcePort: uint32(ev.SrcPort), DestinationPort: uint32(ev.DstPort)}}}
	case 1:
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv4{ICMPv4: &flowpb.ICMPv4{Type: icmpType(ev, 8, 0)}}}
	case 58:
		return &flowpb.Layer4{Protocol: &flowpb.Layer4_ICMPv6{ICMPv6: &flowpb.ICMPv6{Type: icmpType(ev, 128, 129)}}}
	}
	return nil
}

// icmpType recovers the ICMP type from the event's ports as the parser
// fills them (bpf/lib/parse.h): an echo request carries its identifier as
// the source port, an echo reply as the destination port, an error its
// type as the destination port. (Other, rare, types read as echo replies;
// an echo with identifier 0 reads as type 0.)
func icmpType(ev loader.Event, request, reply uint32) uint32 {
	switch {
	case ev.SrcPort != 0 && ev.DstPort == 0:
		return request
	case ev.SrcPort == 0 && ev.DstPort != 0 && !isICMPError(ev.Proto, ev.DstPort):
		return reply
	}
	return uint32(ev.DstPort)
}

func isICMPError(proto uint8, t uint16) bool {
	if proto == 1 {
		return t == 3 || t == 11 || t == 12
	}
	return t >= 1 && t <= 4
}

// TCPFlags converts the header's flag byte; nil when none is set.
func TCPFlags(b uint8) *flowpb.TCPFlags {
	if b == 0 {
		return nil
	}
	return &flowpb.TCPFlags{
		FIN: b&0x01 != 0, SYN: b&0x02 != 0, RST: b&0x04 != 0, PSH: b&0x08 != 0,
		ACK: b&0x10 != 0, URG: b&0x20 != 0, ECE: b&0x40 != 0, CWR: b&0x80 != 0,
	}
}

// newUUID is a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return formatUUID(b)
}

// formatUUID is b in the UUID's text form (8-4-4-4-12 lower-case hex
// digits). Every flow gets one: hex into a fixed array costs one
// allocation, where fmt's five %x cost six and showed in the agent's
// profile under L7 load.
func formatUUID(b [16]byte) string {
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}

// complete fills in what a proxy's flow lacks and a decoded one has: the
// node, a UUID, the time, the L7 event type and both endpoints as the
// node knows them (the source by its endpoint ID when the proxy named
// it, else by address; the destination by address), with their labels.
func (d *Decoder) complete(f *flowpb.Flow) {
	f.NodeName = d.Node.NodeName()
	if f.Uuid == "" {
		f.Uuid = newUUID()
	}
	if f.Time == nil {
		f.Time = timestamppb.New(time.Now())
	}
	if f.Type == flowpb.FlowType_UNKNOWN_TYPE {
		f.Type = flowpb.FlowType_L7
	}
	if f.EventType == nil {
		f.EventType = &flowpb.CiliumEventType{Type: MessageTypeAccessLog}
	}
	if h := f.GetL7().GetHttp(); h != nil {
		// What a pod sent, kept in the ring: bounded, so a pod cannot make
		// the ring hold megabytes per flow.
		h.Url = truncate(h.Url, MaxL7Text)
		h.Method = truncate(h.Method, MaxL7Text)
	}
	src, _ := netip.ParseAddr(f.GetIP().GetSource())
	dst, _ := netip.ParseAddr(f.GetIP().GetDestination())
	f.Source = d.fill(f.Source, src)
	f.Destination = d.fill(f.Destination, dst)
	if svc, ok := d.Node.(ServiceKnowledge); ok && dst.IsValid() {
		proto := uint8(6) // TCP
		port := f.GetL4().GetTCP().GetDestinationPort()
		if u := f.GetL4().GetUDP(); u != nil {
			proto, port = 17, u.GetDestinationPort()
		}
		f.DestinationService = service(svc, dst, uint16(port), proto)
	}
}

// MaxL7Text bounds the text of an L7 flow a pod chose (an HTTP URL,
// its method) as the ring keeps it: Go's HTTP request reading bounds no
// line, and the ring holds thousands of flows.
const MaxL7Text = 4096

// truncate cuts s to at most n bytes, on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "..."
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// fill completes one side of a proxy's flow: the local endpoint of its
// ID, else the endpoint holding its address; what the proxy said (its
// identity) is kept.
func (d *Decoder) fill(ep *flowpb.Endpoint, addr netip.Addr) *flowpb.Endpoint {
	if ep == nil {
		ep = &flowpb.Endpoint{}
	}
	e, ok := Endpoint{}, false
	if ep.ID != 0 && ep.ID <= 0xffff {
		e, ok = d.Node.EndpointByID(uint16(ep.ID))
	}
	if !ok && addr.IsValid() {
		e, ok = d.Node.EndpointByIP(addr)
	}
	if ok {
		if ep.ID == 0 {
			ep.ID = e.ID
		}
		if ep.Identity == 0 {
			ep.Identity = e.Identity
		}
		if ep.Namespace == "" {
			ep.Namespace, ep.PodName = e.Namespace, e.PodName
		}
		if len(ep.Labels) == 0 {
			ep.Labels = e.Labels
		}
		if len(ep.Workloads) == 0 && e.WorkloadName != "" {
			ep.Workloads = []*flowpb.Workload{{Name: e.WorkloadName, Kind: e.WorkloadKind}}
		}
	}
	if len(ep.Labels) == 0 && ep.Identity != 0 {
		ep.Labels = d.Node.IdentityLabels(ep.Identity)
	}
	return ep
}
