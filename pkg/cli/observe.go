package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tendril-net/tendril/pkg/hubble"
	"github.com/tendril-net/tendril/pkg/hubble/flowmetrics"
	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/ui"
)

// observeOptions are `tendril observe`'s flags.
type observeOptions struct {
	server              string
	output              string
	last, first         uint64
	all, follow         bool
	since, until        string
	pod, fromPod, toPod []string
	ns, fromNS, toNS    []string
	ip, fromIP, toIP    []string
	label, fromLabel    []string
	toLabel             []string
	identity            []uint
	port, fromPort      []string
	toPort              []string
	protocol, verdict   []string
	types, nodes        []string
	tcpFlags            []string
	reply               []bool
	dropReason          []string
	// tls turns TLS on with no other TLS flag (the system's roots check
	// the server), as hubble's --tls.
	tls               bool
	serverTLS         ui.RelayTLS
	httpStatus        []string
	httpMethod        []string
	httpPath, httpURL []string
	dnsQuery          []string
}

func newObserveCommand(_ *Options) *cobra.Command {
	o := &observeOptions{}
	cmd := &cobra.Command{
		Use:   "observe",
		Short: "Observe flows of a node's Hubble API (or a relay's), as `hubble observe` does",
		Long: `Observe flows: drops with their reason, policy verdicts naming their policy, and
forwarded traffic, from the Hubble API of a node (unix socket) or a relay (host:port).
A flag without from-/to- matches either side (two filters, as hubble builds them).
A relay serving TLS is read with --tls-ca-cert-files, and with --tls-client-cert-file
and --tls-client-key-file when it requires a client certificate (mTLS); any TLS flag
turns TLS on.`,
		Args: cobra.NoArgs,
		// The root's -o check is for the REST commands; observe has its
		// own outputs.
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	defServer := os.Getenv("TENDRIL_HUBBLE_SERVER")
	if defServer == "" {
		defServer = "unix://" + hubble.DefaultSocketPath
	}
	f := cmd.Flags()
	f.StringVar(&o.server, "server", defServer, "Hubble API: unix://PATH or host:port ($TENDRIL_HUBBLE_SERVER)")
	f.StringVarP(&o.output, "output", "o", "compact", "Output: compact, json (one GetFlowsResponse per line) or table")
	f.Uint64Var(&o.last, "last", 0, "The last N matching flows (default 20 unless --follow, --since or --until)")
	f.Uint64Var(&o.first, "first", 0, "The first N matching flows in the ring")
	f.BoolVar(&o.all, "all", false, "Every matching flow in the ring")
	f.BoolVarP(&o.follow, "follow", "f", false, "Keep printing new flows")
	f.StringVar(&o.since, "since", "", "Flows since a time (RFC 3339) or a duration ago (5m)")
	f.StringVar(&o.until, "until", "", "Flows until a time (RFC 3339) or a duration ago")
	f.StringSliceVar(&o.pod, "pod", nil, "Pod [namespace/]name-prefix, either side")
	f.StringSliceVar(&o.fromPod, "from-pod", nil, "Source pod [namespace/]name-prefix")
	f.StringSliceVar(&o.toPod, "to-pod", nil, "Destination pod [namespace/]name-prefix")
	f.StringSliceVarP(&o.ns, "namespace", "n", nil, "Namespace, either side")
	f.StringSliceVar(&o.fromNS, "from-namespace", nil, "Source namespace")
	f.StringSliceVar(&o.toNS, "to-namespace", nil, "Destination namespace")
	f.StringSliceVar(&o.ip, "ip", nil, "IP or CIDR, either side")
	f.StringSliceVar(&o.fromIP, "from-ip", nil, "Source IP or CIDR")
	f.StringSliceVar(&o.toIP, "to-ip", nil, "Destination IP or CIDR")
	f.StringArrayVarP(&o.label, "label", "l", nil, "Label selector (app=web,tier in (a,b)), either side")
	f.StringArrayVar(&o.fromLabel, "from-label", nil, "Source label selector")
	f.StringArrayVar(&o.toLabel, "to-label", nil, "Destination label selector")
	f.UintSliceVar(&o.identity, "identity", nil, "Security identity, either side")
	f.StringSliceVar(&o.port, "port", nil, "L4 port, either side")
	f.StringSliceVar(&o.fromPort, "from-port", nil, "Source port")
	f.StringSliceVar(&o.toPort, "to-port", nil, "Destination port")
	f.StringSliceVar(&o.protocol, "protocol", nil, "tcp, udp, sctp, icmp, icmpv4, icmpv6, http, dns")
	f.StringSliceVar(&o.verdict, "verdict", nil, "FORWARDED, DROPPED or AUDIT (what an audit-mode policy would have denied)")
	f.StringSliceVar(&o.dropReason, "drop-reason", nil, "Drop reason (POLICY_DENIED, POLICY_DENY, ...)")
	f.StringSliceVarP(&o.types, "type", "t", nil, "Event type: drop, trace, trace:to-endpoint, trace:from-endpoint, policy-verdict, trace-sock, l7")
	f.StringSliceVar(&o.nodes, "node-name", nil, "Node name pattern (node-*)")
	f.StringArrayVar(&o.tcpFlags, "tcp-flags", nil, "TCP flags the flow has, e.g. SYN or SYN,ACK (repeat for any of)")
	f.BoolSliceVar(&o.reply, "is-reply", nil, "Replies (true) or not (false)")
	// hubble observe's names for TLS to the relay (or a node's TCP
	// listener); the same settings as tendril ui's --tls-relay-server-*.
	f.BoolVar(&o.tls, "tls", false, "Connect to --server over TLS (any other --tls-* flag turns it on too)")
	f.StringSliceVar(&o.serverTLS.CAFiles, "tls-ca-cert-files", nil, "PEM CAs of the server's certificate (the relay's --tls-relay-server-cert-file); default: the system's roots")
	f.StringVar(&o.serverTLS.CertFile, "tls-client-cert-file", "", "PEM certificate to present to a server that requires one (the relay's --tls-relay-client-ca-files: mTLS)")
	f.StringVar(&o.serverTLS.KeyFile, "tls-client-key-file", "", "PEM key of --tls-client-cert-file")
	f.StringVar(&o.serverTLS.ServerName, "tls-server-name", "", "Name the server's certificate must carry (default: the host of --server)")
	f.StringSliceVar(&o.httpStatus, "http-status", nil, "HTTP status code (404) or its first digits and + (5+) of L7 flows")
	f.StringSliceVar(&o.httpMethod, "http-method", nil, "HTTP method of L7 flows (GET)")
	f.StringArrayVar(&o.httpPath, "http-path", nil, "Regular expression on the URL path of L7 flows (^/api/)")
	f.StringArrayVar(&o.httpURL, "http-url", nil, "Regular expression on the URL of L7 flows")
	f.StringArrayVar(&o.dnsQuery, "dns-query", nil, "Regular expression on the query of DNS L7 flows (world\\.example)")
	return cmd
}

// request builds the GetFlowsRequest.
func (o *observeOptions) request(now time.Time) (*observerpb.GetFlowsRequest, error) {
	req := &observerpb.GetFlowsRequest{Follow: o.follow}
	switch {
	case o.first > 0 && (o.last > 0 || o.all || o.follow):
		return nil, errors.New("--first goes with none of --last, --all, --follow")
	case o.first > 0:
		req.First, req.Number = true, o.first
	case o.all:
		req.Number = 0
	case o.last > 0:
		req.Number = o.last
	case !o.follow && o.since == "" && o.until == "":
		req.Number = 20
	}
	for _, t := range []struct {
		s   string
		dst **timestamppb.Timestamp
	}{{o.since, &req.Since}, {o.until, &req.Until}} {
		if t.s == "" {
			continue
		}
		at, err := parseTime(t.s, now)
		if err != nil {
			return nil, err
		}
		*t.dst = timestamppb.New(at)
	}
	filters, err := o.filters()
	if err != nil {
		return nil, err
	}
	req.Whitelist = filters
	return req, nil
}

func parseTime(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("time %q: want RFC 3339 or a duration ago (5m)", s)
	}
	return t, nil
}

// filters builds the allow list as hubble does: flags of either side make
// two filters (one with the source fields, one with the destination
// fields); from-/to- flags and the others go into both.
func (o *observeOptions) filters() ([]*flowpb.FlowFilter, error) {
	srcSide, dstSide := &flowpb.FlowFilter{}, &flowpb.FlowFilter{}
	either := false
	pods := func(ns []string) []string {
		var out []string
		for _, n := range ns {
			out = append(out, strings.TrimSuffix(n, "/")+"/")
		}
		return out
	}
	both := func(set func(*flowpb.FlowFilter)) { set(srcSide); set(dstSide) }
	if len(o.pod)+len(o.ns)+len(o.ip)+len(o.label)+len(o.identity)+len(o.port) > 0 {
		either = true
		srcSide.SourcePod = append(append([]string{}, o.pod...), pods(o.ns)...)
		dstSide.DestinationPod = append(append([]string{}, o.pod...), pods(o.ns)...)
		srcSide.SourceIp, dstSide.DestinationIp = o.ip, o.ip
		srcSide.SourceLabel, dstSide.DestinationLabel = o.label, o.label
		var ids []uint32
		for _, id := range o.identity {
			ids = append(ids, uint32(id))
		}
		srcSide.SourceIdentity, dstSide.DestinationIdentity = ids, ids
		srcSide.SourcePort, dstSide.DestinationPort = o.port, o.port
	}
	both(func(f *flowpb.FlowFilter) {
		f.SourcePod = append(f.SourcePod, append(o.fromPod, pods(o.fromNS)...)...)
		f.DestinationPod = append(f.DestinationPod, append(o.toPod, pods(o.toNS)...)...)
		f.SourceIp = append(f.SourceIp, o.fromIP...)
		f.DestinationIp = append(f.DestinationIp, o.toIP...)
		f.SourceLabel = append(f.SourceLabel, o.fromLabel...)
		f.DestinationLabel = append(f.DestinationLabel, o.toLabel...)
		f.SourcePort = append(f.SourcePort, o.fromPort...)
		f.DestinationPort = append(f.DestinationPort, o.toPort...)
		f.Protocol = o.protocol
		f.NodeName = o.nodes
		f.Reply = o.reply
		f.HttpStatusCode, f.HttpMethod, f.HttpPath, f.HttpUrl = o.httpStatus, o.httpMethod, o.httpPath, o.httpURL
		f.DnsQuery = o.dnsQuery
	})
	var common flowpb.FlowFilter
	for _, v := range o.verdict {
		n, ok := flowpb.Verdict_value[strings.ToUpper(v)]
		if !ok {
			return nil, fmt.Errorf("--verdict %q: want FORWARDED, DROPPED or AUDIT", v)
		}
		common.Verdict = append(common.Verdict, flowpb.Verdict(n))
	}
	for _, v := range o.dropReason {
		n, ok := flowpb.DropReason_value[strings.ToUpper(v)]
		if !ok {
			return nil, fmt.Errorf("--drop-reason %q: not a drop reason", v)
		}
		common.DropReasonDesc = append(common.DropReasonDesc, flowpb.DropReason(n))
	}
	for _, t := range o.types {
		et, err := eventType(t)
		if err != nil {
			return nil, err
		}
		common.EventType = append(common.EventType, et)
	}
	for _, fl := range o.tcpFlags {
		tf := &flowpb.TCPFlags{}
		for _, name := range strings.Split(fl, ",") {
			switch strings.ToUpper(strings.TrimSpace(name)) {
			case "SYN":
				tf.SYN = true
			case "ACK":
				tf.ACK = true
			case "FIN":
				tf.FIN = true
			case "RST":
				tf.RST = true
			case "PSH":
				tf.PSH = true
			case "URG":
				tf.URG = true
			case "ECE":
				tf.ECE = true
			case "CWR":
				tf.CWR = true
			default:
				return nil, fmt.Errorf("--tcp-flags %q: unknown flag %q", fl, name)
			}
		}
		common.TcpFlags = append(common.TcpFlags, tf)
	}
	both(func(f *flowpb.FlowFilter) {
		f.Verdict, f.DropReasonDesc, f.EventType, f.TcpFlags = common.Verdict, common.DropReasonDesc, common.EventType, common.TcpFlags
	})
	if !either {
		if isEmpty(srcSide) {
			return nil, nil
		}
		return []*flowpb.FlowFilter{srcSide}, nil
	}
	// Check locally what the server would refuse, for a clear message.
	if _, err := observer.CompileFilters([]*flowpb.FlowFilter{srcSide, dstSide}, nil); err != nil {
		return nil, err
	}
	return []*flowpb.FlowFilter{srcSide, dstSide}, nil
}

func isEmpty(f *flowpb.FlowFilter) bool {
	b, _ := protojson.Marshal(f)
	return string(b) == "{}"
}

func eventType(s string) (*flowpb.EventTypeFilter, error) {
	switch strings.ToLower(s) {
	case "drop":
		return &flowpb.EventTypeFilter{Type: observer.MessageTypeDrop}, nil
	case "trace":
		return &flowpb.EventTypeFilter{Type: observer.MessageTypeTrace}, nil
	case "trace:to-endpoint":
		return &flowpb.EventTypeFilter{Type: observer.MessageTypeTrace, MatchSubType: true, SubType: observer.TraceToEndpoint}, nil
	case "trace:from-endpoint":
		return &flowpb.EventTypeFilter{Type: observer.MessageTypeTrace, MatchSubType: true, SubType: observer.TraceFromEndpoint}, nil
	case "policy-verdict":
		return &flowpb.EventTypeFilter{Type: observer.MessageTypePolicyVerdict}, nil
	case "trace-sock":
		return &flowpb.EventTypeFilter{Type: observer.MessageTypeTraceSock}, nil
	case "l7":
		return &flowpb.EventTypeFilter{Type: observer.MessageTypeAccessLog}, nil
	}
	return nil, fmt.Errorf("--type %q: want drop, trace, trace:to-endpoint, trace:from-endpoint, policy-verdict, trace-sock or l7", s)
}

// dialTarget turns --server into a gRPC target.
func dialTarget(server string) string {
	if strings.HasPrefix(server, "unix://") || strings.HasPrefix(server, "dns:") {
		return server
	}
	if strings.HasPrefix(server, "/") {
		return "unix://" + server
	}
	return "passthrough:///" + server
}

func (o *observeOptions) run(ctx context.Context, out, errOut io.Writer) error {
	switch o.output {
	case "compact", "json", "jsonpb", "table":
	default:
		return fmt.Errorf("-o %q: want compact, json or table", o.output)
	}
	req, err := o.request(time.Now())
	if err != nil {
		return err
	}
	creds := insecure.NewCredentials()
	if o.tls || o.serverTLS.Enabled() {
		tc, err := o.serverTLS.Config(o.server)
		if err != nil {
			return fmt.Errorf("TLS to %s: %w", o.server, err)
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(dialTarget(o.server), grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", o.server, err)
	}
	defer conn.Close()
	stream, err := observerpb.NewObserverClient(conn).GetFlows(ctx, req)
	if err != nil {
		return fmt.Errorf("get flows from %s: %w", o.server, err)
	}
	p := newFlowPrinter(o.output, out)
	defer p.flush()
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) || (err != nil && ctx.Err() != nil) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("get flows from %s: %w", o.server, err)
		}
		if l := resp.GetLostEvents(); l != nil {
			fmt.Fprintf(errOut, "EVENTS LOST: %s %d\n", l.GetSource(), l.GetNumEventsLost())
			continue
		}
		if err := p.print(resp); err != nil {
			return err
		}
	}
}

// flowPrinter writes flows in one of the outputs.
type flowPrinter struct {
	format string
	w      io.Writer
	tw     *tabwriter.Writer
	header bool
}

func newFlowPrinter(format string, w io.Writer) *flowPrinter {
	p := &flowPrinter{format: format, w: w}
	if format == "table" {
		p.tw = tabwriter.NewWriter(w, 2, 0, 3, ' ', 0)
	}
	return p
}

func (p *flowPrinter) flush() {
	if p.tw != nil {
		p.tw.Flush()
	}
}

func (p *flowPrinter) print(resp *observerpb.GetFlowsResponse) error {
	f := resp.GetFlow()
	if f == nil {
		return nil
	}
	switch p.format {
	case "json", "jsonpb":
		b, err := protojson.Marshal(resp)
		if err != nil {
			return fmt.Errorf("encode flow: %w", err)
		}
		_, err = fmt.Fprintln(p.w, string(b))
		return err
	case "table":
		if !p.header {
			fmt.Fprintln(p.tw, "TIME\tNODE\tSOURCE\tDESTINATION\tTYPE\tVERDICT\tSUMMARY")
			p.header = true
		}
		fmt.Fprintf(p.tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", flowTime(f), f.GetNodeName(), endpointName(f, true), endpointName(f, false),
			typeName(f), f.GetVerdict(), summary(f))
		// Flushed per flow so --follow shows each at once.
		return p.tw.Flush()
	}
	_, err := fmt.Fprintf(p.w, "%s [%s]: %s -> %s %s %s%s\n", flowTime(f), f.GetNodeName(), endpointName(f, true), endpointName(f, false),
		typeName(f), f.GetVerdict(), detail(f))
	return err
}

func flowTime(f *flowpb.Flow) string {
	return f.GetTime().AsTime().Local().Format("Jan _2 15:04:05.000")
}

// endpointName is namespace/pod:port (ID:identity), or the address.
func endpointName(f *flowpb.Flow, source bool) string {
	ep, ip, port := f.GetDestination(), f.GetIP().GetDestination(), l4Port(f, false)
	if source {
		ep, ip, port = f.GetSource(), f.GetIP().GetSource(), l4Port(f, true)
	}
	if ip == "" && ep.GetPodName() == "" {
		return "socket" // a socket translated at connect: no address yet
	}
	name := ip
	if ep.GetPodName() != "" {
		name = ep.GetNamespace() + "/" + ep.GetPodName()
	}
	if port != "" {
		name += ":" + port
	}
	if ep.GetIdentity() != 0 {
		name += fmt.Sprintf(" (ID:%d)", ep.GetIdentity())
	} else {
		name += " (ID:?)"
	}
	return name
}

func l4Port(f *flowpb.Flow, source bool) string {
	l4 := f.GetL4()
	var s, d uint32
	switch {
	case l4.GetTCP() != nil:
		s, d = l4.GetTCP().GetSourcePort(), l4.GetTCP().GetDestinationPort()
	case l4.GetUDP() != nil:
		s, d = l4.GetUDP().GetSourcePort(), l4.GetUDP().GetDestinationPort()
	case l4.GetSCTP() != nil:
		s, d = l4.GetSCTP().GetSourcePort(), l4.GetSCTP().GetDestinationPort()
	default:
		return ""
	}
	if source {
		return strconv.Itoa(int(s))
	}
	return strconv.Itoa(int(d))
}

func typeName(f *flowpb.Flow) string {
	switch f.GetEventType().GetType() {
	case observer.MessageTypeDrop:
		return "drop"
	case observer.MessageTypePolicyVerdict:
		return "policy-verdict"
	case observer.MessageTypeTrace:
		if f.GetTraceObservationPoint() == flowpb.TraceObservationPoint_FROM_ENDPOINT {
			return "from-endpoint"
		}
		return "to-endpoint"
	case observer.MessageTypeTraceSock:
		return "post-xlate-fwd"
	case observer.MessageTypeAccessLog:
		// As hubble prints them: dns-response, http-request.
		kind := "l7"
		switch {
		case f.GetL7().GetDns() != nil:
			kind = "dns"
		case f.GetL7().GetHttp() != nil:
			kind = "http"
		}
		switch f.GetL7().GetType() {
		case flowpb.L7FlowType_REQUEST:
			return kind + "-request"
		case flowpb.L7FlowType_RESPONSE:
			return kind + "-response"
		}
		return kind
	}
	return "unknown"
}

// l7Text is what an L7 flow's record says: the DNS query and its answer,
// or the HTTP request and its response.
func l7Text(f *flowpb.Flow) string {
	l7 := f.GetL7()
	latency := time.Duration(l7.GetLatencyNs()).Round(time.Microsecond)
	if d := l7.GetDns(); d != nil {
		s := fmt.Sprintf("DNS %s %s %s", d.GetQuery(), strings.Join(d.GetQtypes(), ","), flowmetrics.RcodeName(d.GetRcode()))
		if len(d.GetIps()) > 0 {
			s += fmt.Sprintf(" %s TTL %d", strings.Join(d.GetIps(), ","), d.GetTtl())
		}
		if len(d.GetCnames()) > 0 {
			s += " CNAME " + strings.Join(d.GetCnames(), ",")
		}
		return s + " " + latency.String()
	}
	if h := l7.GetHttp(); h != nil {
		s := fmt.Sprintf("%s %s %s", h.GetProtocol(), h.GetMethod(), h.GetUrl())
		if h.GetCode() != 0 {
			s += fmt.Sprintf(" => %d", h.GetCode())
		}
		return s + " " + latency.String()
	}
	return ""
}

// detail is the compact line's tail: drop reason, TCP flags, policy.
func detail(f *flowpb.Flow) string {
	var parts []string
	if f.GetVerdict() == flowpb.Verdict_DROPPED {
		parts = append(parts, "("+dropReasonText(f.GetDropReasonDesc())+")")
	}
	if s := summary(f); s != "" {
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return ""
	}
	return " " + strings.Join(parts, " ")
}

func summary(f *flowpb.Flow) string {
	var parts []string
	if f.GetL7() != nil {
		// The record, then the proxy's reason (the rule, or why not).
		parts = append(parts, l7Text(f))
		if s := f.GetSummary(); s != "" {
			parts = append(parts, s)
		}
	}
	if svc := f.GetDestinationService(); f.GetType() == flowpb.FlowType_SOCK && svc != nil {
		parts = append(parts, "service "+svc.GetNamespace()+"/"+svc.GetName())
	}
	if fl := f.GetL4().GetTCP().GetFlags(); fl != nil {
		var names []string
		for _, x := range []struct {
			set  bool
			name string
		}{{fl.GetSYN(), "SYN"}, {fl.GetACK(), "ACK"}, {fl.GetFIN(), "FIN"}, {fl.GetRST(), "RST"}, {fl.GetPSH(), "PSH"}} {
			if x.set {
				names = append(names, x.name)
			}
		}
		parts = append(parts, "TCP Flags: "+strings.Join(names, ", "))
	}
	if f.GetIsReply().GetValue() {
		parts = append(parts, "reply")
	}
	// A default deny names the policies selecting the endpoint (why it
	// denies); a deny rule its own policy.
	defaultDeny := f.GetVerdict() == flowpb.Verdict_DROPPED && f.GetDropReasonDesc() == flowpb.DropReason_POLICY_DENIED
	var selecting []string
	for _, p := range [][]*flowpb.Policy{f.GetIngressDeniedBy(), f.GetEgressDeniedBy()} {
		for _, pol := range p {
			if defaultDeny {
				selecting = append(selecting, pol.GetNamespace()+"/"+pol.GetName())
				continue
			}
			parts = append(parts, fmt.Sprintf("denied by %s/%s", pol.GetNamespace(), pol.GetName()))
		}
	}
	for _, p := range [][]*flowpb.Policy{f.GetIngressAllowedBy(), f.GetEgressAllowedBy()} {
		for _, pol := range p {
			parts = append(parts, fmt.Sprintf("allowed by %s/%s", pol.GetNamespace(), pol.GetName()))
		}
	}
	if f.GetEventType().GetType() == observer.MessageTypePolicyVerdict && f.GetPolicyMatchType() != 0 {
		parts = append(parts, "match "+matchTypeName(f.GetPolicyMatchType()))
	}
	switch {
	case defaultDeny && len(selecting) > 0:
		parts = append(parts, "default deny of "+strings.Join(selecting, ", "))
	case defaultDeny:
		parts = append(parts, "default deny")
	}
	return strings.Join(parts, "; ")
}

// matchTypeName is a verdict's policy match type as hubble prints it.
func matchTypeName(t uint32) string {
	switch t {
	case 1:
		return "L3-Only"
	case 2:
		return "L3-L4"
	case 3:
		return "L4-Only"
	case 4:
		return "all"
	}
	return "unknown"
}

// dropReasonText is the reason as hubble prints it ("Policy denied").
func dropReasonText(r flowpb.DropReason) string {
	s := strings.ToLower(strings.ReplaceAll(r.String(), "_", " "))
	if s == "" {
		return "unknown"
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
