package agentflows

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/statedb"
	"github.com/go-openapi/strfmt"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/hubble/exporter"
	"github.com/tendril-net/tendril/pkg/hubble/flowmetrics"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/backendaddrs"
	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/policy"
)

// MetricsConfig is the flow metrics' and the export's part of the
// flows' configuration (--hubble-metrics, --hubble-export-*), the options
// Cilium names the same way.
type MetricsConfig struct {
	// Metrics are the flow metric groups served on the agent's metrics
	// endpoint (flowmetrics.All's names); empty: none.
	Metrics []string `mapstructure:"hubble-metrics"`
	// MetricsMaxLabelValues bounds each unbounded label's distinct values.
	MetricsMaxLabelValues int `mapstructure:"hubble-metrics-max-label-values"`
	// ExportFilePath is the JSON lines file flows are exported to; empty:
	// no export.
	ExportFilePath string `mapstructure:"hubble-export-file-path"`
	// ExportFileMaxSizeMB rotates the file past this size.
	ExportFileMaxSizeMB int `mapstructure:"hubble-export-file-max-size-mb"`
	// ExportFileMaxBackups is how many rotated files are kept.
	ExportFileMaxBackups int `mapstructure:"hubble-export-file-max-backups"`
	// ExportAllowlist and ExportDenylist are Hubble flow filters as JSON
	// (objects one after the other, or an array).
	ExportAllowlist string `mapstructure:"hubble-export-allowlist"`
	ExportDenylist  string `mapstructure:"hubble-export-denylist"`
}

// DefaultMetricsConfig: every flow metric, no export.
func DefaultMetricsConfig() MetricsConfig {
	return MetricsConfig{
		Metrics:               append([]string(nil), flowmetrics.All...),
		MetricsMaxLabelValues: flowmetrics.DefaultMaxLabelValues,
		ExportFileMaxSizeMB:   exporter.DefaultMaxSizeMB,
		ExportFileMaxBackups:  exporter.DefaultMaxBackups,
	}
}

// Flags registers the flow metrics' and export's flags.
func (c MetricsConfig) Flags(fs *pflag.FlagSet) {
	fs.StringSlice("hubble-metrics", c.Metrics, "Flow metrics served on the metrics endpoint: "+strings.Join(flowmetrics.All, ", ")+" (empty: none)")
	fs.Int("hubble-metrics-max-label-values", c.MetricsMaxLabelValues, `Distinct values kept per flow metric label (service, destination workload, policy); the others count as "other"`)
	fs.String("hubble-export-file-path", c.ExportFilePath, "Export flows as JSON lines to this file (empty: no export)")
	fs.Int("hubble-export-file-max-size-mb", c.ExportFileMaxSizeMB, "Rotate the export file past this size (MiB)")
	fs.Int("hubble-export-file-max-backups", c.ExportFileMaxBackups, "Rotated export files kept (FILE.1 newest)")
	fs.String("hubble-export-allowlist", c.ExportAllowlist, `Export only flows matching one of these Hubble flow filters (JSON, e.g. {"verdict":["DROPPED"]})`)
	fs.String("hubble-export-denylist", c.ExportDenylist, "Never export flows matching one of these Hubble flow filters (JSON)")
}

// Validate checks the metric names and the export options, filters
// included.
func (c MetricsConfig) Validate() error {
	if err := c.metricsConfig().Validate(); err != nil {
		return err
	}
	if c.MetricsMaxLabelValues < 1 {
		return fmt.Errorf("hubble-metrics-max-label-values %d: must be positive", c.MetricsMaxLabelValues)
	}
	if c.ExportFilePath == "" {
		return nil
	}
	if !filepath.IsAbs(c.ExportFilePath) {
		return fmt.Errorf("hubble-export-file-path %q: must be an absolute path", c.ExportFilePath)
	}
	if c.ExportFileMaxSizeMB < 1 {
		return fmt.Errorf("hubble-export-file-max-size-mb %d: must be positive", c.ExportFileMaxSizeMB)
	}
	if c.ExportFileMaxBackups < 0 {
		return fmt.Errorf("hubble-export-file-max-backups %d: must not be negative", c.ExportFileMaxBackups)
	}
	allow, deny, err := c.exportFilters()
	if err != nil {
		return err
	}
	if _, err := observer.CompileFilters(allow, deny); err != nil {
		return fmt.Errorf("hubble export filters: %w", err)
	}
	return nil
}

func (c *MetricsConfig) metricsConfig() flowmetrics.Config {
	return flowmetrics.Config{Metrics: c.Metrics, MaxLabelValues: c.MetricsMaxLabelValues}
}

func (c *MetricsConfig) exportFilters() (allow, deny []*flowpb.FlowFilter, err error) {
	if allow, err = exporter.ParseFilters(c.ExportAllowlist); err != nil {
		return nil, nil, fmt.Errorf("hubble-export-allowlist: %w", err)
	}
	if deny, err = exporter.ParseFilters(c.ExportDenylist); err != nil {
		return nil, nil, fmt.Errorf("hubble-export-denylist: %w", err)
	}
	return allow, deny, nil
}

func (c *MetricsConfig) exporterConfig() (exporter.Config, error) {
	allow, deny, err := c.exportFilters()
	if err != nil {
		return exporter.Config{}, err
	}
	return exporter.Config{Path: c.ExportFilePath, MaxSizeBytes: int64(c.ExportFileMaxSizeMB) << 20,
		MaxBackups: c.ExportFileMaxBackups, Allow: allow, Deny: deny}, nil
}

// flowExport is the export of a flows module: the file is opened at the
// hubble step and closed at its stop; flows decoded before or after are
// not exported.
type flowExport struct {
	cfg exporter.Config
	cur atomic.Pointer[exporter.Exporter]

	cancel context.CancelFunc
	done   sync.WaitGroup
}

// consume exports one flow when the file is open.
func (x *flowExport) consume(f *flowpb.Flow) {
	if e := x.cur.Load(); e != nil {
		e.Export(f)
	}
}

// start opens the file and starts its periodic flush.
func (x *flowExport) start(m *Module) error {
	e, err := exporter.New(x.cfg, m.log)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel = cancel
	x.done.Add(1)
	go func() {
		defer x.done.Done()
		e.Run(ctx)
	}()
	x.cur.Store(e)
	return nil
}

// stop closes the file after its last flush.
func (x *flowExport) stop() error {
	e := x.cur.Swap(nil)
	if e == nil {
		return nil
	}
	x.cancel()
	x.done.Wait()
	return e.Close()
}

// StatusSection is the Hubble part of `tendril status`: flows seen, the
// ring's use, lost events, listeners, metrics and export.
func (m *Module) StatusSection() ext.Section {
	r := m.observer.Ring()
	sec := ext.Section{Title: "Hubble"}
	add := func(k, v string) { sec.Lines = append(sec.Lines, ext.Line{Key: k, Value: v}) }
	add("flows seen", fmt.Sprintf("%d (%d decode errors)", r.Seen(), m.observer.DecodeErrors()))
	add("ring", fmt.Sprintf("%d/%d flows", r.Len(), r.Cap()))
	if m.lost != nil {
		if lost, err := m.lost(); err != nil {
			add("lost events", "unknown: "+err.Error())
		} else {
			add("lost events", fmt.Sprintf("%d ring full, %d rate-limited", lost.RingFull, lost.RateLimited))
		}
	}
	listeners := []string{"unix://" + m.socket}
	if m.tcpAddress != "" {
		listeners = append(listeners, m.tcpAddress)
	}
	add("listeners", fmt.Sprintf("%s; %d following", strings.Join(listeners, ", "), m.observer.Followers()))
	if len(m.metricNames) == 0 {
		add("metrics", "none (--hubble-metrics)")
	} else {
		add("metrics", strings.Join(m.metricNames, ", "))
	}
	if m.export == nil {
		add("export", "off (--hubble-export-file-path)")
	} else if e := m.export.cur.Load(); e != nil {
		s := e.Stats()
		v := fmt.Sprintf("%s: %d flows, %d rotations", e.Path(), s.Written, s.Rotated)
		if s.Failed > 0 {
			v += fmt.Sprintf(", %d failed (%s)", s.Failed, s.LastError)
		}
		add("export", v)
	}
	return sec
}

// HubbleModel is the status's Cilium model of the observer.
func (m *Module) HubbleModel() *models.HubbleStatus {
	r := m.observer.Ring()
	return &models.HubbleStatus{
		State: models.HubbleStatusStateOk,
		Msg:   "Serving on unix://" + m.socket,
		Observer: &models.HubbleStatusObserver{
			CurrentFlows: int64(r.Len()), MaxFlows: int64(r.Cap()), SeenFlows: int64(r.Seen()),
			Uptime: strfmt.Duration(m.observer.Uptime()),
		},
	}
}

// serviceKnowledge names services from the load balancer's tables: a
// frontend by its address, else the service of a backend at that address
// (a backend shared by several services names the first by name). The
// frontend is an index lookup in the current snapshot and the backend one
// in the backend address index that follows the backends table, so a
// changed service costs the flows nothing: a copy of every frontend and
// backend rebuilt on each change was O(all backends) per change (a
// million entries at 100,000 services of 10 backends).
type serviceKnowledge struct {
	db        *statedb.DB
	frontends statedb.Table[*loadbalancer.Frontend]
	backends  *backendaddrs.Index
}

func (k *serviceKnowledge) ServiceByAddr(a netip.AddrPort, proto uint8) (observer.Service, bool) {
	if k == nil || k.db == nil {
		return observer.Service{}, false
	}
	key := loadbalancer.FrontendKey{Addr: a, Proto: proto}
	if f, _, ok := k.frontends.Get(k.db.ReadTxn(), loadbalancer.FrontendByKey.Query(key)); ok {
		return observer.Service{Namespace: f.Service.Namespace, Name: f.Service.Name}, true
	}
	if s, ok := k.backends.ServiceOf(a, proto); ok {
		return observer.Service{Namespace: s.Namespace, Name: s.Name}, true
	}
	return observer.Service{}, false
}

// defaultDenying tells, per rule, in which directions it puts the
// endpoints it selects into default deny (it has rules there and does not
// opt out with enableDefaultDeny), cached per repository revision.
type defaultDenying struct {
	repo *policy.Repository

	mu    sync.Mutex
	rev   uint64
	built bool
	// dirs by rule ID: bit 0 ingress, bit 1 egress.
	dirs map[uint32]uint8
}

func (d *defaultDenying) directions(id uint32) uint8 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if rev := d.repo.Revision(); !d.built || rev != d.rev {
		rules, rev := d.repo.Rules(nil)
		d.dirs = make(map[uint32]uint8, len(rules))
		for _, r := range rules {
			if r.Rule == nil {
				continue
			}
			dd := r.Rule.EnableDefaultDeny
			var bits uint8
			if len(r.Rule.Ingress)+len(r.Rule.IngressDeny) > 0 && (dd == nil || dd.Ingress == nil || *dd.Ingress) {
				bits |= 1
			}
			if len(r.Rule.Egress)+len(r.Rule.EgressDeny) > 0 && (dd == nil || dd.Egress == nil || *dd.Egress) {
				bits |= 2
			}
			d.dirs[r.ID] = bits
		}
		d.rev, d.built = rev, true
	}
	return d.dirs[id]
}

// DefaultDenyPolicies names the policies whose rules put the endpoint
// into default deny in the direction: those selecting it there.
func (k *nodeKnowledge) DefaultDenyPolicies(epID uint16, ingress bool) []observer.Policy {
	if k.selecting == nil || k.defaultDeny == nil {
		return nil
	}
	ids, ok := k.selecting(epID)
	if !ok {
		return nil
	}
	bit := uint8(2)
	if ingress {
		bit = 1
	}
	var out []observer.Policy
	seen := map[string]bool{}
	for _, id := range ids {
		if k.defaultDeny.directions(id)&bit == 0 {
			continue
		}
		p, ok := k.PolicyByCookie(id)
		if !ok {
			continue
		}
		// A policy object of several rules is named once.
		key := p.Namespace + "/" + p.Name
		if seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, p)
	}
	return out
}
