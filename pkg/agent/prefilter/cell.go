// Package prefilter is the agent's cell for the XDP prefilter
// (docs/prefilter.md): with --enable-xdp-prefilter, the XDP program
// (bpf/bpf_xdp.c) on the host devices (--devices, else the default
// routes' devices), the deny list (pkg/prefilter: a table reconciled into
// the pinned LPM maps, saved in the state directory), GET/PATCH/DELETE
// /v1/prefilter as the Cilium v1 API defines them, its drop counters as
// metrics and its `tendril status` section.
package prefilter

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	dpprefilter "github.com/tendril-net/tendril/pkg/datapath/prefilter"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/prefilter"
)

// Cell is the XDP prefilter: *Prefilter (nil when off or without the
// datapath), its API handlers (in every mode: they say when it is off),
// its status section and metrics.
var Cell = cell.Module("prefilter", "XDP prefilter dropping denied source CIDRs at the host devices",
	cell.Provide(lifecycle.Build[*Prefilter]),
	cell.Config(DefaultConfig()),
	cell.Provide(newCell, apiHandlers, statusContribution),
)

// Config is the prefilter's option.
type Config struct {
	// EnableXDPPrefilter attaches the XDP prefilter to the host devices.
	EnableXDPPrefilter bool `mapstructure:"enable-xdp-prefilter"`
}

// DefaultConfig is off, as Cilium's.
func DefaultConfig() Config { return Config{} }

// Flags registers the option.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-xdp-prefilter", c.EnableXDPPrefilter,
		"Drop packets from the CIDRs of the prefilter's deny list (PATCH /v1/prefilter) in XDP on the host devices (--devices, else the default routes' devices)")
}

// Prefilter is the running prefilter: its program and maps, its list and
// the devices it is attached to.
type Prefilter struct {
	dp      *dpprefilter.Datapath
	list    *prefilter.List
	log     *slog.Logger
	devices []string
}

type params struct {
	cell.In

	Config    Config
	Devices   hostdev.Config
	Agent     option.Agent
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Registry
	Health    *health.Registry
	DB        *statedb.DB
	Inspector *dbinspect.Inspector
	ModuleID  cell.FullModuleID
	Metrics   *metrics.Server `optional:"true"`
	// Loader is nil without the datapath: then there is no prefilter.
	Loader *loader.Loader
}

func newCell(p params) (*Prefilter, error) {
	if p.Loader == nil {
		return nil, nil
	}
	if !p.Config.EnableXDPPrefilter {
		// Links an earlier run with the prefilter left go: off means
		// nothing is dropped.
		p.Lifecycle.Append(cell.Hook{OnStart: func(cell.HookContext) error {
			if err := dpprefilter.DetachPinned(p.Agent.BPFRoot); err != nil {
				p.Log.Warn("Cannot detach the XDP prefilter an earlier run attached", "error", err)
			}
			return nil
		}})
		return nil, nil
	}
	dp, err := dpprefilter.Open(p.Agent.BPFRoot, p.Log)
	if err != nil {
		return nil, err
	}
	jobs := p.Jobs.NewGroup(p.Health.Scope("prefilter"), job.WithLogger(p.Log))
	list, err := prefilter.New(prefilter.Params{DB: p.DB, Jobs: jobs, Log: p.Log, ModuleID: p.ModuleID, Backend: dp,
		StateFile: filepath.Join(p.Agent.StateDir, "prefilter.json"), MaxPerFamily: dpprefilter.MaxEntries})
	if err != nil {
		dp.Close()
		return nil, err
	}
	pf := &Prefilter{dp: dp, list: list, log: p.Log}
	p.Inspector.AddReconciled(prefilter.TableName, func(txn statedb.ReadTxn) dbinspect.Realization {
		return dbinspect.CountStatus(list.Table().All(txn), func(e *prefilter.Entry) reconciler.Status { return e.Status })
	})
	if p.Metrics != nil {
		p.Metrics.Registry.MustRegister(newCollector(pf))
	}
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error { return pf.attach(p.Devices.Devices) },
		OnStop:  func(cell.HookContext) error { dp.Close(); return nil },
	})
	return pf, nil
}

// attach puts the program on the devices named (none: the default
// routes') and takes it off those an earlier run used that are not.
func (pf *Prefilter) attach(names []string) error {
	if len(names) == 0 {
		var err error
		if names, err = defaultRouteDevices(); err != nil {
			return err
		}
	}
	keep := map[int]bool{}
	for _, n := range names {
		l, err := netlink.LinkByName(n)
		if err != nil {
			return fmt.Errorf("prefilter device %s: %w", n, err)
		}
		if err := pf.dp.Attach(l.Attrs().Index); err != nil {
			return fmt.Errorf("prefilter device %s: %w", n, err)
		}
		keep[l.Attrs().Index] = true
	}
	if err := pf.dp.DetachOthers(keep); err != nil {
		pf.log.Warn("Cannot detach the XDP prefilter from former devices", "error", err)
	}
	pf.devices = names
	if len(names) == 0 {
		pf.log.Warn("XDP prefilter enabled but no device: no default route and --devices names none")
	} else {
		pf.log.Info("XDP prefilter attached", "devices", names)
	}
	return nil
}

func defaultRouteDevices() ([]string, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	var names []string
	for _, r := range routes {
		if r.LinkIndex <= 0 || r.Dst != nil && (!r.Dst.IP.IsUnspecified() || slices.ContainsFunc(r.Dst.Mask, func(b byte) bool { return b != 0 })) {
			continue
		}
		if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil && !slices.Contains(names, l.Attrs().Name) {
			names = append(names, l.Attrs().Name)
		}
	}
	return names, nil
}

// List is the deny list.
func (pf *Prefilter) List() *prefilter.List { return pf.list }

// Counters are the drops counted so far.
func (pf *Prefilter) Counters() (dpprefilter.Counters, error) { return pf.dp.Counters() }

// Devices are the devices the program is attached to.
func (pf *Prefilter) Devices() []string { return pf.devices }
