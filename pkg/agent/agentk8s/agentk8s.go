// Package agentk8s is the agent's Kubernetes side: the client cell
// (clients, the API server reached, CRDs installed, this node's Node and
// pod CIDRs, pods' labels and named ports; start step "k8s-client") and
// the Kubernetes cell (the node write-back, the watchers and what they
// feed: endpoint labels, policies, peers and routes, other nodes'
// endpoints in the ipcache, this node's endpoints published as
// TendrilEndpoints, the per-node policy status; start steps
// "k8s-node-writeback" and "k8s-watchers").
package agentk8s

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentpolicy"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/crdalloc"
	"github.com/tendril-net/tendril/pkg/ipam"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/endpointpub"
	"github.com/tendril-net/tendril/pkg/k8s/policystatus"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/node"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy"
	policyk8s "github.com/tendril-net/tendril/pkg/policy/k8s"
)

// Cell is the end of start step 5 (the node's CIDRs and
// addresses written back) and step 6: the watchers, and what they feed
// (endpoint labels from pods and namespaces, policies, peers, other nodes'
// endpoints in the ipcache, this node's endpoints published as
// TendrilEndpoints).
var Cell = cell.Module("k8s", "Kubernetes node write-back and watchers",
	// Invoke before Provide: one cycle check less (pkg/agent/cells.go).
	cell.Provide(lifecycle.Build[*Module]),
	cell.Provide(New, statusContribution, policyStatusOf, endpointPublicationsOf),
)

// Config are the Kubernetes options.
type Config struct {
	// Client says how to reach the API server; with none configured the
	// agent runs standalone.
	Client k8s.Config `mapstructure:",squash"`
	// CacheSyncTimeout bounds the wait for the API server and for the
	// watchers' initial lists; past it the agent exits naming what is
	// missing.
	CacheSyncTimeout time.Duration `mapstructure:"k8s-cache-sync-timeout"`
	// InstallCRDs creates or updates the Tendril CRDs at start.
	InstallCRDs bool `mapstructure:"k8s-install-crds"`
	// PeerPodCIDRMinPrefixIPv4/IPv6 are the shortest pod CIDRs another
	// node may claim (nodemanager.Rules).
	PeerPodCIDRMinPrefixIPv4, PeerPodCIDRMinPrefixIPv6 int
	// ClusterPoolIPv4/IPv6 are the operator's cluster pools: when set,
	// another node's pod CIDR of the family must lie inside one.
	ClusterPoolIPv4 []string `mapstructure:"cluster-pool-ipv4-cidr"`
	ClusterPoolIPv6 []string `mapstructure:"cluster-pool-ipv6-cidr"`
	// ServiceCIDRs no node's pod CIDR may overlap.
	ServiceCIDRs []string `mapstructure:"k8s-service-cidr"`
}

// DefaultConfig are the Kubernetes defaults.
func DefaultConfig() Config {
	return Config{Client: k8s.DefaultConfig(), CacheSyncTimeout: 3 * time.Minute, InstallCRDs: true,
		PeerPodCIDRMinPrefixIPv4: nodemanager.DefaultMinPrefixIPv4, PeerPodCIDRMinPrefixIPv6: nodemanager.DefaultMinPrefixIPv6}
}

// Flags registers the Kubernetes options, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	c.Client.Flags(fs)
	fs.Duration("k8s-cache-sync-timeout", c.CacheSyncTimeout, "How long to wait for the API server and the initial lists of watched resources")
	fs.Bool("k8s-install-crds", c.InstallCRDs, "Create or update the Tendril CRDs at start")
	fs.Int("peer-pod-cidr-min-prefix-ipv4", c.PeerPodCIDRMinPrefixIPv4, "Shortest IPv4 pod CIDR accepted from another node (a shorter one gets no route)")
	fs.Int("peer-pod-cidr-min-prefix-ipv6", c.PeerPodCIDRMinPrefixIPv6, "Shortest IPv6 pod CIDR accepted from another node (a shorter one gets no route)")
	fs.StringSlice("cluster-pool-ipv4-cidr", c.ClusterPoolIPv4, "The operator's IPv4 cluster pools: another node's IPv4 pod CIDR outside them is refused (empty: not checked)")
	fs.StringSlice("cluster-pool-ipv6-cidr", c.ClusterPoolIPv6, "The operator's IPv6 cluster pools: another node's IPv6 pod CIDR outside them is refused (empty: not checked)")
	fs.StringSlice("k8s-service-cidr", c.ServiceCIDRs, "The cluster's service CIDRs: a node's pod CIDR overlapping one is refused")
}

// ClusterPools are the parsed --cluster-pool-ipv4-cidr and
// --cluster-pool-ipv6-cidr (nil when unset): the ranges every pod address
// of the cluster comes from. Validate has refused unparsable values.
func (c Config) ClusterPools() []netip.Prefix {
	r, _ := c.peerRules(nil)
	return r.Pools
}

// peerRules are the checks on other nodes' pod CIDRs; local reads this
// node's pod CIDRs and addresses.
func (c Config) peerRules(local func() ([]netip.Prefix, []netip.Addr)) (nodemanager.Rules, error) {
	r := nodemanager.Rules{MinPrefixIPv4: c.PeerPodCIDRMinPrefixIPv4, MinPrefixIPv6: c.PeerPodCIDRMinPrefixIPv6, Local: local}
	var errs []error
	parse := func(flag string, vals []string, is4 *bool) []netip.Prefix {
		var out []netip.Prefix
		for _, v := range vals {
			p, err := netip.ParsePrefix(strings.TrimSpace(v))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %q: %w", flag, v, err))
				continue
			}
			if is4 != nil && p.Addr().Is4() != *is4 {
				errs = append(errs, fmt.Errorf("%s %q: wrong address family", flag, v))
				continue
			}
			out = append(out, p.Masked())
		}
		return out
	}
	v4, v6 := true, false
	r.Pools = append(parse("cluster-pool-ipv4-cidr", c.ClusterPoolIPv4, &v4), parse("cluster-pool-ipv6-cidr", c.ClusterPoolIPv6, &v6)...)
	r.Reserved = parse("k8s-service-cidr", c.ServiceCIDRs, nil)
	if err := r.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("peer-pod-cidr-min-prefix: %w", err))
	}
	return r, errors.Join(errs...)
}

// validate is Validate, marked as a configuration error.
func (c Config) validate() error { return option.Invalid(c.Validate()) }

// Validate checks the values; each error names its option.
func (c Config) Validate() error {
	var errs []error
	if err := c.Client.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.CacheSyncTimeout <= 0 {
		errs = append(errs, fmt.Errorf("k8s-cache-sync-timeout %s: must be positive", c.CacheSyncTimeout))
	}
	if _, err := c.peerRules(nil); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// settings are what the Kubernetes side takes from the other cells'
// options: this node's name and how its pod CIDRs and routes are chosen.
type settings struct {
	NodeName string
	// IPAM, IPv4Range and IPv6Range are the endpoints' options of the
	// same names.
	IPAM, IPv4Range, IPv6Range string
	// InstallHostNetworking: routes to peers' pod CIDRs are installed.
	InstallHostNetworking bool
}

func settingsOf(node option.LocalNode, eps agentendpoints.Config) settings {
	return settings{NodeName: node.Name, IPAM: eps.IPAM, IPv4Range: eps.IPv4Range, IPv6Range: eps.IPv6Range,
		InstallHostNetworking: eps.InstallHostNetworking}
}

// Module is the agent's Kubernetes side after the client: the node
// write-back, the watchers and their subscribers; nil in standalone mode.
type Module struct {
	settings   settings
	cfg        Config
	log        *slog.Logger
	root       cell.RootLogger
	client     *Client
	eps        *agentendpoints.Module
	ipcache    IPCache // nil without the datapath
	policy     Policy
	identities identity.Allocator
	jobs       job.Group

	// nodes writes the peers and their routes (the nodes cell's tables);
	// the two functions mark the Nodes' and TendrilNodes' initial
	// listings in.
	nodes                           *nodemanager.Manager
	db                              *statedb.DB
	peers                           statedb.Table[*nodemanager.Peer]
	routes                          statedb.Table[*nodemanager.Route]
	nodesSynced, tendrilNodesSynced func()
	// remoteEndpointsSynced marks the TendrilEndpoints' initial listing
	// in the ipcache (its prune waits for it); a no-op without datapath.
	remoteEndpointsSynced func()
	// gate judges other nodes' TendrilEndpoints before they reach the
	// ipcache; nil without the datapath.
	gate *nodemanager.ClaimGate
	// local is what the write-back publishes, read by its start step.
	local node.Local
	// publisher holds the TendrilEndpoints to publish (a statedb table
	// and its reconciler).
	publisher *endpointpub.Publisher
	// poolHealth reports this node's TendrilNode PodCIDRsAllocated
	// condition with --ipam cluster-pool (nil otherwise): degraded while
	// the operator found a pool exhausted for a family the node lacks.
	poolHealth cell.Health

	mu sync.Mutex
	// localLabels are this node's labels as last seen (guarded by mu):
	// a change re-resolves the host policies' nodeSelectors.
	localLabels map[string]string

	// status is this node's report on each Tendril policy object.
	status *policystatus.Publisher
	// policies imports the watched policies into the repository.
	policies *PolicySource
}

// IPCache is what the watchers write of other nodes and their pods into
// the ipcache (the datapath's), and its initializer for the
// TendrilEndpoints' first listing.
type IPCache interface {
	nodemanager.IPCache
	UpsertRemoteEndpoint(ip netip.Addr, e ipcache.Entry) error
	DeleteRemoteEndpoint(ip netip.Addr, src ipcache.Source, owner ipcache.Owner) error
	AddInitializer(name string) func()
}

// Policy is the policy as the Kubernetes sources use it: the repository
// policies are imported into, a pass over every endpoint when the universe
// changed, and the audit counts the policy status reports.
type Policy interface {
	Repository() *policy.Repository
	TriggerRegeneration()
	AuditCounts() (map[agentpolicy.AuditedRule]uint64, error)
}

// Params are the Kubernetes side's dependencies.
type Params struct {
	cell.In

	Config     Config
	Node       option.LocalNode
	EPConfig   agentendpoints.Config
	Log        *slog.Logger
	Root       cell.RootLogger
	Lifecycle  cell.Lifecycle
	Steps      *lifecycle.Steps
	Jobs       job.Registry
	Health     *health.Registry
	Client     *Client
	Endpoints  *agentendpoints.Module
	IPCache    IPCache // nil without the datapath
	Policy     Policy
	Identities identity.Allocator
	DB         *statedb.DB
	ModuleID   cell.FullModuleID
	Inspector  *dbinspect.Inspector
	Metrics    *metrics.Server
	// Nodes writes the nodes and routes tables (the nodes cell's;
	// non-nil with a client); Peers and Routes are those tables, read by
	// the claim gate and the status.
	Nodes  *nodemanager.Manager
	Peers  statedb.Table[*nodemanager.Peer]
	Routes statedb.Table[*nodemanager.Route]
	// Keys is this node's encryption key to publish in its TendrilNode
	// (pkg/agent/wireguard; nil with encryption off).
	Keys PublicKeys `optional:"true"`
	// Health is this node's health endpoint's addresses to publish
	// (pkg/agent/nodehealth; nil without a health endpoint).
	HealthEndpoint node.HealthAddresses `optional:"true"`
}

// PublicKeys is this node's public encryption key and a channel closed
// when it changes (a rotation): the write-back publishes it again.
type PublicKeys interface {
	WireGuardPublicKey() (key string, changed <-chan struct{})
}

// New builds the Kubernetes side (nil in standalone mode) and appends its
// steps, each with its jobs after it.
func New(p Params) (*Module, error) {
	if p.Client == nil {
		return nil, nil
	}
	set := settingsOf(p.Node, p.EPConfig)
	k := &Module{
		settings: set, cfg: p.Config, log: p.Log, root: p.Root, client: p.Client, eps: p.Endpoints, policy: p.Policy,
		identities: p.Identities, nodes: p.Nodes, db: p.DB, peers: p.Peers, routes: p.Routes,
		jobs: p.Jobs.NewGroup(p.Health.Scope("k8s-watchers"), job.WithLogger(p.Log)),
	}
	k.remoteEndpointsSynced = func() {}
	if set.IPAM == "cluster-pool" {
		k.poolHealth = p.Health.Scope("cluster-pool")
	}
	if p.IPCache != nil {
		k.ipcache = p.IPCache
		k.remoteEndpointsSynced = p.IPCache.AddInitializer("k8s-tendrilendpoints")
		k.gate = nodemanager.NewClaimGate(nodemanager.ClaimGateParams{DB: p.DB, Nodes: p.Peers, Cache: p.IPCache,
			Log: logging.For(p.Root, "tendrilendpoint-claims"), OnRejected: nodemanager.ClaimsRejectedCounter(registry(p.Metrics), "kubernetes")})
	}
	// This node's report on each Tendril policy, published into the
	// objects' status by a reconciler.
	st, err := policystatus.New(policystatus.Params{DB: p.DB, Jobs: k.jobs, Log: logging.For(p.Root, "policy-status"),
		ModuleID: p.ModuleID, Node: set.NodeName, Patcher: policyStatusPatcher{p.Client}})
	if err != nil {
		return nil, err
	}
	k.status = st
	k.policies = NewPolicySource(p.Log, p.Policy, st)
	p.Inspector.AddReconciled(policystatus.TableName, func(txn statedb.ReadTxn) dbinspect.Realization {
		return dbinspect.CountStatus(st.Table().All(txn), func(o *policystatus.Report) reconciler.Status { return o.Status })
	})
	p.Steps.Append(p.Lifecycle, "k8s-node-writeback", k.startWriteBack, nil)
	k.jobs.Add(job.OneShot("node-writeback", func(ctx context.Context, _ cell.Health) error {
		for {
			l := k.local
			var keyChanged, healthChanged <-chan struct{}
			if p.Keys != nil {
				l.WireGuardPublicKey, keyChanged = p.Keys.WireGuardPublicKey()
			}
			if p.HealthEndpoint != nil {
				l.HealthIPv4, l.HealthIPv6, healthChanged = p.HealthEndpoint.HealthEndpointAddresses()
			}
			if err := k.client.writer.Run(ctx, l); err != nil || (keyChanged == nil && healthChanged == nil) {
				return err
			}
			// A nil channel never fires: only what can change is waited on.
			select {
			case <-ctx.Done():
				return nil
			case <-keyChanged:
			case <-healthChanged:
			}
		}
	}))
	// Watchers, and their caches synced, before restored endpoints
	// regenerate: Kubernetes policies must be in first (fail closed).
	p.Steps.Append(p.Lifecycle, "k8s-watchers", k.startWatchers, k.stop)
	if alloc, ok := p.Identities.(*crdalloc.Allocator); ok {
		// Recreates the identities in use here that the watcher saw
		// deleted, and publishes the ones in use on this TendrilNode.
		k.jobs.Add(job.OneShot("identity-keeper", func(ctx context.Context, _ cell.Health) error {
			alloc.Run(ctx)
			return nil
		}))
	}
	if k.gate != nil {
		k.jobs.Add(job.OneShot("tendrilendpoint-claims", func(ctx context.Context, _ cell.Health) error { return k.gate.Run(ctx) }))
	}
	k.nodesSynced = k.nodes.AddInitializer("k8s-nodes")
	k.tendrilNodesSynced = k.nodes.AddInitializer("k8s-tendrilnodes")
	if err := k.newEndpointPublisher(p); err != nil {
		return nil, err
	}
	k.jobs.Add(
		job.Timer("policy-status-enforcing", func(context.Context) error {
			k.status.Realized(k.realizedRevision())
			return nil
		}, time.Second),
		job.Timer("policy-status-audited", func(context.Context) error {
			counts, err := k.policy.AuditCounts()
			if err != nil {
				return err
			}
			byObject := map[string]uint64{}
			for r, n := range counts {
				byObject[policystatus.Key(r.Kind, r.Namespace, r.Name)] += n
			}
			k.status.Audited(byObject)
			return nil
		}, 5*time.Second),
	)
	return k, nil
}

// PeerRules are the checks on other nodes' pod CIDRs from the Kubernetes
// options, against this node's pod CIDRs and addresses as the client read
// them (the nodes cell's node manager applies them).
func PeerRules(cfg Config, c *Client) (nodemanager.Rules, error) {
	return cfg.peerRules(c.localPodCIDRsAndAddresses)
}

// NodeIP is the address other nodes know this node by: its Node's
// InternalIP, else the IPv4 router IP.
func (k *Module) NodeIP() string {
	if ip := k.client.internalIP(); ip != "" {
		return ip
	}
	if m := k.eps.IPAM(); m != nil {
		for _, ip := range []netip.Addr{m.RouterIP(ipam.IPv4), m.RouterIP(ipam.IPv6)} {
			if ip.IsValid() {
				return ip.String()
			}
		}
	}
	return ""
}

// startWriteBack is the end of step 5: publish the CIDRs, router IPs and
// node addresses in the background, retrying until the API server takes
// them.
func (k *Module) startWriteBack(context.Context) error {
	c := k.client
	c.mu.Lock()
	l := node.Local{Name: k.settings.NodeName, Selection: c.selection, Addresses: node.AddressesOf(c.nodeObj)}
	c.mu.Unlock()
	if m := k.eps.IPAM(); m != nil {
		l.RouterIPv4 = m.RouterIP(ipam.IPv4)
		l.RouterIPv6 = m.RouterIP(ipam.IPv6)
	}
	k.local = l
	return nil
}

// startWatchers is start step 6: subscribe, start the informers and wait
// for their caches; on timeout the agent stops, naming what did not sync.
func (k *Module) startWatchers(ctx context.Context) error {
	w := k.client.watchers
	if _, err := w.Pods.Subscribe(k.onPod); err != nil {
		return err
	}
	if _, err := w.Namespaces.Subscribe(k.onNamespace); err != nil {
		return err
	}
	if alloc, ok := k.identities.(*crdalloc.Allocator); ok {
		if _, err := w.TendrilIdentities.Subscribe(func(ev watchers.Event[*v1alpha1.TendrilIdentity]) {
			switch ev.Kind {
			case watchers.Upsert:
				alloc.Upsert(ev.Object)
			case watchers.Delete:
				alloc.Delete(ev.Object)
			}
		}); err != nil {
			return err
		}
	}
	if _, err := w.TendrilEndpoints.Subscribe(k.onRemoteEndpoint); err != nil {
		return err
	}
	k.startPublisher()
	if _, err := w.NetworkPolicies.Subscribe(k.policies.OnNetworkPolicy); err != nil {
		return err
	}
	if _, err := w.Pods.Subscribe(func(ev watchers.Event[*corev1.Pod]) {
		// A pod's named ports may change what named-port rules open.
		if ev.Kind == watchers.Upsert && len(policyk8s.PodNamedPorts(ev.Object)) > 0 {
			k.policy.TriggerRegeneration()
		}
	}); err != nil {
		return err
	}
	if _, err := w.TendrilNetworkPolicies.Subscribe(func(ev watchers.Event[*v1alpha1.TendrilNetworkPolicy]) {
		if ev.Kind == watchers.Synced {
			return
		}
		p := ev.Object
		k.policies.Apply(ev.Kind, "TendrilNetworkPolicy", p.Namespace, p.Name, string(p.UID), p.Generation, p.Spec, p.Specs, p.Status.Conditions)
	}); err != nil {
		return err
	}
	if _, err := w.TendrilClusterwideNetworkPolicies.Subscribe(func(ev watchers.Event[*v1alpha1.TendrilClusterwideNetworkPolicy]) {
		if ev.Kind == watchers.Synced {
			return
		}
		p := ev.Object
		k.policies.Apply(ev.Kind, "TendrilClusterwideNetworkPolicy", "", p.Name, string(p.UID), p.Generation, p.Spec, p.Specs, p.Status.Conditions)
	}); err != nil {
		return err
	}
	if _, err := w.Nodes.Subscribe(func(ev watchers.Event[*corev1.Node]) {
		k.onLocalLabels(ev)
		k.onPeerChange(ev.Kind, ev.Key, k.nodesSynced)
	}); err != nil {
		return err
	}
	if _, err := w.TendrilNodes.Subscribe(func(ev watchers.Event[*v1alpha1.TendrilNode]) {
		k.onPeerChange(ev.Kind, ev.Key, k.tendrilNodesSynced)
		if ev.Key == k.settings.NodeName && ev.Kind != watchers.Synced {
			k.reportClusterPool()
		}
	}); err != nil {
		return err
	}
	w.Start(context.Background())
	start := time.Now()
	if err := w.WaitForCacheSync(ctx, k.cfg.CacheSyncTimeout); err != nil {
		return err
	}
	k.log.Info("Kubernetes caches synced", "duration", time.Since(start))
	return nil
}

func (k *Module) stop(context.Context) error {
	k.client.watchers.Stop()
	return nil
}

// reportClusterPool turns this node's PodCIDRsAllocated condition into
// the cluster-pool health: a pool exhausted for one of the node's
// families shows in `tendril status`, not only in the operator's Event.
func (k *Module) reportClusterPool() {
	if k.poolHealth == nil {
		return
	}
	tn, _ := k.client.watchers.TendrilNodes.Get(k.settings.NodeName)
	ok, msg := node.ClusterPoolState(tn)
	if ok {
		k.poolHealth.OK(cmp.Or(msg, "no PodCIDRsAllocated condition on the TendrilNode yet"))
		return
	}
	k.poolHealth.Degraded("TendrilNode "+k.settings.NodeName, errors.New(msg))
}

// onPeerChange recomputes a peer from its Node and TendrilNode (either
// event may come first) and writes it to the nodes table in one short
// transaction; the node is gone when its Node is. synced is the source's
// table initializer, done with its initial listing.
func (k *Module) onPeerChange(kind watchers.EventKind, name string, synced func()) {
	if kind == watchers.Synced {
		synced()
		return
	}
	n, ok := k.client.watchers.Nodes.Get(name)
	var err error
	if !ok {
		err = k.nodes.DeletePeer(name)
	} else {
		tn, _ := k.client.watchers.TendrilNodes.Get(name)
		err = k.nodes.UpsertPeer(nodemanager.MergeTendrilNode(nodemanager.PeerFromNode(n), tn))
	}
	if err != nil {
		k.log.Error("Write the nodes table", "node", name, "error", err)
	}
}

func (k *Module) onPod(ev watchers.Event[*corev1.Pod]) {
	if ev.Kind != watchers.Upsert {
		return
	}
	nsObj, _ := k.client.watchers.Namespaces.Get(ev.Object.Namespace)
	k.eps.Relabel(ev.Object.Namespace, ev.Object.Name, k.client.podLabels(ev.Object, nsObj))
}

func (k *Module) onNamespace(ev watchers.Event[*corev1.Namespace]) {
	if ev.Kind != watchers.Upsert {
		return
	}
	for _, pod := range k.client.watchers.Pods.List() {
		if pod.Namespace == ev.Object.Name {
			k.eps.Relabel(pod.Namespace, pod.Name, k.client.podLabels(pod, ev.Object))
		}
	}
}

// realizedRevision is the policy revision every local endpoint has
// realized: a policy imported at it or before is enforced on this node.
func (k *Module) realizedRevision() uint64 {
	rev := k.policy.Repository().Revision()
	mgr := k.eps.Manager()
	if mgr == nil {
		return 0
	}
	for _, ep := range mgr.List() {
		rev = min(rev, ep.PolicyRevision)
	}
	return rev
}

// policyStatusPatcher writes the policy status reports with merge patches
// of the status subresource.
type policyStatusPatcher struct{ c *Client }

func (p policyStatusPatcher) PatchStatus(ctx context.Context, kind, ns, name string, patch []byte) error {
	td := p.c.clients.Tendril.TendrilV1alpha1()
	var err error
	switch kind {
	case policystatus.KindNetworkPolicy:
		_, err = td.TendrilNetworkPolicies(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	case policystatus.KindClusterwideNetworkPolicy:
		_, err = td.TendrilClusterwideNetworkPolicies().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	default:
		return fmt.Errorf("policy status of unknown kind %q", kind)
	}
	if apierrors.IsNotFound(err) {
		return nil // deleted meanwhile: nothing to report on
	}
	return err
}

// StatusSection is the Kubernetes part of `tendril status`.
func (k *Module) StatusSection() ext.Section {
	s := ext.Section{Title: "Kubernetes"}
	k.client.mu.Lock()
	ver, sel := k.client.serverVersion, k.client.selection
	k.client.mu.Unlock()
	if ver == "" {
		s.Lines = append(s.Lines, ext.Line{Key: "API server", Value: "not connected"})
		return s
	}
	s.Lines = append(s.Lines, ext.Line{Key: "API server", Value: "Ok " + ver})
	cidrs := []string{}
	for _, p := range []struct {
		pfx  netip.Prefix
		from node.CIDRSource
	}{{sel.IPv4, sel.IPv4From}, {sel.IPv6, sel.IPv6From}} {
		if p.pfx.IsValid() {
			cidrs = append(cidrs, fmt.Sprintf("%s (from %s)", p.pfx, p.from))
		}
	}
	s.Lines = append(s.Lines, ext.Line{Key: "Pod CIDRs", Value: strings.Join(cidrs, ", ")})
	if k.poolHealth != nil && k.client.watchers != nil {
		tn, _ := k.client.watchers.TendrilNodes.Get(k.settings.NodeName)
		ok, msg := node.ClusterPoolState(tn)
		if !ok {
			msg = "POOL EXHAUSTED: " + msg + " (tendril-operator found no free CIDR; widen --cluster-pool-ipv4/6-cidr)"
		}
		s.Lines = append(s.Lines, ext.Line{Key: "Cluster pool", Value: cmp.Or(msg, "no PodCIDRsAllocated condition yet")})
	}
	if k.client.writer != nil {
		st := k.client.writer.Status()
		v := "pending"
		switch {
		case st.Done:
			v = fmt.Sprintf("done (%d attempts)", st.Attempts)
		case st.LastErr != nil:
			v = fmt.Sprintf("retrying (%d attempts): %v", st.Attempts, st.LastErr)
		}
		s.Lines = append(s.Lines, ext.Line{Key: "Node write-back", Value: v})
	}
	if k.nodes != nil {
		txn := k.db.ReadTxn()
		r := dbinspect.CountStatus(k.peers.All(txn), func(p *nodemanager.Peer) reconciler.Status { return p.Status })
		v := fmt.Sprintf("%d peers", r.Objects)
		if r.Errors > 0 {
			v += fmt.Sprintf(", %d failing: %s", r.Errors, r.LastError)
		}
		rr := dbinspect.CountStatus(k.routes.All(txn), func(r *nodemanager.Route) reconciler.Status { return r.Status })
		if rr.Errors > 0 {
			v += fmt.Sprintf(", %d routes failing: %s", rr.Errors, rr.LastError)
		}
		s.Lines = append(s.Lines, ext.Line{Key: "Nodes", Value: v})
		if rej := k.nodes.Rejected(); len(rej) > 0 {
			var parts []string
			for _, name := range slices.Sorted(maps.Keys(rej)) {
				parts = append(parts, name+": "+joinRejections(rej[name]))
			}
			s.Lines = append(s.Lines, ext.Line{Key: "Refused pod CIDRs", Value: strings.Join(parts, "; ")})
		}
	}
	if k.client.watchers != nil {
		synced := 0
		st := k.client.watchers.Status()
		for _, r := range st {
			if r.Synced {
				synced++
			}
		}
		s.Lines = append(s.Lines, ext.Line{Key: "Resources", Value: fmt.Sprintf("%d/%d synced", synced, len(st))})
		for _, r := range st {
			v := fmt.Sprintf("synced, %d objects", r.Objects)
			if !r.Synced {
				v = "not synced"
			}
			s.Lines = append(s.Lines, ext.Line{Key: "  " + r.Name, Value: v})
		}
	}
	return s
}

// Model is the Kubernetes line of the v1 status.
func (k *Module) Model() *models.K8sStatus {
	k.client.mu.Lock()
	ver := k.client.serverVersion
	k.client.mu.Unlock()
	if ver == "" {
		return &models.K8sStatus{State: models.StatusStateWarning, Msg: "API server not reached yet"}
	}
	st := &models.K8sStatus{State: models.StatusStateOk, Msg: "API server " + ver}
	if k.client.watchers != nil {
		for _, r := range k.client.watchers.Status() {
			st.K8sAPIVersions = append(st.K8sAPIVersions, r.Name)
			if !r.Synced {
				st.State, st.Msg = models.StatusStateWarning, "waiting for the caches to sync"
			}
		}
	}
	return st
}

func joinRejections(rs []nodemanager.Rejection) string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.String()
	}
	return strings.Join(out, ", ")
}

// registry is the metrics' registry (nil: none).
func registry(m *metrics.Server) prometheus.Registerer {
	if m == nil {
		return nil
	}
	return m.Registry
}

// policyStatusOf is this node's report on each Tendril policy, the cell's
// typed output (its reconciler writes it into the objects' status). Nil
// without Kubernetes.
func policyStatusOf(k *Module) statedb.Table[*policystatus.Report] {
	if k == nil || k.status == nil {
		return nil
	}
	return k.status.Table()
}

// endpointPublicationsOf is the TendrilEndpoints this node wants in the API
// server, the cell's typed output (its reconciler writes them). Nil
// without Kubernetes.
func endpointPublicationsOf(k *Module) statedb.Table[*endpointpub.Desired] {
	if k == nil || k.publisher == nil {
		return nil
	}
	return k.publisher.Table()
}

// onLocalLabels asks for a policy pass when this node's labels change:
// host policies select the node by them (docs/host-firewall.md). Other
// updates of the Node (its status, every heartbeat) trigger nothing.
func (k *Module) onLocalLabels(ev watchers.Event[*corev1.Node]) {
	if ev.Key != k.settings.NodeName || ev.Kind == watchers.Synced {
		return
	}
	var labels map[string]string
	if ev.Object != nil && ev.Kind != watchers.Delete {
		labels = ev.Object.Labels
	}
	k.mu.Lock()
	changed := !maps.Equal(k.localLabels, labels)
	k.localLabels = maps.Clone(labels)
	k.mu.Unlock()
	if changed && k.policy != nil {
		k.policy.TriggerRegeneration()
	}
}
