// Package tunnel is the agent's cell for the routing mode
// (docs/routing.md): --routing-mode native leaves pod traffic between
// nodes to the host's routes (the nodes cell routes each peer's pod CIDR
// via the peer); --routing-mode tunnel keeps one tunnel device in external
// mode (tendril_vxlan, or tendril_geneve with --tunnel-protocol geneve),
// its overlay programs attached, and the pod programs pointed at it, so
// that from_pod encapsulates a packet for another node's pod to that node
// with the source's identity in the VNI. In tunnel mode it also gives the
// pods' MTU the room of the encapsulation (agentendpoints.MTUOverhead) and
// sends the peers' pod CIDR routes to the device (nodes.RouteDevice), so
// the underlay routes no pod CIDR. The device is reconciled: created at
// start, created again (and the programs attached to it again) when it
// goes. On a kernel without the Geneve module, --tunnel-protocol geneve
// runs Geneve in eBPF (bpf/lib/geneve.h): tendril_geneve is then only a
// carrier (ifb) whose egress program encapsulates the host's own packets
// to remote pods, and the pod and host device programs push and strip
// the headers themselves.
package tunnel

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/agent/nodes"
	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	dptunnel "github.com/tendril-net/tendril/pkg/datapath/tunnel"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/option"
)

// Cell is the routing mode: its config, the tunnel device's reconciler
// (*Tunnel, nil without the datapath), and what the mode tells the
// endpoints (the MTU overhead) and the nodes cell (the device the pod
// CIDR routes go to).
var Cell = cell.Module("tunnel", "Routing mode native or tunnel with a VXLAN or Geneve overlay between nodes",
	// What the root Invoke runs, then the config, then the providers
	// (pkg/agent/cells.go).
	cell.Provide(lifecycle.Check(Config.validate)),
	cell.Provide(lifecycle.Build[*Tunnel]),
	cell.Config(DefaultConfig()),
	cell.Provide(newCell, underlay, mtuOverhead, routeDevice, statusContribution),
)

func mtuOverhead(c Config, u Underlay6) agentendpoints.MTUOverhead {
	return agentendpoints.MTUOverhead(c.Overhead(bool(u)))
}

func routeDevice(c Config) nodes.RouteDevice { return nodes.RouteDevice(c.Device()) }

// Encrypted is true when WireGuard wraps the tunnel's datagrams (the
// wireguard cell provides it): they are routed to the WireGuard device by
// a rule on the tunnel port for locally sent datagrams, which the kernel's
// tunnel devices send. Geneve in eBPF redirects its datagrams out of the
// underlay by its own FIB lookup, past that rule: they would leave in the
// clear, so the cell refuses to run it encrypted.
type Encrypted bool

// Kernel is what the reconciler does to the kernel (netKernel; a fake in
// the cell's tests).
type Kernel interface {
	// EnsureDevice creates (or keeps) the tunnel device and returns its
	// ifindex.
	EnsureDevice(p dptunnel.Protocol, port uint16) (int, error)
	// GeneveModule reports whether the kernel can create a Geneve device.
	GeneveModule() (bool, error)
	// EnsureCarrier creates (or keeps) Geneve in eBPF's carrier device
	// (tendril_geneve, no tunnel of its own) and returns its ifindex.
	EnsureCarrier() (int, error)
	// RemoveDevices deletes Tendril's tunnel devices but keep ("": all).
	RemoveDevices(keep string) error
	// Attach attaches the overlay programs to the device ifindex.
	Attach(ifindex int) error
	// Detach takes them off.
	Detach() error
	// SetDevice points from_pod at the device (0: native routing) and
	// turns Geneve in eBPF off.
	SetDevice(ifindex int) error
	// SetGeneveBPF turns Geneve in eBPF on: from_geneve in the host
	// programs' tail-call slot, then the flag (after Attach: the
	// programs are loaded).
	SetGeneveBPF() error
	// ClearGeneveCall empties that slot.
	ClearGeneveCall() error
}

// Tunnel reconciles the kernel with the routing mode.
type Tunnel struct {
	cfg    Config
	kernel Kernel
	log    *slog.Logger

	mu sync.Mutex
	// ifindex is the device the programs are attached to and from_pod
	// points at (0: none yet); with Geneve in eBPF, the carrier.
	ifindex int
	// geneveBPF: --tunnel-protocol geneve runs Geneve in eBPF (the
	// kernel has no Geneve module); nil until the first tunnel round
	// with Geneve has probed the kernel.
	geneveBPF *bool
	// encrypted: WireGuard wraps the tunnel (Encrypted).
	encrypted bool
}

// New builds the reconciler of cfg over kernel.
func New(cfg Config, kernel Kernel, log *slog.Logger) *Tunnel {
	return &Tunnel{cfg: cfg, kernel: kernel, log: log}
}

// Reconcile makes the kernel match the mode. Tunnel: the device exists
// (created again if it went: a new ifindex), the programs are attached to
// it and from_pod points at it, in that order (from_pod never redirects to
// a device without its programs), and the other protocol's device is
// gone. Geneve on a kernel without the Geneve module: the device is the
// carrier of Geneve in eBPF, and instead of pointing from_pod at it the
// tail-call slot and the flag are written (from_pod and to_overlay push
// the headers, from_netdev strips them). Native: from_pod points nowhere
// and Geneve in eBPF is off first, then the programs and the devices go.
func (t *Tunnel) Reconcile() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.cfg.Tunneling() {
		if err := t.kernel.SetDevice(0); err != nil {
			return err
		}
		if err := t.kernel.ClearGeneveCall(); err != nil {
			return err
		}
		if err := t.kernel.Detach(); err != nil {
			return err
		}
		t.ifindex = 0
		return t.kernel.RemoveDevices("")
	}
	bpfGeneve, err := t.useGeneveBPF()
	if err != nil {
		return err
	}
	var idx int
	if bpfGeneve {
		idx, err = t.kernel.EnsureCarrier()
	} else {
		idx, err = t.kernel.EnsureDevice(t.cfg.Protocol(), t.cfg.Port())
	}
	if err != nil {
		return err
	}
	if idx != t.ifindex {
		if err := t.kernel.Attach(idx); err != nil {
			return err
		}
		if bpfGeneve {
			if err := t.kernel.SetGeneveBPF(); err != nil {
				return err
			}
		} else {
			if err := t.kernel.SetDevice(idx); err != nil {
				return err
			}
			// After the flag is off (SetDevice): from_netdev no longer
			// decapsulates, so nothing meets the empty slot.
			if err := t.kernel.ClearGeneveCall(); err != nil {
				return err
			}
		}
		if t.ifindex != 0 {
			t.log.Info("Tunnel device created again", "device", t.cfg.Device(), "ifindex", idx, "was", t.ifindex, "geneveBPF", bpfGeneve)
		} else {
			t.log.Info("Tunnel device ready", "device", t.cfg.Device(), "ifindex", idx, "port", t.cfg.Port(), "geneveBPF", bpfGeneve)
		}
		t.ifindex = idx
	}
	return t.kernel.RemoveDevices(t.cfg.Device())
}

// useGeneveBPF decides, once, whether this node's Geneve is built in
// eBPF: with --tunnel-protocol geneve on a kernel that cannot create a
// Geneve device. Where the module exists the kernel's device is kept
// (Cilium's design: it also carries an IPv6 underlay, which the eBPF
// Geneve leaves to the host). Called under t.mu.
func (t *Tunnel) useGeneveBPF() (bool, error) {
	if t.cfg.Protocol() != dptunnel.Geneve {
		return false, nil
	}
	if t.geneveBPF == nil {
		has, err := t.kernel.GeneveModule()
		if err != nil {
			return false, err
		}
		use := !has
		t.geneveBPF = &use
		if use {
			t.log.Info("The kernel has no Geneve module: Geneve is built and stripped in eBPF", "carrier", t.cfg.Device())
		}
	}
	if *t.geneveBPF && t.encrypted {
		return true, fmt.Errorf("tunnel-protocol geneve: Geneve in eBPF (the kernel has no Geneve module) does not go through WireGuard; with enable-wireguard use vxlan")
	}
	if *t.geneveBPF && t.cfg.Port() != dptunnel.DefaultGenevePort {
		// The programs match and send UDP 6081 only (GENEVE_PORT): a
		// node on another port would neither reach nor hear its peers.
		return true, fmt.Errorf("tunnel-port %d: Geneve in eBPF (the kernel has no Geneve module) uses UDP %d only",
			t.cfg.Port(), dptunnel.DefaultGenevePort)
	}
	return *t.geneveBPF, nil
}

// GeneveBPF reports whether the node runs Geneve in eBPF (false until
// the first round has decided).
func (t *Tunnel) GeneveBPF() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.geneveBPF != nil && *t.geneveBPF
}

// Device is the tunnel device's ifindex (0: native routing, or not yet
// created).
func (t *Tunnel) Device() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ifindex
}

type params struct {
	cell.In

	Config    Config
	Agent     option.Agent
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Jobs      job.Registry
	Health    *health.Registry
	// Devices has --bpf-lb-mode: the overlay records DSR requests
	// (from_overlay) in DSR mode.
	Devices hostdev.Config
	// Loader is nil without the datapath: then there is no tunnel.
	Loader *loader.Loader
	// Encrypted: WireGuard wraps the tunnel (absent without the
	// wireguard cell).
	Encrypted Encrypted `optional:"true"`
	// Underlay6: the node's underlay is IPv6 (the carrier's MTU).
	Underlay6 Underlay6
}

// recheck is how often the device is checked (created again when gone).
const recheck = 10 * time.Second

func newCell(p params) (*Tunnel, error) {
	if p.Loader == nil {
		return nil, nil
	}
	dsr, err := p.Devices.DSR()
	if err != nil {
		return nil, err
	}
	k := &netKernel{loader: p.Loader, linksDir: filepath.Join(p.Agent.BPFRoot, "links"), dsr: dsr, underlay6: bool(p.Underlay6)}
	t := New(p.Config, k, p.Log)
	t.encrypted = bool(p.Encrypted)
	// After the datapath's maps are open (the loader's hook is appended
	// first: this constructor takes the loader): the first pod packet
	// that could go through the overlay finds the device ready.
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			if err := t.Reconcile(); err != nil {
				return fmt.Errorf("routing mode %s: %w", p.Config.RoutingMode, err)
			}
			return nil
		},
		OnStop: func(cell.HookContext) error {
			// The device, links and map entry stay: the overlay forwards
			// while the agent is down.
			t.mu.Lock()
			defer t.mu.Unlock()
			k.close()
			return nil
		},
	})
	if p.Config.Tunneling() {
		jobs := p.Jobs.NewGroup(p.Health.Scope("tunnel"), job.WithLogger(p.Log))
		jobs.Add(job.Timer("tunnel-device", func(context.Context) error { return t.Reconcile() }, recheck))
	}
	return t, nil
}

// netKernel is the Kernel of the node (pkg/datapath/tunnel), in the
// agent's network namespace. Its methods run under Tunnel's lock.
type netKernel struct {
	loader   *loader.Loader
	linksDir string
	dsr      bool // --bpf-lb-mode=dsr
	// underlay6: the node's underlay is IPv6 (Underlay6).
	underlay6 bool
	nl        *netlink.Handle
	progs     *dptunnel.Programs
}

// handle opens the netlink handle at the first use (at start, not while
// the hive is built).
func (k *netKernel) handle() (*netlink.Handle, error) {
	if k.nl == nil {
		nl, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("netlink handle: %w", err)
		}
		k.nl = nl
	}
	return k.nl, nil
}

func (k *netKernel) EnsureDevice(p dptunnel.Protocol, port uint16) (int, error) {
	nl, err := k.handle()
	if err != nil {
		return 0, err
	}
	l, err := dptunnel.EnsureDevice(nl, p, port)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}

func (k *netKernel) GeneveModule() (bool, error) {
	nl, err := k.handle()
	if err != nil {
		return false, err
	}
	return dptunnel.GeneveModule(nl)
}

func (k *netKernel) EnsureCarrier() (int, error) {
	nl, err := k.handle()
	if err != nil {
		return 0, err
	}
	l, err := dptunnel.EnsureCarrier(nl, k.underlay6)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}

func (k *netKernel) RemoveDevices(keep string) error {
	nl, err := k.handle()
	if err != nil {
		return err
	}
	return dptunnel.RemoveDevices(nl, keep)
}

func (k *netKernel) Attach(ifindex int) error {
	if k.progs == nil {
		progs, err := dptunnel.Load(k.loader.MapReplacements(), "", k.dsr)
		if err != nil {
			return err
		}
		k.progs = progs
	}
	return k.progs.Attach(ifindex, k.linksDir)
}

func (k *netKernel) Detach() error { return dptunnel.Detach(k.linksDir) }

func (k *netKernel) SetDevice(ifindex int) error {
	return dptunnel.SetDevice(k.loader.MapReplacements()[bpf.OverlayMapTdrTunnelV1], ifindex)
}

func (k *netKernel) SetGeneveBPF() error {
	m := k.loader.MapReplacements()
	return dptunnel.SetGeneveBPF(m[bpf.OverlayMapTdrTunnelV1], m[bpf.OverlayMapTdrOverlayCallsV1], k.progs)
}

func (k *netKernel) ClearGeneveCall() error {
	return dptunnel.ClearGeneveCall(k.loader.MapReplacements()[bpf.OverlayMapTdrOverlayCallsV1])
}

func (k *netKernel) close() {
	if k.progs != nil {
		_ = k.progs.Close()
		k.progs = nil
	}
	if k.nl != nil {
		k.nl.Close()
		k.nl = nil
	}
}
