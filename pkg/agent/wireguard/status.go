package wireguard

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places the section in `tendril status` (pkg/status): after
// node health (75), before the tables (80).
const statusOrder = 76

func statusContribution(e *Encryption) status.Out {
	if e == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: statusOrder, Section: status.Always(e.StatusSection)})
}

// StatusSection is the Encryption section: the device, this node's key,
// and per peer its node, endpoint, last handshake and bytes each way;
// the nodes left out, with why.
func (e *Encryption) StatusSection() ext.Section {
	st := e.State()
	sec := ext.Section{Title: "Encryption"}
	add := func(k, v string) { sec.Lines = append(sec.Lines, ext.Line{Key: k, Value: v}) }
	add("Mode", "WireGuard")
	add("Device", fmt.Sprintf("%s, UDP port %d", st.Device, st.Port))
	add("Public key", st.PublicKey)
	if st.Err != nil {
		add("Error", st.Err.Error())
	}
	add("Peers", fmt.Sprint(len(st.Peers)))
	peers := st.Peers
	sort.Slice(peers, func(i, j int) bool { return st.Nodes[peers[i].PublicKey] < st.Nodes[peers[j].PublicKey] })
	for _, p := range peers {
		hs := "never"
		if !p.LastHandshakeTime.IsZero() {
			hs = time.Since(p.LastHandshakeTime).Truncate(time.Second).String() + " ago"
		}
		name := st.Nodes[p.PublicKey]
		if name == "" {
			name = p.PublicKey.String()
		}
		ep := "none"
		if p.Endpoint != nil {
			ep = p.Endpoint.String()
		}
		allowed := make([]string, 0, len(p.AllowedIPs))
		for _, a := range p.AllowedIPs {
			allowed = append(allowed, a.String())
		}
		add(name, fmt.Sprintf("endpoint %s, allowed %s, last handshake %s, received %d B, sent %d B",
			ep, strings.Join(allowed, ","), hs, p.ReceiveBytes, p.TransmitBytes))
	}
	names := make([]string, 0, len(st.Skipped))
	for n := range st.Skipped {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		add(n, "NOT A PEER: "+st.Skipped[n])
	}
	names = names[:0]
	for n := range st.RefusedAddrs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		add(n, "ADDRESSES NOT ITS OWN: "+st.RefusedAddrs[n])
	}
	return sec
}

// collector reads the device at each scrape.
type collector struct {
	e                  *Encryption
	peers, rx, tx, hsh *prometheus.Desc
}

func newCollector(e *Encryption) *collector {
	return &collector{e: e,
		peers: prometheus.NewDesc("tendril_wireguard_peers", "WireGuard peers on the device.", nil, nil),
		rx:    prometheus.NewDesc("tendril_wireguard_peer_received_bytes_total", "Bytes received from a WireGuard peer.", []string{"node"}, nil),
		tx:    prometheus.NewDesc("tendril_wireguard_peer_sent_bytes_total", "Bytes sent to a WireGuard peer.", []string{"node"}, nil),
		hsh: prometheus.NewDesc("tendril_wireguard_peer_last_handshake_seconds", "Unix time of the last handshake with a WireGuard peer (0: none).",
			[]string{"node"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.peers
	ch <- c.rx
	ch <- c.tx
	ch <- c.hsh
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.e.State()
	ch <- prometheus.MustNewConstMetric(c.peers, prometheus.GaugeValue, float64(len(st.Peers)))
	for _, p := range st.Peers {
		name := st.Nodes[p.PublicKey]
		if name == "" {
			name = p.PublicKey.String()
		}
		ch <- prometheus.MustNewConstMetric(c.rx, prometheus.CounterValue, float64(p.ReceiveBytes), name)
		ch <- prometheus.MustNewConstMetric(c.tx, prometheus.CounterValue, float64(p.TransmitBytes), name)
		var hs float64
		if !p.LastHandshakeTime.IsZero() {
			hs = float64(p.LastHandshakeTime.Unix())
		}
		ch <- prometheus.MustNewConstMetric(c.hsh, prometheus.GaugeValue, hs, name)
	}
}
