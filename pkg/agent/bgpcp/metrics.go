package bgpcp

import (
	"github.com/prometheus/client_golang/prometheus"
)

// peerMetrics are the sessions' state and the announced prefixes.
type peerMetrics struct {
	session    *prometheus.GaugeVec
	advertised prometheus.Gauge
	refused    prometheus.Gauge
	peers      map[[2]string]bool
}

func newPeerMetrics() *peerMetrics {
	return &peerMetrics{
		session: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "tendril", Subsystem: "bgp", Name: "session_established",
			Help: "Whether the BGP session with the peer is established: 1 yes, 0 no.",
		}, []string{"peer", "address"}),
		advertised: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "tendril", Subsystem: "bgp", Name: "advertised_prefixes",
			Help: "Prefixes this node announces to its BGP peers.",
		}),
		refused: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "tendril", Subsystem: "bgp", Name: "refused_prefixes",
			Help: "Prefixes an advertisement asked for that this node does not announce (outside its pod CIDRs and the LoadBalancer IP pools).",
		}),
		peers: map[[2]string]bool{},
	}
}

func (m *peerMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.session, m.advertised, m.refused}
}

func (m *peerMetrics) update(p Pass) {
	now := map[[2]string]bool{}
	for _, ps := range p.Peers {
		k := [2]string{ps.Name, ps.Address}
		now[k] = true
		v := 0.0
		if ps.State == "established" {
			v = 1
		}
		m.session.WithLabelValues(k[0], k[1]).Set(v)
	}
	for k := range m.peers {
		if !now[k] {
			m.session.DeleteLabelValues(k[0], k[1])
		}
	}
	m.peers = now
	m.advertised.Set(float64(p.Applied.Paths))
	m.refused.Set(float64(len(p.Desired.Refused)))
}
