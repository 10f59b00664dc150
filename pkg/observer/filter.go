package observer

import (
	"fmt"
	"net/netip"
	"path"
	"strconv"
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

// FilterFunc reports whether a flow matches.
type FilterFunc func(*flowpb.Flow) bool

// Filters are compiled allow and deny lists: a flow passes when it matches
// any allow filter (or the allow list is empty) and no deny filter.
type Filters struct {
	allow, deny []FilterFunc
}

// CompileFilters compiles GetFlows' whitelist (allow) and blacklist
// (deny). A filter field this observer cannot evaluate is an error, never
// ignored: ignoring it would show flows the caller excluded.
func CompileFilters(allow, deny []*flowpb.FlowFilter) (*Filters, error) {
	fs := &Filters{}
	for i, f := range allow {
		fn, err := Compile(f)
		if err != nil {
			return nil, fmt.Errorf("allow filter %d: %w", i, err)
		}
		fs.allow = append(fs.allow, fn)
	}
	for i, f := range deny {
		fn, err := Compile(f)
		if err != nil {
			return nil, fmt.Errorf("deny filter %d: %w", i, err)
		}
		fs.deny = append(fs.deny, fn)
	}
	return fs, nil
}

// Match applies the lists.
func (fs *Filters) Match(f *flowpb.Flow) bool {
	if fs == nil {
		return true
	}
	for _, d := range fs.deny {
		if d(f) {
			return false
		}
	}
	if len(fs.allow) == 0 {
		return true
	}
	for _, a := range fs.allow {
		if a(f) {
			return true
		}
	}
	return false
}

// Compile compiles one FlowFilter: every field set must match (and within
// a field, any of its values).
func Compile(ff *flowpb.FlowFilter) (FilterFunc, error) {
	if ff == nil {
		return func(*flowpb.Flow) bool { return true }, nil
	}
	if err := unsupported(ff); err != nil {
		return nil, err
	}
	var parts []FilterFunc
	add := func(fn FilterFunc, err error) error {
		if err != nil {
			return err
		}
		if fn != nil {
			parts = append(parts, fn)
		}
		return nil
	}
	src := func(f *flowpb.Flow) *flowpb.Endpoint { return f.GetSource() }
	dst := func(f *flowpb.Flow) *flowpb.Endpoint { return f.GetDestination() }
	for _, err := range []error{
		add(uuidFilter(ff.GetUuid())),
		add(ipFilter(ff.GetSourceIp(), func(f *flowpb.Flow) string { return f.GetIP().GetSource() })),
		add(ipFilter(ff.GetDestinationIp(), func(f *flowpb.Flow) string { return f.GetIP().GetDestination() })),
		add(podFilter(ff.GetSourcePod(), src)),
		add(podFilter(ff.GetDestinationPod(), dst)),
		add(labelFilter(ff.GetSourceLabel(), src)),
		add(labelFilter(ff.GetDestinationLabel(), dst)),
		add(identityFilter(ff.GetSourceIdentity(), src)),
		add(identityFilter(ff.GetDestinationIdentity(), dst)),
		add(portFilter(ff.GetSourcePort(), true)),
		add(portFilter(ff.GetDestinationPort(), false)),
		add(protocolFilter(ff.GetProtocol())),
		add(verdictFilter(ff.GetVerdict())),
		add(dropReasonFilter(ff.GetDropReasonDesc())),
		add(eventTypeFilter(ff.GetEventType())),
		add(nodeFilter(ff.GetNodeName())),
		add(replyFilter(ff.GetReply())),
		add(tcpFlagsFilter(ff.GetTcpFlags())),
		add(directionFilter(ff.GetTrafficDirection())),
		add(ipVersionFilter(ff.GetIpVersion())),
		add(httpStatusFilter(ff.GetHttpStatusCode())),
		add(httpMethodFilter(ff.GetHttpMethod())),
		add(httpPathFilter(ff.GetHttpPath())),
		add(httpURLFilter(ff.GetHttpUrl())),
		add(dnsQueryFilter(ff.GetDnsQuery())),
	} {
		if err != nil {
			return nil, err
		}
	}
	return func(f *flowpb.Flow) bool {
		for _, p := range parts {
			if !p(f) {
				return false
			}
		}
		return true
	}, nil
}

// unsupported names the first set field this observer has no data for.
func unsupported(ff *flowpb.FlowFilter) error {
	for name, set := range map[string]bool{
		"source_fqdn": len(ff.GetSourceFqdn()) > 0, "destination_fqdn": len(ff.GetDestinationFqdn()) > 0,
		"source_service": len(ff.GetSourceService()) > 0, "destination_service": len(ff.GetDestinationService()) > 0,
		"source_workload": len(ff.GetSourceWorkload()) > 0, "destination_workload": len(ff.GetDestinationWorkload()) > 0,
		"source_ip_xlated": len(ff.GetSourceIpXlated()) > 0, "source_cluster_name": len(ff.GetSourceClusterName()) > 0,
		"destination_cluster_name": len(ff.GetDestinationClusterName()) > 0, "interface": len(ff.GetInterface()) > 0,
		// The HTTP proxy's flows carry no headers.
		"http_header": len(ff.GetHttpHeader()) > 0, "node_labels": len(ff.GetNodeLabels()) > 0, "trace_id": len(ff.GetTraceId()) > 0,
		"experimental.cel_expression": len(ff.GetExperimental().GetCelExpression()) > 0,
	} {
		if set {
			return fmt.Errorf("filter field %s is not supported by this observer (flows carry no such data)", name)
		}
	}
	return nil
}

func uuidFilter(ids []string) (FilterFunc, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	return func(f *flowpb.Flow) bool {
		for _, id := range ids {
			if f.GetUuid() == id {
				return true
			}
		}
		return false
	}, nil
}

// ipFilter matches addresses or CIDR prefixes.
func ipFilter(values []string, get func(*flowpb.Flow) string) (FilterFunc, error) {
	if len(values) == 0 {
		return nil, nil
	}
	var prefixes []netip.Prefix
	for _, v := range values {
		if strings.Contains(v, "/") {
			p, err := netip.ParsePrefix(v)
			if err != nil {
				return nil, fmt.Errorf("ip filter %q: %w", v, err)
			}
			prefixes = append(prefixes, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(v)
		if err != nil {
			return nil, fmt.Errorf("ip filter %q: %w", v, err)
		}
		prefixes = append(prefixes, netip.PrefixFrom(a, a.BitLen()))
	}
	return func(f *flowpb.Flow) bool {
		a, err := netip.ParseAddr(get(f))
		if err != nil {
			return false
		}
		for _, p := range prefixes {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}, nil
}

// podFilter matches "namespace/pod-prefix": "ns/" is any pod of ns,
// "/prefix" any namespace, "prefix" the default namespace.
func podFilter(values []string, side func(*flowpb.Flow) *flowpb.Endpoint) (FilterFunc, error) {
	if len(values) == 0 {
		return nil, nil
	}
	type pod struct{ ns, prefix string }
	var pods []pod
	for _, v := range values {
		ns, name, ok := strings.Cut(v, "/")
		if !ok {
			ns, name = "default", v
		}
		pods = append(pods, pod{ns, name})
	}
	return func(f *flowpb.Flow) bool {
		ep := side(f)
		if ep.GetPodName() == "" && ep.GetNamespace() == "" {
			return false
		}
		for _, p := range pods {
			if (p.ns == "" || p.ns == ep.GetNamespace()) && strings.HasPrefix(ep.GetPodName(), p.prefix) {
				return true
			}
		}
		return false
	}, nil
}

func labelFilter(values []string, side func(*flowpb.Flow) *flowpb.Endpoint) (FilterFunc, error) {
	if len(values) == 0 {
		return nil, nil
	}
	var sels []Selector
	for _, v := range values {
		s, err := ParseSelector(v)
		if err != nil {
			return nil, err
		}
		sels = append(sels, s)
	}
	return func(f *flowpb.Flow) bool {
		labels := side(f).GetLabels()
		for _, s := range sels {
			if s.Matches(labels) {
				return true
			}
		}
		return false
	}, nil
}

func identityFilter(ids []uint32, side func(*flowpb.Flow) *flowpb.Endpoint) (FilterFunc, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	return func(f *flowpb.Flow) bool {
		for _, id := range ids {
			if side(f).GetIdentity() == id {
				return true
			}
		}
		return false
	}, nil
}

// ports returns a flow's L4 ports (false for ICMP and other protocols).
func ports(f *flowpb.Flow) (src, dst uint32, ok bool) {
	l4 := f.GetL4()
	switch {
	case l4.GetTCP() != nil:
		return l4.GetTCP().GetSourcePort(), l4.GetTCP().GetDestinationPort(), true
	case l4.GetUDP() != nil:
		return l4.GetUDP().GetSourcePort(), l4.GetUDP().GetDestinationPort(), true
	case l4.GetSCTP() != nil:
		return l4.GetSCTP().GetSourcePort(), l4.GetSCTP().GetDestinationPort(), true
	}
	return 0, 0, false
}

func portFilter(values []string, source bool) (FilterFunc, error) {
	if len(values) == 0 {
		return nil, nil
	}
	var want []uint32
	for _, v := range values {
		p, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("port filter %q: not a port number", v)
		}
		want = append(want, uint32(p))
	}
	return func(f *flowpb.Flow) bool {
		s, d, ok := ports(f)
		if !ok {
			return false
		}
		got := d
		if source {
			got = s
		}
		for _, w := range want {
			if w == got {
				return true
			}
		}
		return false
	}, nil
}

func protocolFilter(values []string) (FilterFunc, error) {
	if len(values) == 0 {
		return nil, nil
	}
	want := map[string]bool{}
	for _, v := range values {
		v = strings.ToLower(v)
		switch v {
		case "tcp", "udp", "sctp", "icmpv4", "icmpv6":
			want[v] = true
		case "icmp":
			want["icmpv4"], want["icmpv6"] = true, true
		case "http", "dns":
			// The proxies' L7 flows (their L4 protocol matches too).
			want[v] = true
		default:
			return nil, fmt.Errorf("protocol filter %q: want tcp, udp, sctp, icmp, icmpv4, icmpv6, http or dns", v)
		}
	}
	return func(f *flowpb.Flow) bool {
		if (want["http"] && f.GetL7().GetHttp() != nil) || (want["dns"] && f.GetL7().GetDns() != nil) {
			return true
		}
		l4 := f.GetL4()
		switch {
		case l4.GetTCP() != nil:
			return want["tcp"]
		case l4.GetUDP() != nil:
			return want["udp"]
		case l4.GetSCTP() != nil:
			return want["sctp"]
		case l4.GetICMPv4() != nil:
			return want["icmpv4"]
		case l4.GetICMPv6() != nil:
			return want["icmpv6"]
		}
		return false
	}, nil
}

func verdictFilter(vs []flowpb.Verdict) (FilterFunc, error) {
	if len(vs) == 0 {
		return nil, nil
	}
	return func(f *flowpb.Flow) bool {
		for _, v := range vs {
			if f.GetVerdict() == v {
				return true
			}
		}
		return false
	}, nil
}

func dropReasonFilter(rs []flowpb.DropReason) (FilterFunc, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	return func(f *flowpb.Flow) bool {
		for _, r := range rs {
			if f.GetDropReasonDesc() == r {
				return true
			}
		}
		return false
	}, nil
}

func eventTypeFilter(ts []*flowpb.EventTypeFilter) (FilterFunc, error) {
	if len(ts) == 0 {
		return nil, nil
	}
	return func(f *flowpb.Flow) bool {
		et := f.GetEventType()
		for _, t := range ts {
			if et.GetType() == t.GetType() && (!t.GetMatchSubType() || et.GetSubType() == t.GetSubType()) {
				return true
			}
		}
		return false
	}, nil
}

// nodeFilter matches glob patterns against the node name; a pattern with
// a cluster part ("cluster/node") matches its node part (flows carry no
// cluster name: this observer serves one cluster).
func nodeFilter(patterns []string) (FilterFunc, error) {
	if len(patterns) == 0 {
		return nil, nil
	}
	var globs []string
	for _, p := range patterns {
		if _, node, ok := strings.Cut(p, "/"); ok {
			p = node
		}
		if p == "" {
			p = "*"
		}
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("node name filter %q: %w", p, err)
		}
		globs = append(globs, p)
	}
	return func(f *flowpb.Flow) bool {
		for _, g := range globs {
			if ok, _ := path.Match(g, f.GetNodeName()); ok {
				return true
			}
		}
		return false
	}, nil
}

// replyFilter: a flow whose reply state is unknown matches no value.
func replyFilter(values []bool) (FilterFunc, error) {
	if len(values) == 0 {
		return nil, nil
	}
	return func(f *flowpb.Flow) bool {
		if f.GetIsReply() == nil {
			return false
		}
		for _, v := range values {
			if f.GetIsReply().GetValue() == v {
				return true
			}
		}
		return false
	}, nil
}

// tcpFlagsFilter: a flow matches a TCPFlags value when it has every flag
// the value sets.
func tcpFlagsFilter(values []*flowpb.TCPFlags) (FilterFunc, error) {
	if len(values) == 0 {
		return nil, nil
	}
	bits := func(t *flowpb.TCPFlags) uint16 {
		var b uint16
		for i, set := range []bool{t.GetFIN(), t.GetSYN(), t.GetRST(), t.GetPSH(), t.GetACK(), t.GetURG(), t.GetECE(), t.GetCWR(), t.GetNS()} {
			if set {
				b |= 1 << i
			}
		}
		return b
	}
	return func(f *flowpb.Flow) bool {
		got := bits(f.GetL4().GetTCP().GetFlags())
		for _, v := range values {
			if w := bits(v); w != 0 && got&w == w {
				return true
			}
		}
		return false
	}, nil
}

func directionFilter(ds []flowpb.TrafficDirection) (FilterFunc, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	return func(f *flowpb.Flow) bool {
		for _, d := range ds {
			if f.GetTrafficDirection() == d {
				return true
			}
		}
		return false
	}, nil
}

func ipVersionFilter(vs []flowpb.IPVersion) (FilterFunc, error) {
	if len(vs) == 0 {
		return nil, nil
	}
	return func(f *flowpb.Flow) bool {
		for _, v := range vs {
			if f.GetIP().GetIpVersion() == v {
				return true
			}
		}
		return false
	}, nil
}
