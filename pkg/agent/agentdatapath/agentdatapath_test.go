package agentdatapath

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/agent/epattach"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy/policycidr"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// provided is what the datapath cell provides to the others.
type provided struct {
	mod     *Module
	ipc     *ipcache.IPCache
	cidr    *policycidr.Table
	kernel  Kernel
	loader  *loader.Loader
	attach  AttachMode
	epCfg   epattach.Config
	steps   *lifecycle.Steps
	enabled bool
}

// newHive is the datapath cell with what it takes from the other cells
// (the agent's options, trace mode, LB sizes, metrics, the inspector) and
// the flags' values set over the defaults; p receives what it provides.
func newHive(t *testing.T, flags map[string]string, p *provided) *hive.Hive {
	t.Helper()
	return newHiveWith(t, option.DefaultAgent(), flags, p)
}

// newHiveWith is newHive with the agent's options agent.
func newHiveWith(t *testing.T, agent option.Agent, flags map[string]string, p *provided) *hive.Hive {
	t.Helper()
	h := hive.New(
		cell.Invoke(func(lifecycle.InvokedAll) {}),
		statedb.Cell,
		job.Cell,
		cell.Provide(
			func() option.Agent { return agent },
			func() loader.TraceMode { return loader.TraceOff },
			func() maps.LBSizes { return maps.LBSizes{} },
			func() *metrics.Server { return metrics.New(metrics.Config{}, hivetest.Logger(t)) },
			health.NewRegistry,
			lifecycle.NewSteps,
			dbinspect.New,
		),
		Cell,
		RestoredCell,
		cell.Invoke(func(m *Module, ipc *ipcache.IPCache, cidr *policycidr.Table, k Kernel, l *loader.Loader,
			a AttachMode, ec epattach.Config, s *lifecycle.Steps, c Config) {
			if p != nil {
				*p = provided{m, ipc, cidr, k, l, a, ec, s, c.Enable}
			}
		}),
	)
	for k, v := range flags {
		h.Viper().Set(k, v)
	}
	return h
}

// TestDatapathOff: with --enable-datapath=false the cell builds and
// starts without touching the kernel: the module, ipcache, policy CIDR
// table, kernel and loader are nil (as documented, for the cells that take
// them), there is no "bpf-maps" step, and the attach mode is the one
// asked for, unprobed and without a note; the check interval is the
// endpoints table's.
func TestDatapathOff(t *testing.T) {
	for _, mode := range []string{"tcx", "tc"} {
		var p provided
		h := newHive(t, map[string]string{"enable-datapath": "false", "datapath-attach-mode": mode,
			"datapath-attachment-check-interval": "7s"}, &p)
		log := hivetest.Logger(t)
		if err := h.Start(log, context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := h.Stop(log, context.Background()); err != nil {
			t.Fatal(err)
		}
		if p.enabled || p.mod != nil || p.ipc != nil || p.cidr != nil || p.kernel != nil || p.loader != nil {
			t.Fatalf("datapath off (%s): enabled %v module %v ipcache %v cidr %v kernel %v loader %v; want all nil",
				mode, p.enabled, p.mod, p.ipc, p.cidr, p.kernel, p.loader)
		}
		if slices.Contains(p.steps.Names(), "bpf-maps") {
			t.Fatalf("datapath off: steps %v include bpf-maps", p.steps.Names())
		}
		if p.attach.Mode != loader.AttachMode(mode) || p.attach.Note != "" {
			t.Fatalf("datapath off: attach mode %+v, want %s without a note", p.attach, mode)
		}
		if p.epCfg.CheckInterval.String() != "7s" {
			t.Fatalf("endpoints table's check interval %s, want 7s", p.epCfg.CheckInterval)
		}
	}
}

// TestResolveAttachMode: with the datapath on and tcx asked for the
// kernel is probed; the mode is tcx when the kernel has it, else tc with
// a note saying why. tc asked for is tc, no probe, no note.
func TestResolveAttachMode(t *testing.T) {
	log := hivetest.Logger(t)
	on := DefaultConfig()
	on.AttachMode = string(loader.AttachTC)
	if got := resolveAttachMode(on, log); got.Mode != loader.AttachTC || got.Note != "" {
		t.Fatalf("tc asked for: %+v, want tc without a note", got)
	}
	on.AttachMode = string(loader.AttachTCX)
	got := resolveAttachMode(on, log)
	_, noteWithout := loader.ResolveAttachMode(loader.AttachTCX, func() error { return ebpf.ErrNotSupported })
	switch got.Mode {
	case loader.AttachTCX:
		if got.Note != "" {
			t.Fatalf("tcx kept with a note %q", got.Note)
		}
	case loader.AttachTC:
		if got.Note == "" || got.Note != noteWithout {
			t.Fatalf("tc fallback with note %q, want %q", got.Note, noteWithout)
		}
	default:
		t.Fatalf("attach mode %+v", got)
	}
}

// TestInvalidConfigRefused: an unknown attach mode or a negative check
// interval fails Populate as a configuration error naming the option.
func TestInvalidConfigRefused(t *testing.T) {
	for _, tc := range []struct{ flag, value string }{
		{"datapath-attach-mode", "xdp"},
		{"datapath-attachment-check-interval", "-1s"},
	} {
		h := newHive(t, map[string]string{"enable-datapath": "false", tc.flag: tc.value}, nil)
		err := h.Populate(hivetest.Logger(t))
		if err == nil {
			t.Errorf("--%s=%s accepted", tc.flag, tc.value)
			continue
		}
		if !option.IsInvalid(err) || !strings.Contains(err.Error(), tc.flag+" ") {
			t.Errorf("--%s=%s: %v (invalid %v); want a configuration error naming the option", tc.flag, tc.value, err, option.IsInvalid(err))
		}
	}
}

// TestPrivilegedDatapathOn: with the datapath on, the cell's "bpf-maps"
// step loads it under its own bpffs root: the module, its ipcache, policy
// CIDR table, kernel and loader are provided (the ipcache the module's),
// the maps are pinned under the root, and a claim in the ipcache is
// written to the BPF map by its reconciler (realized without error).
func TestPrivilegedDatapathOn(t *testing.T) {
	testutil.Privileged(t)
	agent := option.DefaultAgent()
	agent.BPFRoot = filepath.Join("/sys/fs/bpf", "tendril-celltest-"+filepath.Base(t.TempDir()))
	var p provided
	h := newHiveWith(t, agent, map[string]string{"datapath-attach-mode": "tc"}, &p)
	log := hivetest.Logger(t)
	// Registered first, so it runs after the stop below: the pins go.
	t.Cleanup(func() {
		if p.loader != nil {
			_ = p.loader.Remove()
		}
		_ = os.RemoveAll(agent.BPFRoot)
	})
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Error(err)
		}
	})
	if p.mod == nil || p.ipc == nil || p.cidr == nil || p.kernel == nil || p.loader == nil {
		t.Fatalf("datapath on: module %v ipcache %v cidr %v kernel %v loader %v; want all set", p.mod, p.ipc, p.cidr, p.kernel, p.loader)
	}
	if p.mod.IPCache() != p.ipc || p.mod.Loader() != p.loader || p.mod.BPFRoot() != agent.BPFRoot {
		t.Fatal("the provided ipcache, loader or bpf root are not the module's")
	}
	if !slices.Contains(p.steps.Names(), "bpf-maps") {
		t.Fatalf("steps %v, want bpf-maps", p.steps.Names())
	}
	if p.attach.Mode != loader.AttachTC {
		t.Fatalf("attach mode %+v, want tc as asked", p.attach)
	}
	pins, err := os.ReadDir(agent.BPFRoot)
	if err != nil || len(pins) == 0 {
		t.Fatalf("pins under %s: %v (%v)", agent.BPFRoot, pins, err)
	}
	prefix := netip.MustParsePrefix("192.0.2.7/32")
	if err := p.ipc.Upsert(prefix, ipcache.Entry{Identity: identity.NumericIdentity(300), Source: ipcache.SourceLocal, Owner: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := p.ipc.WaitRealized(context.Background(), prefix); err != nil {
		t.Fatalf("ipcache claim not written to the BPF map: %v", err)
	}
}
