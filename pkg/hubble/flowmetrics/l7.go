package flowmetrics

import (
	"strconv"
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/prometheus/client_golang/prometheus"
)

// eventL7 is the event type of the proxies' L7 flows (Cilium's access
// log record).
const eventL7 = 129

// l7Metrics are the dns and http groups, Cilium's metrics of the same
// names over the L7 flows the node's proxies publish.
type l7Metrics struct {
	dnsQueries, dnsResponses    *prometheus.CounterVec
	httpRequests, httpResponses *prometheus.CounterVec
	httpDuration                *prometheus.HistogramVec
	// values bounds the labels a client chooses (HTTP method and
	// protocol, the DNS query types).
	values *limiter
}

func newDNSMetrics(m *l7Metrics) []prometheus.Collector {
	m.dnsQueries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tendril_hubble_dns_queries_total",
		Help: "DNS queries the DNS proxy saw, by query type (rcode and ips_returned are empty: a query has none).",
	}, []string{"rcode", "qtypes", "ips_returned"})
	m.dnsResponses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tendril_hubble_dns_responses_total",
		Help: "DNS responses the DNS proxy gave, by rcode, query type and number of addresses returned.",
	}, []string{"rcode", "qtypes", "ips_returned"})
	return []prometheus.Collector{m.dnsQueries, m.dnsResponses}
}

func newHTTPMetrics(m *l7Metrics) []prometheus.Collector {
	m.httpRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tendril_hubble_http_requests_total",
		Help: "HTTP requests the HTTP proxy saw, by method, protocol and reporter (client: egress, server: ingress).",
	}, []string{"method", "protocol", "reporter"})
	m.httpResponses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tendril_hubble_http_responses_total",
		Help: "HTTP responses, by request method, status code and reporter (a request the proxy denied counts with status 403).",
	}, []string{"method", "status", "reporter"})
	m.httpDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "tendril_hubble_http_request_duration_seconds",
		Help: "Time from an HTTP request to its response, as the proxy measured it, by method and reporter.",
		// Prometheus's default buckets (5 ms to 10 s), as Cilium's.
		Buckets: prometheus.DefBuckets,
	}, []string{"method", "reporter"})
	return []prometheus.Collector{m.httpRequests, m.httpResponses, m.httpDuration}
}

// observe counts one L7 flow. The proxies record one flow per exchange,
// of type RESPONSE, once the answer is known: such a flow counts its
// query (request) and its response. A REQUEST flow (none of Tendril's
// proxies record one) counts a query alone.
func (m *l7Metrics) observe(f *flowpb.Flow) {
	l7 := f.GetL7()
	if l7 == nil {
		return
	}
	response := l7.GetType() == flowpb.L7FlowType_RESPONSE
	if rec := l7.GetDns(); rec != nil && m.dnsQueries != nil {
		qtypes := m.values.value(strings.Join(rec.GetQtypes(), ","))
		m.dnsQueries.WithLabelValues("", qtypes, "").Inc()
		if response {
			m.dnsResponses.WithLabelValues(RcodeName(rec.GetRcode()), qtypes, strconv.Itoa(len(rec.GetIps()))).Inc()
		}
	}
	if rec := l7.GetHttp(); rec != nil && m.httpRequests != nil {
		method, reporter := m.values.value(rec.GetMethod()), reporterOf(f)
		m.httpRequests.WithLabelValues(method, m.values.value(rec.GetProtocol()), reporter).Inc()
		if response {
			m.httpResponses.WithLabelValues(method, strconv.Itoa(int(rec.GetCode())), reporter).Inc()
			m.httpDuration.WithLabelValues(method, reporter).Observe(float64(l7.GetLatencyNs()) / 1e9)
		}
	}
}

// RcodeName is a DNS rcode as dig prints it (NOERROR, REFUSED), RCODEn
// for one the proxy does not answer with.
func RcodeName(rc uint32) string {
	switch rc {
	case 0:
		return "NOERROR"
	case 1:
		return "FORMERR"
	case 2:
		return "SERVFAIL"
	case 3:
		return "NXDOMAIN"
	case 4:
		return "NOTIMP"
	case 5:
		return "REFUSED"
	}
	return "RCODE" + strconv.FormatUint(uint64(rc), 10)
}

// reporterOf is Cilium's reporter label: client for what a pod sent
// (egress), server for what it received (ingress).
func reporterOf(f *flowpb.Flow) string {
	switch f.GetTrafficDirection() {
	case flowpb.TrafficDirection_EGRESS:
		return "client"
	case flowpb.TrafficDirection_INGRESS:
		return "server"
	}
	return "unknown"
}
