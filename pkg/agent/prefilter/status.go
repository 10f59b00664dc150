package prefilter

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/status"
)

// statusOrder places this section in `tendril status` (pkg/status):
// after Masquerade (40), before Services (50).
const statusOrder = 44

func statusContribution(pf *Prefilter) status.Out {
	if pf == nil {
		return status.Out{}
	}
	return status.Provide(status.Contribution{Order: statusOrder, Section: status.Always(pf.statusSection)})
}

// statusSection is the list's size and revision, what is not yet in the
// maps, the devices and the drops.
func (pf *Prefilter) statusSection() ext.Section {
	desired, realized := pf.list.Get()
	sec := ext.Section{Title: "Prefilter"}
	state := fmt.Sprintf("%d CIDRs denied at revision %d (realized %d) on %s", len(desired.Deny), desired.Revision, realized.Revision, strings.Join(pf.devices, ", "))
	sec.Lines = append(sec.Lines, ext.Line{Key: "XDP", Value: state})
	if n, lastErr := pf.list.Pending(); n > 0 {
		sec.Lines = append(sec.Lines, ext.Line{Key: "Pending", Value: fmt.Sprintf("%d CIDRs not yet in the maps: %s", n, lastErr)})
	}
	if c, err := pf.dp.Counters(); err != nil {
		sec.Lines = append(sec.Lines, ext.Line{Key: "Dropped", Value: "unreadable: " + err.Error()})
	} else {
		sec.Lines = append(sec.Lines, ext.Line{Key: "Dropped", Value: fmt.Sprintf("%d IPv4 packets (%d bytes), %d IPv6 packets (%d bytes)", c.IPv4Packets, c.IPv4Bytes, c.IPv6Packets, c.IPv6Bytes)})
	}
	return sec
}

// collector exports the drop counters.
type collector struct {
	pf      *Prefilter
	packets *prometheus.Desc
	bytes   *prometheus.Desc
}

func newCollector(pf *Prefilter) *collector {
	return &collector{pf: pf,
		packets: prometheus.NewDesc("tendril_prefilter_dropped_packets_total", "Packets the XDP prefilter dropped, by family.", []string{"family"}, nil),
		bytes:   prometheus.NewDesc("tendril_prefilter_dropped_bytes_total", "Bytes of the packets the XDP prefilter dropped, by family.", []string{"family"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.packets; ch <- c.bytes }

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	n, err := c.pf.dp.Counters()
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(n.IPv4Packets), "ipv4")
	ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(n.IPv6Packets), "ipv6")
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(n.IPv4Bytes), "ipv4")
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(n.IPv6Bytes), "ipv6")
}
