package hostdev

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the masquerade's state at each scrape: the NAT
// table's mappings and the GC's deletions. Drops for an exhausted range
// are the datapath's per-reason counter
// (tendril_datapath_packets_total{reason="Masquerade port range exhausted"}).
type collector struct {
	m        *Masquerade
	mappings *prometheus.Desc
	capacity *prometheus.Desc
	gcDel    *prometheus.Desc
	devices  *prometheus.Desc
	reatt    *prometheus.Desc
}

func newCollector(m *Masquerade) *collector {
	return &collector{
		m:        m,
		mappings: prometheus.NewDesc("tendril_masquerade_nat_entries", "Entries of the masquerade NAT table (two per masqueraded flow).", nil, nil),
		capacity: prometheus.NewDesc("tendril_masquerade_nat_capacity", "Capacity of the masquerade NAT table, in entries.", nil, nil),
		gcDel:    prometheus.NewDesc("tendril_masquerade_nat_gc_deleted_total", "Masquerade mappings deleted by the GC with conntrack.", nil, nil),
		devices:  prometheus.NewDesc("tendril_masquerade_devices", "Devices the host programs masquerade at.", nil, nil),
		reatt: prometheus.NewDesc("tendril_host_programs_reattached_total",
			"Times the periodic check found a device's host programs removed by something else and attached them again.", nil, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.mappings
	ch <- c.capacity
	ch <- c.gcDel
	ch <- c.devices
	ch <- c.reatt
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	dm := c.m.dp.Maps()
	if dm == nil || dm.NAT == nil {
		return
	}
	nat := dm.NAT.NATMap()
	if n, err := nat.Count(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.mappings, prometheus.GaugeValue, float64(n))
	}
	ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(nat.Capacity()))
	c.m.mu.Lock()
	deleted, devs, reatt := c.m.gc.Deleted, len(c.m.devices), c.m.reattached
	c.m.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.reatt, prometheus.CounterValue, float64(reatt))
	ch <- prometheus.MustNewConstMetric(c.gcDel, prometheus.CounterValue, float64(deleted))
	ch <- prometheus.MustNewConstMetric(c.devices, prometheus.GaugeValue, float64(devs))
}
