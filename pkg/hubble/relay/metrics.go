package relay

import (
	"context"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tendril-net/tendril/pkg/hubble/relay/pool"
	"github.com/tendril-net/tendril/pkg/metrics"
)

// MetricsCell serves the relay's metrics (its nodes' states, and the Go
// and process collectors) on --prometheus-serve-addr; off by default,
// since the relay often shares a network namespace with an agent that
// serves the default metrics port.
var MetricsCell = cell.Module("hubble-relay-metrics", "Prometheus metrics of the relay",
	cell.Config(metrics.Config{}),
	cell.Invoke(startMetrics),
)

func startMetrics(cfg metrics.Config, p *pool.Pool, lc cell.Lifecycle, log *slog.Logger) error {
	srv := metrics.New(cfg, log)
	if err := srv.Registry.Register(nodesCollector{nodes: p}); err != nil {
		return err
	}
	lc.Append(cell.Hook{
		OnStart: func(cell.HookContext) error { return srv.Start(context.Background()) },
		OnStop:  func(ctx cell.HookContext) error { return srv.Stop(ctx) },
	})
	return nil
}

var (
	nodesConnectedDesc   = prometheus.NewDesc("tendril_relay_nodes_connected", "Nodes whose Hubble API the relay is connected to.", nil, nil)
	nodesUnavailableDesc = prometheus.NewDesc("tendril_relay_nodes_unavailable", "Nodes the relay knows of but cannot reach.", nil, nil)
)

// nodesCollector reads the pool's nodes at each scrape.
type nodesCollector struct{ nodes Nodes }

func (nodesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodesConnectedDesc
	ch <- nodesUnavailableDesc
}

func (c nodesCollector) Collect(ch chan<- prometheus.Metric) {
	nodes, _ := c.nodes.Nodes()
	up, down := connected(nodes)
	ch <- prometheus.MustNewConstMetric(nodesConnectedDesc, prometheus.GaugeValue, float64(len(up)))
	ch <- prometheus.MustNewConstMetric(nodesUnavailableDesc, prometheus.GaugeValue, float64(len(down)))
}
