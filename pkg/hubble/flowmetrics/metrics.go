// Package flowmetrics derives Prometheus metrics from decoded flows: flows
// by type and verdict, drops by reason and by policy, new connections per
// service and the TCP connect round-trip time (SYN to SYN-ACK) per service
// and destination workload. The observer hands it every flow it decodes;
// it keeps no flow, only counters, a histogram and the SYNs waiting for
// their SYN-ACK (bounded).
package flowmetrics

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"
)

// Names of the metric groups, the values of --hubble-metrics.
const (
	// MetricFlow counts flows by type, sub-type and verdict.
	MetricFlow = "flow"
	// MetricDrop counts drops by reason and protocol.
	MetricDrop = "drop"
	// MetricPolicy counts policy drops by the policy that denied
	// (namespace/name, or "default deny") and policy verdicts by match
	// type.
	MetricPolicy = "policy"
	// MetricService counts new connections per service.
	MetricService = "service"
	// MetricTCPConnect is the SYN to SYN-ACK histogram.
	MetricTCPConnect = "tcp-connect"
	// MetricDNS counts the DNS proxy's queries and responses.
	MetricDNS = "dns"
	// MetricHTTP counts the HTTP proxy's requests and responses and
	// times them.
	MetricHTTP = "http"
)

// All is every metric group, in the order the help lists them.
var All = []string{MetricFlow, MetricDrop, MetricPolicy, MetricService, MetricTCPConnect, MetricDNS, MetricHTTP}

// DefaultDeny is the policy label of a drop no rule asked for: the
// endpoint enforces policy and nothing allowed the flow.
const DefaultDeny = "default deny"

// NoService is the service label of a connection to no service.
const NoService = "none"

// Overflow is the label value that stands for every value past a label's
// limit.
const Overflow = "other"

// Defaults of Config.
const (
	DefaultMaxLabelValues = 100
	DefaultMaxPending     = 16384
	// PendingTimeout is how long a SYN waits for its SYN-ACK before it
	// may be evicted.
	PendingTimeout = 30 * time.Second
)

// Config selects and bounds the metrics.
type Config struct {
	// Metrics are the groups to export (All's names); none: nothing.
	Metrics []string
	// MaxLabelValues bounds the distinct values of each unbounded label
	// (service, destination workload, policy): values past it count as
	// "other". DefaultMaxLabelValues when 0.
	MaxLabelValues int
	// MaxPending bounds the SYNs waiting for their SYN-ACK.
	// DefaultMaxPending when 0.
	MaxPending int
}

// Validate checks the metric names.
func (c Config) Validate() error {
	for _, n := range c.Metrics {
		if !slices.Contains(All, n) {
			return fmt.Errorf("hubble metric %q: must be one of %s", n, strings.Join(All, ", "))
		}
	}
	if c.MaxLabelValues < 0 || c.MaxPending < 0 {
		return fmt.Errorf("hubble metrics: limits must not be negative")
	}
	return nil
}

// Metrics is the set of flow metrics registered in one registry. Observe
// is safe for concurrent use.
type Metrics struct {
	flows          *prometheus.CounterVec
	drops          *prometheus.CounterVec
	policyDrops    *prometheus.CounterVec
	policyVerdicts *prometheus.CounterVec
	newConns       *prometheus.CounterVec
	connectRTT     *prometheus.HistogramVec

	services, workloads, policies *limiter
	connects                      *connectTracker

	l7 l7Metrics
}

// New creates the selected metrics and registers them in reg.
func New(cfg Config, reg prometheus.Registerer) (*Metrics, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	maxValues := cfg.MaxLabelValues
	if maxValues == 0 {
		maxValues = DefaultMaxLabelValues
	}
	maxPending := cfg.MaxPending
	if maxPending == 0 {
		maxPending = DefaultMaxPending
	}
	m := &Metrics{services: newLimiter(maxValues), workloads: newLimiter(maxValues), policies: newLimiter(maxValues)}
	m.l7.values = newLimiter(maxValues)
	var cs []prometheus.Collector
	for _, name := range cfg.Metrics {
		switch name {
		case MetricFlow:
			m.flows = prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "tendril_hubble_flows_processed_total",
				Help: "Flows decoded, by event type, sub-type (observation point of traces) and verdict.",
			}, []string{"type", "subtype", "verdict"})
			cs = append(cs, m.flows)
		case MetricDrop:
			m.drops = prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "tendril_hubble_drop_total",
				Help: "Dropped flows by drop reason and protocol.",
			}, []string{"reason", "protocol"})
			cs = append(cs, m.drops)
		case MetricPolicy:
			m.policyDrops = prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "tendril_hubble_policy_drops_total",
				Help: `Flows dropped by policy, by direction and the policy that denied them (namespace/name, or "default deny").`,
			}, []string{"direction", "policy"})
			m.policyVerdicts = prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "tendril_hubble_policy_verdicts_total",
				Help: "Policy verdicts on new flows, by direction, match type and action.",
			}, []string{"direction", "match", "action"})
			cs = append(cs, m.policyDrops, m.policyVerdicts)
		case MetricService:
			m.newConns = prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "tendril_hubble_service_new_connections_total",
				Help: "New connections to a service (namespace/name), by protocol.",
			}, []string{"service", "protocol"})
			cs = append(cs, m.newConns)
		case MetricTCPConnect:
			m.connectRTT = prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Name: "tendril_hubble_tcp_connect_rtt_seconds",
				Help: "TCP connect round-trip time, from the SYN to the SYN-ACK as the datapath saw them, by service and destination workload.",
				// 50 µs to about 6.5 s: a connect on the node to one across
				// a slow network.
				Buckets: prometheus.ExponentialBuckets(50e-6, 2, 18),
			}, []string{"service", "destination_workload"})
			m.connects = newConnectTracker(maxPending)
			cs = append(cs, m.connectRTT)
		case MetricDNS:
			cs = append(cs, newDNSMetrics(&m.l7)...)
		case MetricHTTP:
			cs = append(cs, newHTTPMetrics(&m.l7)...)
		}
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register flow metric: %w", err)
		}
	}
	return m, nil
}

// Observe counts one flow.
func (m *Metrics) Observe(f *flowpb.Flow) {
	if m.flows != nil {
		typ, sub := eventTypeNames(f)
		m.flows.WithLabelValues(typ, sub, f.GetVerdict().String()).Inc()
	}
	if f.GetVerdict() == flowpb.Verdict_DROPPED && f.GetEventType().GetType() == eventDrop {
		if m.drops != nil {
			m.drops.WithLabelValues(f.GetDropReasonDesc().String(), protocol(f)).Inc()
		}
		if m.policyDrops != nil {
			if pol, ok := denyingPolicy(f); ok {
				m.policyDrops.WithLabelValues(direction(f), m.policies.value(pol)).Inc()
			}
		}
	}
	if m.policyVerdicts != nil && f.GetEventType().GetType() == eventPolicyVerdict {
		action := "allowed"
		if f.GetVerdict() == flowpb.Verdict_DROPPED {
			action = "denied"
		}
		m.policyVerdicts.WithLabelValues(direction(f), MatchTypeName(f.GetPolicyMatchType()), action).Inc()
	}
	if m.newConns != nil && isNewConnection(f) {
		if svc := serviceName(f.GetDestinationService()); svc != "" {
			m.newConns.WithLabelValues(m.services.value(svc), protocol(f)).Inc()
		}
	}
	if m.connectRTT != nil {
		m.observeConnect(f)
	}
	if f.GetEventType().GetType() == eventL7 {
		m.l7.observe(f)
	}
}

// observeConnect remembers a SYN and, at its SYN-ACK, records the time
// between them.
func (m *Metrics) observeConnect(f *flowpb.Flow) {
	tcp := f.GetL4().GetTCP()
	flags := tcp.GetFlags()
	if tcp == nil || !flags.GetSYN() || flags.GetRST() || f.GetVerdict() == flowpb.Verdict_DROPPED || f.GetIP() == nil {
		return
	}
	at := f.GetTime().AsTime()
	if !flags.GetACK() {
		key := connKey{src: f.GetIP().GetSource(), dst: f.GetIP().GetDestination(), sport: tcp.GetSourcePort(), dport: tcp.GetDestinationPort()}
		svc := serviceName(f.GetDestinationService())
		if svc == "" {
			svc = NoService
		}
		m.connects.syn(key, pendingConnect{at: at, service: svc, workload: workloadOf(f.GetDestination())})
		return
	}
	// The SYN-ACK goes the other way.
	key := connKey{src: f.GetIP().GetDestination(), dst: f.GetIP().GetSource(), sport: tcp.GetDestinationPort(), dport: tcp.GetSourcePort()}
	p, ok := m.connects.synAck(key)
	if !ok {
		return
	}
	rtt := at.Sub(p.at)
	if rtt < 0 {
		return // clocks of two CPUs' events: not a measurement
	}
	m.connectRTT.WithLabelValues(m.services.value(p.service), m.workloads.value(p.workload)).Observe(rtt.Seconds())
}

// Cilium's monitor event types, as the observer numbers them.
const (
	eventDrop          = 1
	eventTrace         = 4
	eventPolicyVerdict = 5
)

func eventTypeNames(f *flowpb.Flow) (typ, sub string) {
	switch f.GetEventType().GetType() {
	case eventDrop:
		return "drop", ""
	case eventTrace:
		switch f.GetTraceObservationPoint() {
		case flowpb.TraceObservationPoint_FROM_ENDPOINT:
			return "trace", "from-endpoint"
		case flowpb.TraceObservationPoint_TO_ENDPOINT:
			return "trace", "to-endpoint"
		}
		return "trace", "other"
	case eventPolicyVerdict:
		return "policy-verdict", ""
	case eventL7:
		switch {
		case f.GetL7().GetDns() != nil:
			return "l7", "dns"
		case f.GetL7().GetHttp() != nil:
			return "l7", "http"
		}
		return "l7", ""
	}
	return "unknown", ""
}

// Policy match types of verdict flows (flow.Flow.policy_match_type), as
// Cilium's monitor numbers them.
const (
	MatchNone   = 0
	MatchL3Only = 1
	MatchL3L4   = 2
	MatchL4Only = 3
	MatchAll    = 4
)

// MatchTypeName is the label of a policy match type.
func MatchTypeName(t uint32) string {
	switch t {
	case MatchL3Only:
		return "l3-only"
	case MatchL3L4:
		return "l3-l4"
	case MatchL4Only:
		return "l4-only"
	case MatchAll:
		return "all"
	}
	return "none"
}

// denyingPolicy names the policy of a policy drop: the deny rule's policy
// or the default deny; false for drops of other reasons.
func denyingPolicy(f *flowpb.Flow) (string, bool) {
	switch f.GetDropReasonDesc() {
	case flowpb.DropReason_POLICY_DENIED:
		return DefaultDeny, true
	case flowpb.DropReason_POLICY_DENY:
		by := f.GetIngressDeniedBy()
		if len(by) == 0 {
			by = f.GetEgressDeniedBy()
		}
		if len(by) == 0 {
			return "unknown", true // the rule went away before the decode
		}
		return PolicyName(by[0]), true
	}
	return "", false
}

// PolicyName is namespace/name, or the name of a cluster-wide policy.
func PolicyName(p *flowpb.Policy) string {
	if p.GetNamespace() == "" {
		return p.GetName()
	}
	return p.GetNamespace() + "/" + p.GetName()
}

func direction(f *flowpb.Flow) string {
	switch f.GetTrafficDirection() {
	case flowpb.TrafficDirection_INGRESS:
		return "ingress"
	case flowpb.TrafficDirection_EGRESS:
		return "egress"
	}
	return "unknown"
}

func protocol(f *flowpb.Flow) string {
	l4 := f.GetL4()
	switch {
	case l4.GetTCP() != nil:
		return "TCP"
	case l4.GetUDP() != nil:
		return "UDP"
	case l4.GetSCTP() != nil:
		return "SCTP"
	case l4.GetICMPv4() != nil:
		return "ICMPv4"
	case l4.GetICMPv6() != nil:
		return "ICMPv6"
	}
	return "unknown"
}

func serviceName(s *flowpb.Service) string {
	if s.GetName() == "" {
		return ""
	}
	if s.GetNamespace() == "" {
		return s.GetName()
	}
	return s.GetNamespace() + "/" + s.GetName()
}

// isNewConnection is true once per connection: the trace of its first
// packet where it leaves the client's endpoint, or, when the client is
// not a local endpoint, where it reaches the server's.
func isNewConnection(f *flowpb.Flow) bool {
	if f.GetEventType().GetType() != eventTrace || f.GetTraceReason() != flowpb.TraceReason_NEW || f.GetIsReply().GetValue() {
		return false
	}
	switch f.GetTraceObservationPoint() {
	case flowpb.TraceObservationPoint_FROM_ENDPOINT:
		return true
	case flowpb.TraceObservationPoint_TO_ENDPOINT:
		return f.GetSource().GetID() == 0
	}
	return false
}

// workloadOf names a destination with bounded cardinality: namespace and
// workload (its owner), else namespace and its app label, else its
// reserved or CIDR label, else "unknown". Never a pod name (one series
// per pod would grow without bound).
func workloadOf(e *flowpb.Endpoint) string {
	if e == nil {
		return "unknown"
	}
	if w := e.GetWorkloads(); len(w) > 0 && w[0].GetName() != "" {
		return e.GetNamespace() + "/" + w[0].GetName()
	}
	labels := e.GetLabels()
	for _, key := range []string{"k8s:app.kubernetes.io/name=", "k8s:app=", "k8s:k8s-app="} {
		for _, l := range labels {
			if v, ok := strings.CutPrefix(l, key); ok && v != "" {
				return e.GetNamespace() + "/" + v
			}
		}
	}
	for _, l := range labels {
		if strings.HasPrefix(l, "reserved:") {
			return l
		}
	}
	if len(labels) > 0 && strings.HasPrefix(labels[0], "cidr:") {
		return "world" // one series for every CIDR, whatever the rules name
	}
	return "unknown"
}

// limiter keeps at most max distinct values of a label: the first ones
// seen; the others read as Overflow.
type limiter struct {
	mu     sync.Mutex
	max    int
	values map[string]struct{}
}

func newLimiter(max int) *limiter { return &limiter{max: max, values: map[string]struct{}{}} }

func (l *limiter) value(v string) string {
	if v == NoService {
		return v // not a value of its own: never crowded out
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.values[v]; ok {
		return v
	}
	if len(l.values) >= l.max {
		return Overflow
	}
	l.values[v] = struct{}{}
	return v
}
