// Package agentendpoints is the agent's endpoints cell: the endpoints
// restored from the state directory, IPAM over this node's pod CIDRs, the
// endpoint manager with its regenerator (host networking, then the hooks
// other cells add), the node's host networking, and the CNI server with
// its API (POST /v1/cni/{command}). Its start step is
// "endpoint-restore-ipam" (the seeds' step 5).
package agentendpoints

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/cni/cniserver"
	"github.com/tendril-net/tendril/pkg/cni/delqueue"
	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/ipam"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/node"
	"github.com/tendril-net/tendril/pkg/option"
)

// Cell is start step 5: the endpoints restored from the state directory,
// the pod CIDRs picked, IPAM started with every restored endpoint's
// addresses re-reserved, the host device set up, and the CNI server ready.
var Cell = cell.Module("endpoints", "Endpoint restore IPAM host networking and the CNI server",
	cell.Provide(lifecycle.Check(Config.validate)),
	cell.Provide(lifecycle.Build[*Module]),
	cell.Config(DefaultConfig()),
	cell.Provide(New, statusContribution, apiHandlers, policyModelOf),
)

// Config are the endpoints' and IPAM's options.
type Config struct {
	// MTU is the pods' device MTU announced to CNI plugins.
	MTU int
	// IPv4Range and IPv6Range are the pod CIDRs: a prefix, "auto" (derived
	// from the node name) or "none".
	IPv4Range string
	IPv6Range string
	// IPAM is "kubernetes" (pod CIDRs by the precedence above) or
	// "cluster-pool" (from this node's TendrilNode, written by
	// tendril-operator).
	IPAM string
	// InstallHostNetworking creates the host device and per-pod routes in the
	// agent's network namespace. Only tests that run the agent in the
	// machine's own namespace turn it off.
	InstallHostNetworking bool
	// IPAMExpiration is how long an address allocated with expiration may
	// stay unclaimed by an endpoint.
	IPAMExpiration time.Duration
	// CNIGCGracePeriod is how young a pod's endpoint CNI GC keeps although
	// the runtime's valid attachments do not name it (an ADD the runtime
	// had not recorded when it listed them).
	CNIGCGracePeriod time.Duration
}

// DefaultConfig are the endpoints' defaults.
func DefaultConfig() Config {
	return Config{MTU: 1500, IPv4Range: "auto", IPv6Range: "auto", IPAM: "kubernetes", InstallHostNetworking: true,
		IPAMExpiration: 10 * time.Minute, CNIGCGracePeriod: cniserver.DefaultGCGracePeriod}
}

// Flags registers the endpoints' options, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Int("mtu", c.MTU, "MTU of pod devices")
	fs.String("ipv4-range", c.IPv4Range, "IPv4 pod CIDR of this node: a prefix, auto or none (Kubernetes: Node.spec.podCIDRs wins)")
	fs.String("ipv6-range", c.IPv6Range, "IPv6 pod CIDR of this node: a prefix, auto or none (Kubernetes: Node.spec.podCIDRs wins)")
	fs.Bool("install-host-networking", c.InstallHostNetworking, "Create the host device and per-pod routes in the agent's network namespace")
	fs.String("ipam", c.IPAM, "Where the node's pod CIDRs come from: kubernetes (Node, annotations, --ipv4-range) or cluster-pool (the TendrilNode tendril-operator fills)")
	fs.Duration("ipam-expiration", c.IPAMExpiration, "How long an address allocated with expiration may stay unclaimed")
	fs.Duration("cni-gc-grace-period", c.CNIGCGracePeriod, "How young a pod's endpoint CNI GC keeps although the runtime's valid attachments do not name it (an ADD not yet recorded)")
}

// validate is Validate, marked as a configuration error.
func (c Config) validate() error { return option.Invalid(c.Validate()) }

// Validate checks the values; each error names its option.
func (c Config) Validate() error {
	var errs []error
	if c.IPAM != "" && c.IPAM != "kubernetes" && c.IPAM != "cluster-pool" {
		errs = append(errs, fmt.Errorf("ipam %q: must be kubernetes or cluster-pool", c.IPAM))
	}
	// The ranges' syntax does not depend on the node's name.
	if _, _, err := c.PodCIDRs(""); err != nil {
		errs = append(errs, err)
	}
	if c.IPAMExpiration <= 0 {
		errs = append(errs, fmt.Errorf("ipam-expiration %s: must be positive", c.IPAMExpiration))
	}
	if c.CNIGCGracePeriod < 0 {
		errs = append(errs, fmt.Errorf("cni-gc-grace-period %s: must not be negative", c.CNIGCGracePeriod))
	}
	if c.MTU < 1280 || c.MTU > 65535 {
		errs = append(errs, fmt.Errorf("mtu %d: must be between 1280 and 65535", c.MTU))
	}
	return errors.Join(errs...)
}

// settings are what the endpoints take from the agent's own options.
type settings struct {
	NodeName string
	// StateDir holds the endpoints' state files (under endpoints/).
	StateDir string
	// ProcFS is where the host's sysctls are written (<ProcFS>/sys).
	ProcFS string
}

// Kubernetes is what the endpoints read from the cluster; nil in
// standalone mode.
type Kubernetes interface {
	// SelectPodCIDRs waits for this node's Node and picks its pod CIDRs.
	SelectPodCIDRs(ctx context.Context) (node.Selection, error)
	// PodLabels are the labels of a pod's endpoint, waiting a little for
	// the pod to reach the cache; false when it does not.
	PodLabels(ctx context.Context, ns, name string) ([]string, bool)
}

// Module owns IPAM, the endpoint manager and the node's host networking
// (host device, per-pod routes).
type Module struct {
	cfg      Config
	settings settings
	log      *slog.Logger
	root     cell.RootLogger
	k8s      Kubernetes // nil in standalone mode
	jobs     job.Group

	ipam     *ipam.IPAM
	mgr      *endpointmanager.Manager
	nl       *netlink.Handle
	host     *linux.Host
	restored endpointmanager.RestoreResult

	// hooks and subscribers are what other cells add to every endpoint's
	// regeneration and to the manager's events, before the manager exists
	// (it is built by the start step).
	hookMu      sync.Mutex
	hooks       []endpointmanager.Regenerator
	subscribers []func(endpointmanager.Event)
	realizer    Realizer // nil without the datapath (RegenerationCell sets it)

	// cni serves tendril-cni's commands once IPAM and the endpoints are up.
	cniMu sync.Mutex
	cni   *cniserver.Server
}

// Params are the endpoints' dependencies.
type Params struct {
	cell.In

	Config    Config
	Agent     option.Agent
	Node      option.LocalNode
	Log       *slog.Logger
	Root      cell.RootLogger
	Lifecycle cell.Lifecycle
	Steps     *lifecycle.Steps
	Jobs      job.Registry
	Health    *health.Registry
	K8s       Kubernetes
	// Overhead is what an encapsulation between nodes adds to a pod's
	// packets (the tunnel routing mode, pkg/agent/tunnel): the pods'
	// device MTU is --mtu less it. Optional: 0 routing natively.
	Overhead MTUOverhead `optional:"true"`
	// Encryption is what the encryption between nodes adds
	// (pkg/agent/wireguard): subtracted too. Optional: 0 unencrypted.
	Encryption EncryptionOverhead `optional:"true"`
	// API is the API server's configuration: tendril-cni queues the DELs
	// it could not send beside the socket (pkg/cni/delqueue).
	API server.Config
}

// MTUOverhead is the bytes of encapsulation a pod's packet to another
// node gets: the pods' MTU leaves room for them.
type MTUOverhead int

// EncryptionOverhead is the bytes the encryption between nodes adds to a
// pod's packet to another node.
type EncryptionOverhead int

// New builds the endpoints module and appends its start step, the IPAM
// expiration job after it.
func New(p Params) *Module {
	cfg := p.Config
	cfg.MTU -= int(p.Overhead) + int(p.Encryption)
	m := &Module{cfg: cfg, settings: settings{NodeName: p.Node.Name, StateDir: p.Agent.StateDir, ProcFS: p.Agent.ProcFS}, log: p.Log, root: p.Root, k8s: p.K8s,
		jobs: p.Jobs.NewGroup(p.Health.Scope("endpoint-restore-ipam"), job.WithLogger(p.Log))}
	p.Steps.Append(p.Lifecycle, "endpoint-restore-ipam", m.start, m.stop)
	m.jobs.Add(job.OneShot("ipam-expiration", func(ctx context.Context, _ cell.Health) error {
		m.ipam.RunExpiration(ctx, 10*time.Second)
		return nil
	}))
	queue := delqueue.Dir(p.API.Socket)
	m.jobs.Add(job.OneShot("cni-delete-queue", func(ctx context.Context, _ cell.Health) error {
		m.followDeleteQueue(ctx, queue)
		return nil
	}))
	return m
}

// AddRegenerateHook adds a step to every endpoint's regeneration (identity,
// policy, BPF), run in the order added after host networking; removal runs
// in reverse. Cells add theirs while the hive is built.
func (m *Module) AddRegenerateHook(h endpointmanager.Regenerator) {
	m.hookMu.Lock()
	defer m.hookMu.Unlock()
	m.hooks = append(m.hooks, h)
}

func (m *Module) regenerateHooks() []endpointmanager.Regenerator {
	m.hookMu.Lock()
	defer m.hookMu.Unlock()
	return append([]endpointmanager.Regenerator(nil), m.hooks...)
}

// Subscribe adds fn to the endpoint manager's subscribers once it is
// built. Cells subscribe while the hive is built.
func (m *Module) Subscribe(fn func(endpointmanager.Event)) {
	m.hookMu.Lock()
	defer m.hookMu.Unlock()
	m.subscribers = append(m.subscribers, fn)
}

func (m *Module) cniServer() *cniserver.Server {
	m.cniMu.Lock()
	defer m.cniMu.Unlock()
	return m.cni
}

// startIPAMAndRestore is start step 5: read the old endpoints, pick the pod
// CIDRs, start IPAM and re-reserve every restored endpoint's addresses before
// anything new is handed out, then set up the host device.
func (m *Module) start(ctx context.Context) error {
	v4, v6, err := m.cfg.PodCIDRs(m.settings.NodeName)
	if err != nil {
		return err
	}
	if m.k8s != nil {
		sel, err := m.k8s.SelectPodCIDRs(ctx)
		if err != nil {
			return err
		}
		v4, v6 = sel.IPv4, sel.IPv6
	}
	alloc, err := ipam.New(ipam.Config{ExpirationTimeout: m.cfg.IPAMExpiration}, logging.For(m.root, "ipam"), v4, v6)
	if err != nil {
		return fmt.Errorf("start IPAM: %w", err)
	}
	m.ipam = alloc
	store, err := endpoint.NewStore(filepath.Join(m.settings.StateDir, "endpoints"), logging.For(m.root, "endpoint-store"))
	if err != nil {
		return err
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	m.nl = nl
	m.host = linux.NewHost(nl, netns.None(), logging.For(m.root, "host-networking")).WithProcFS(m.settings.ProcFS)
	m.NewManager(store, alloc)

	start := time.Now()
	res, err := m.mgr.Restore(ctx, m.host.LinkExists)
	if err != nil {
		return fmt.Errorf("restore endpoints: %w", err)
	}
	m.restored = res
	if r := m.realizerOrNil(); r != nil {
		// Before the CNI server serves: these are the restored endpoints
		// and no others.
		r.Restored(m.mgr.List())
	}
	m.log.Info("Restored endpoints from disk", "restored", len(res.Restored), "removed", len(res.Removed),
		"failed", len(res.Failed), "duration", time.Since(start), "ipv4-cidr", v4, "ipv6-cidr", v6)

	if m.cfg.InstallHostNetworking {
		m.reserveOrphans()
		if _, err := m.host.EnsureHostDevice(addrIP(alloc.RouterIP(ipam.IPv4)), addrIP(alloc.RouterIP(ipam.IPv6))); err != nil {
			return fmt.Errorf("set up host device: %w", err)
		}
		if alloc.RouterIP(ipam.IPv6).IsValid() {
			// Proxy NDP for the router address on every host veth (see
			// regenerator.Regenerate): on for all interfaces once here,
			// where the kernel answers a solicitation when either the
			// interface's or "all"'s proxy_ndp is set; only addresses with a
			// proxy entry on the receiving interface are answered.
			if err := m.host.Sysctl().Set("1", "net", "ipv6", "conf", "all", "proxy_ndp"); err != nil {
				return fmt.Errorf("turn on proxy NDP: %w", err)
			}
		}
	}
	srv, err := cniserver.New(cniserver.Deps{
		Log: logging.For(m.root, "cni"), IPAM: alloc, Endpoints: cniEndpoints{m: m},
		Netlink: nl, Host: m.host, DeviceMTU: m.cfg.MTU, GCGracePeriod: m.cfg.CNIGCGracePeriod,
	})
	if err != nil {
		return err
	}
	m.cniMu.Lock()
	m.cni = srv
	m.cniMu.Unlock()
	return nil
}

// NewManager builds the endpoint manager over store with its regenerator
// (host networking, then the regeneration hooks) and the subscribers other
// cells added, and makes it the module's. The start step calls it once
// IPAM and host networking are up; tests of the regeneration call it
// without starting the hive.
func (m *Module) NewManager(store *endpoint.Store, alloc *ipam.IPAM) *endpointmanager.Manager {
	mgr := endpointmanager.New(store, alloc, logging.For(m.root, "endpoint-manager"))
	mgr.SetRegenerator(&regenerator{m: m})
	m.hookMu.Lock()
	subs := append([]func(endpointmanager.Event){}, m.subscribers...)
	m.hookMu.Unlock()
	for _, fn := range subs {
		mgr.Subscribe(fn)
	}
	m.mgr = mgr
	return mgr
}

func (m *Module) stop(context.Context) error {
	if m.nl != nil {
		m.nl.Close()
	}
	return nil
}

// RegenerateRestored is start step 9: the restored endpoints regenerate;
// the manager's workers (RunWorkers, a job started right after) retry what
// failed and build every later change (labels, policy for endpoints that
// were not ready).
func (m *Module) RegenerateRestored(ctx context.Context) error {
	if err := m.mgr.RegenerateRestored(ctx); err != nil {
		// An endpoint that fails is not ready and queued for a retry with
		// backoff; the agent itself keeps running.
		m.log.Error("Some restored endpoints failed to regenerate; they are retried", "error", err)
	}
	return nil
}

// RunWorkers runs the manager's regeneration workers until ctx ends.
func (m *Module) RunWorkers(ctx context.Context, _ cell.Health) error {
	m.mgr.Run(ctx)
	return nil
}

// ApplyPodLabels gives an endpoint of a pod its pod's labels (Kubernetes
// mode).
func (m *Module) ApplyPodLabels(ctx context.Context, ep *endpoint.Endpoint) {
	if m.k8s == nil || ep.PodName == "" {
		return
	}
	if labels, ok := m.k8s.PodLabels(ctx, ep.PodNamespace, ep.PodName); ok {
		ep.Labels = labels
		return
	}
	m.log.Warn("Pod not in the cache; endpoint keeps the request's labels until the pod is seen",
		"pod", ep.PodNamespace+"/"+ep.PodName)
}

// Relabel records new labels for the endpoints of a pod. It only records
// them and queues the endpoints' regeneration: the manager's workers
// allocate the identity (over the network in CRD or kvstore mode) and
// realize the policy, retried until they succeed, so the watcher callback that
// calls it never blocks.
func (m *Module) Relabel(ns, name string, labels []string) {
	mgr := m.mgr
	if mgr == nil {
		return
	}
	for _, ep := range mgr.List() {
		if ep.PodNamespace != ns || ep.PodName != name {
			continue
		}
		changed, err := mgr.SetLabels(ep.ID, labels, "Pod labels changed")
		if err != nil {
			m.log.Warn("Update endpoint labels", "endpoint", ep.ID, "pod", ns+"/"+name, "error", err)
			continue
		}
		if changed {
			m.log.Info("Endpoint labels changed; regeneration queued", "endpoint", ep.ID, "pod", ns+"/"+name)
		}
	}
}

// Manager is the endpoint manager; nil before the start step builds it.
func (m *Module) Manager() *endpointmanager.Manager { return m.mgr }

// LookupNames is a local endpoint as flows name it; false before the
// start step builds the manager.
func (m *Module) LookupNames(id uint16) (endpointmanager.Names, bool) {
	if m.mgr == nil {
		return endpointmanager.Names{}, false
	}
	return m.mgr.LookupNames(id)
}

// IPAM is the node's address allocator; nil before the start step.
func (m *Module) IPAM() *ipam.IPAM { return m.ipam }

// Netlink is the agent's netlink handle; nil before the start step.
func (m *Module) Netlink() *netlink.Handle { return m.nl }

// ManagerForAPI is the endpoint manager, or the API's 503 before its
// start step.
func (m *Module) ManagerForAPI() (*endpointmanager.Manager, error) {
	if m.mgr == nil {
		return nil, server.Errorf(http.StatusServiceUnavailable, "endpoint manager is not started yet")
	}
	return m.mgr, nil
}

func addrIP(a netip.Addr) net.IP {
	if !a.IsValid() {
		return nil
	}
	return net.IP(a.AsSlice())
}

// NodeAddressing reports the node's families, router IPs and CIDRs.
func (m *Module) NodeAddressing() *models.NodeAddressing {
	elem := func(f ipam.Family) *models.NodeAddressingElement {
		if m.ipam == nil || !m.ipam.Enabled(f) {
			return &models.NodeAddressingElement{Enabled: false}
		}
		return &models.NodeAddressingElement{
			Enabled: true, IP: m.ipam.RouterIP(f).String(), AllocRange: m.ipam.CIDR(f).String(),
		}
	}
	return &models.NodeAddressing{IPV4: elem(ipam.IPv4), IPV6: elem(ipam.IPv6)}
}

// StatusSection is the IPAM and endpoints part of `tendril status`.
func (m *Module) StatusSection() ext.Section {
	sec := ext.Section{Title: "IPAM"}
	if m.ipam == nil {
		sec.Lines = append(sec.Lines, ext.Line{Key: "state", Value: "not started"})
		return sec
	}
	for _, u := range m.ipam.Usage() {
		sec.Lines = append(sec.Lines, ext.Line{Key: string(u.Family), Value: fmt.Sprintf("%d/%d allocated from %s (router %s)", u.Used, u.Total, u.CIDR, u.Router)})
	}
	counts := map[endpoint.State]int{}
	eps := m.mgr.List()
	for _, ep := range eps {
		counts[ep.State]++
	}
	sec.Lines = append(sec.Lines, ext.Line{Key: "endpoints", Value: fmt.Sprintf("%d (%d ready)", len(eps), counts[endpoint.StateReady])})
	sec.Lines = append(sec.Lines, ext.Line{Key: "endpoint policy", Value: ConvergenceLine(m.mgr.Convergence())})
	return sec
}

// ConvergenceLine says how many endpoints have not yet realized the
// current policy revision, and how many of those failed last time.
func ConvergenceLine(c endpointmanager.Convergence) string {
	notRealized := c.Endpoints - c.Converged
	line := fmt.Sprintf("revision %d: %d/%d realized", c.PolicyRevision, c.Converged, c.Endpoints)
	if notRealized > 0 {
		line += fmt.Sprintf(", %d not yet realized (%d failing, retried)", notRealized, c.Failing)
	}
	return line
}

// regenerator realizes an endpoint in the node: host veth settings and
// routes now; identity, policy and BPF programs are added by their modules
// through the hooks other cells add (AddRegenerateHook).
type regenerator struct{ m *Module }

func (r *regenerator) Regenerate(ctx context.Context, ep *endpoint.Endpoint) error {
	if r.m.cfg.InstallHostNetworking && ep.HostIfName != "" {
		link, err := r.m.nl.LinkByName(ep.HostIfName)
		if err != nil {
			return fmt.Errorf("host interface %s: %w", ep.HostIfName, err)
		}
		ep.HostIfIndex = link.Attrs().Index
		// The per-interface proxy_ndp sysctl is left alone (proxy NDP is on
		// for all interfaces, set at start): a write that changes it takes
		// the routing-netlink lock with trylock and restarts the system
		// call until it gets it, spinning on a CPU for as long as other
		// endpoints' program attachments hold the lock (hundreds of
		// milliseconds with 50 concurrent CNI ADDs). The proxy entry goes in
		// through netlink, which waits for the lock asleep.
		if err := r.m.host.ConfigureHostVeth(ep.HostIfName, nil); err != nil {
			return fmt.Errorf("configure host interface %s: %w", ep.HostIfName, err)
		}
		if router6 := r.m.ipam.RouterIP(ipam.IPv6); router6.IsValid() {
			proxy := &netlink.Neigh{LinkIndex: ep.HostIfIndex, Family: unix.AF_INET6, Flags: netlink.NTF_PROXY, IP: addrIP(router6)}
			if err := r.m.nl.NeighSet(proxy); err != nil {
				return fmt.Errorf("proxy NDP for %s on %s: %w", router6, ep.HostIfName, err)
			}
		}
		for _, ip := range ep.Addresses() {
			if err := r.m.host.UpsertEndpointRoute(addrIP(ip), ep.HostIfIndex); err != nil {
				return fmt.Errorf("route to %s: %w", ip, err)
			}
		}
	}
	for _, hook := range r.m.regenerateHooks() {
		if err := hook.Regenerate(ctx, ep); err != nil {
			return err
		}
	}
	return nil
}

func (r *regenerator) Remove(ctx context.Context, ep *endpoint.Endpoint) error {
	var errs []error
	hooks := r.m.regenerateHooks()
	for i := len(hooks) - 1; i >= 0; i-- {
		if err := hooks[i].Remove(ctx, ep); err != nil {
			errs = append(errs, err)
		}
	}
	if r.m.cfg.InstallHostNetworking && ep.HostIfIndex != 0 {
		for _, ip := range ep.Addresses() {
			if err := r.m.host.DeleteEndpointRoute(addrIP(ip), ep.HostIfIndex); err != nil {
				errs = append(errs, fmt.Errorf("delete route to %s: %w", ip, err))
			}
		}
	}
	return errors.Join(errs...)
}

// IPAMStatus is the status' ipam section: every allocation with its owner,
// the router addresses owned by "router", as the Cilium agent reports them.
func (m *Module) IPAMStatus() *models.IPAMStatus {
	st := &models.IPAMStatus{Allocations: models.AllocationMap{}, IPV4: []string{}, IPV6: []string{}}
	if m.ipam == nil {
		st.Status = "not started"
		return st
	}
	var parts []string
	for _, u := range m.ipam.Usage() {
		st.Allocations[u.Router.String()] = "router"
		for _, al := range u.Allocations {
			st.Allocations[al.IP.String()] = al.Owner
			if u.Family == ipam.IPv4 {
				st.IPV4 = append(st.IPV4, al.IP.String())
			} else {
				st.IPV6 = append(st.IPV6, al.IP.String())
			}
		}
		parts = append(parts, fmt.Sprintf("%s: %d/%d allocated from %s", u.Family, u.Used, u.Total, u.CIDR))
	}
	st.Status = strings.Join(parts, ", ")
	return st
}

// reserveOrphans protects addresses that pods still use although no
// endpoint was restored for them (a state file that was corrupt): a route
// Tendril installed to a veth that still exists keeps its address reserved,
// so it is never handed to a second pod; routes to vanished veths go.
func (m *Module) reserveOrphans() {
	routes, err := m.host.EndpointRoutes()
	if err != nil {
		m.log.Warn("Cannot list endpoint routes to find orphaned addresses", "error", err)
		return
	}
	owned := map[netip.Addr]bool{}
	for _, ep := range m.mgr.List() {
		for _, ip := range ep.Addresses() {
			owned[ip] = true
		}
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if owned[ip] {
			continue
		}
		link, err := m.nl.LinkByIndex(r.LinkIndex)
		if err != nil {
			if err := m.host.DeleteEndpointRoute(addrIP(ip), r.LinkIndex); err != nil {
				m.log.Warn("Remove stale endpoint route", "ip", ip, "error", err)
			}
			continue
		}
		owner := "orphan:" + link.Attrs().Name
		if _, err := m.ipam.Allocate(ip, owner); err != nil {
			m.log.Warn("Cannot reserve an orphaned pod address", "ip", ip, "interface", link.Attrs().Name, "error", err)
			continue
		}
		_ = m.ipam.Claim(ip, "")
		m.log.Warn("A pod address has no restored endpoint (its state was lost); keeping it reserved until its interface goes",
			"ip", ip, "interface", link.Attrs().Name)
	}
}
