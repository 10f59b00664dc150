package agentk8s

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/crdalloc"
	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/k8s/crdinstall"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/node"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy"
	policyk8s "github.com/tendril-net/tendril/pkg/policy/k8s"
	"github.com/tendril-net/tendril/pkg/version"
)

// ClientCell is start step 2: the Kubernetes clients, the API server
// reached, the CRDs installed; it also reads what the later steps need of
// the cluster (this node's Node, pods' labels and named ports).
var ClientCell = cell.Module("k8s-client", "Kubernetes clients CRDs and the read side of the caches",
	cell.Provide(lifecycle.Check(Config.validate)),
	cell.Provide(lifecycle.Build[*Client]),
	cell.Config(DefaultConfig()),
	cell.Provide(NewClient),
)

// Client is the agent's Kubernetes client side; nil in standalone mode.
type Client struct {
	cfg         Config
	settings    settings
	log         *slog.Logger
	root        cell.RootLogger
	identities  identity.Allocator
	labelFilter *labels.Filter

	clients  *k8s.Clients
	watchers *watchers.Watchers
	writer   *node.Writer

	mu            sync.Mutex
	serverVersion string
	nodeObj       *corev1.Node
	selection     node.Selection
	// remotePorts are other nodes' pods' named ports by TendrilEndpoint
	// key, for egress rules naming a remote destination's port.
	remotePorts map[string]remoteNamedPorts
}

// ClientParams are the client's dependencies.
type ClientParams struct {
	cell.In

	Config      Config
	Node        option.LocalNode
	Endpoints   agentendpoints.Config
	Log         *slog.Logger
	Root        cell.RootLogger
	Lifecycle   cell.Lifecycle
	Steps       *lifecycle.Steps
	Identities  identity.Allocator
	LabelFilter *labels.Filter
}

// NewClient is the client (nil without an API server configured); its
// step connects.
func NewClient(p ClientParams) *Client {
	if !p.Config.Client.Enabled() {
		return nil
	}
	c := &Client{cfg: p.Config, settings: settingsOf(p.Node, p.Endpoints), log: p.Log, root: p.Root, identities: p.Identities, labelFilter: p.LabelFilter}
	p.Steps.Append(p.Lifecycle, "k8s-client", c.connect, nil)
	return c
}

// connect is start step 2: build the clients, reach the API server
// (retrying until the cache-sync timeout), install or update the CRDs.
func (k *Client) connect(ctx context.Context) error {
	c, err := k8s.NewClients(k.cfg.Client, "tendril-agent/"+version.Version)
	if err != nil {
		return err
	}
	k.clients = c
	var lastErr error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, k.cfg.CacheSyncTimeout, true, func(context.Context) (bool, error) {
		v, err := c.Core.Discovery().ServerVersion()
		if err != nil {
			lastErr = err
			k.log.Info("Waiting for the Kubernetes API server", "error", err)
			return false, nil
		}
		k.mu.Lock()
		k.serverVersion = v.GitVersion
		k.mu.Unlock()
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("reach the Kubernetes API server: %w (last error: %v)", err, lastErr)
	}
	if k.cfg.InstallCRDs {
		if _, err := crdinstall.Install(ctx, c.Dynamic, logging.For(k.root, "crd-install")); err != nil {
			return err
		}
	}
	if alloc, ok := k.identities.(*crdalloc.Allocator); ok {
		alloc.SetClient(c.Tendril)
		alloc.SetNode(k.settings.NodeName)
	}
	k.watchers = watchers.New(c, k.settings.NodeName, logging.For(k.root, "k8s-watchers"))
	k.writer = node.NewWriter(c.Core, c.Tendril, 10*time.Second, logging.For(k.root, "node-writeback"))
	return nil
}

// SelectPodCIDRs is part of start step 5: wait for this node's Node object
// and pick the pod CIDRs by precedence.
func (k *Client) SelectPodCIDRs(ctx context.Context) (node.Selection, error) {
	n, err := node.WaitForNode(ctx, k.clients.Core, k.settings.NodeName, k.log)
	if err != nil {
		return node.Selection{}, err
	}
	var sel node.Selection
	if k.settings.IPAM == "cluster-pool" {
		sel, err = node.WaitForClusterPoolCIDRs(ctx, k.clients.Tendril, k.settings.NodeName, k.clusterPoolWant(n), k.log)
	} else {
		auto4, auto6 := agentendpoints.AutoPodCIDRs(k.settings.NodeName)
		sel, err = node.SelectPodCIDRs(n, node.Ranges{IPv4: k.settings.IPv4Range, IPv6: k.settings.IPv6Range, AutoIPv4: auto4, AutoIPv6: auto6})
	}
	if err != nil {
		return sel, err
	}
	k.mu.Lock()
	k.nodeObj, k.selection = n, sel
	k.mu.Unlock()
	k.log.Info("Pod CIDRs selected", "ipv4", sel.IPv4, "ipv4-from", sel.IPv4From, "ipv6", sel.IPv6, "ipv6-from", sel.IPv6From)
	return sel, nil
}

// clusterPoolWant is what this node waits for in its TendrilNode: a
// CIDR of each family whose cluster pool the agent is told (the operator
// allocates both in one write, but one pool may be exhausted for a
// while), checked against the rules before use: the pools, the service
// CIDRs, the Node's addresses.
func (k *Client) clusterPoolWant(n *corev1.Node) node.ClusterPoolWant {
	rules, _ := k.cfg.peerRules(nil)
	var addrs []netip.Addr
	for _, a := range node.AddressesOf(n) {
		if ip, err := netip.ParseAddr(a.IP); err == nil {
			addrs = append(addrs, ip)
		}
	}
	return node.ClusterPoolWant{IPv4: len(k.cfg.ClusterPoolIPv4) > 0, IPv6: len(k.cfg.ClusterPoolIPv6) > 0,
		Check: func(cidrs []netip.Prefix) error { return rules.CheckOwn(cidrs, addrs) }}
}

// NodeLabels are this node's labels, for host policies' nodeSelectors:
// the Nodes watcher's cached object once it has one, else the Node read
// at start (nil before either).
func (k *Client) NodeLabels() map[string]string {
	if w := k.watchers; w != nil && w.Nodes != nil {
		if n, ok := w.Nodes.Get(k.settings.NodeName); ok && n != nil {
			return n.Labels
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.nodeObj == nil {
		return nil
	}
	return k.nodeObj.Labels
}

// localPodCIDRsAndAddresses are this node's selected pod CIDRs and its
// Node's addresses (none before the Node was read): what other nodes'
// pod CIDRs must not overlap or contain.
func (k *Client) localPodCIDRsAndAddresses() ([]netip.Prefix, []netip.Addr) {
	k.mu.Lock()
	n, sel := k.nodeObj, k.selection
	k.mu.Unlock()
	var cidrs []netip.Prefix
	for _, p := range []netip.Prefix{sel.IPv4, sel.IPv6} {
		if p.IsValid() {
			cidrs = append(cidrs, p)
		}
	}
	var addrs []netip.Addr
	for _, a := range node.AddressesOf(n) {
		if ip, err := netip.ParseAddr(a.IP); err == nil {
			addrs = append(addrs, ip)
		}
	}
	return cidrs, addrs
}

// internalIP is this node's InternalIP from its Node ("" before the Node
// was read, or without one).
func (k *Client) internalIP() string {
	k.mu.Lock()
	n := k.nodeObj
	k.mu.Unlock()
	if n != nil {
		for _, a := range n.Status.Addresses {
			if a.Type == "InternalIP" {
				return a.Address
			}
		}
	}
	return ""
}

// labelServiceAccount is the label name Cilium gives a pod's service
// account, kept so policies written for Cilium select the same pods here.
const labelServiceAccount = "io.cilium.k8s.policy.serviceaccount"

// podLabels are an endpoint's labels from its pod and the pod's namespace,
// named as Cilium names them; pod labels under the keys the agent sets
// itself are dropped (policyk8s.EndpointLabels), so a pod cannot pose as a
// member of another namespace, and labels the identity filter
// (--identity-labels-*) calls irrelevant are left out, so a rollout's
// pod-template-hash does not give each ReplicaSet its own identity.
func (k *Client) podLabels(pod *corev1.Pod, ns *corev1.Namespace) []string {
	var nsLabels map[string]string
	if ns != nil {
		nsLabels = ns.Labels
	}
	all := policyk8s.EndpointLabels(pod.Namespace, nsLabels, pod.Labels)
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	all = append(all, "k8s:"+labelServiceAccount+"="+sa)
	out := all[:0:0]
	for _, s := range all {
		l, err := labels.Parse(s)
		if err != nil || (k.labelFilter != nil && !k.labelFilter.Relevant(l)) {
			continue
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// NamedPorts returns the named container ports of an endpoint's pod (nil
// when it has no pod in the cache, or without Kubernetes).
func (k *Client) NamedPorts(ep *endpoint.Endpoint) map[string]policy.NamedPort {
	if k == nil || k.watchers == nil || ep.PodName == "" {
		return nil
	}
	pod, ok := k.watchers.Pods.Get(ep.PodNamespace + "/" + ep.PodName)
	if !ok {
		return nil
	}
	return policyk8s.PodNamedPorts(pod)
}

// PodLabels returns the labels of the endpoint's pod, waiting a
// little for the pod to reach the cache (CNI ADD can race the watch event).
func (k *Client) PodLabels(ctx context.Context, ns, name string) ([]string, bool) {
	if k.watchers == nil || ns == "" || name == "" {
		return nil, false
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if pod, ok := k.watchers.Pods.Get(ns + "/" + name); ok {
			nsObj, _ := k.watchers.Namespaces.Get(ns)
			return k.podLabels(pod, nsObj), true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// setRemotePorts records (ports nil: forgets) the named ports of a remote
// endpoint; it reports whether the universe's named ports may change.
func (k *Client) setRemotePorts(key string, rp remoteNamedPorts) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.remotePorts == nil {
		k.remotePorts = map[string]remoteNamedPorts{}
	}
	_, had := k.remotePorts[key]
	if rp.ports == nil {
		delete(k.remotePorts, key)
	} else {
		k.remotePorts[key] = rp
	}
	return had || rp.ports != nil
}

// AddRemoteNamedPorts merges other nodes' named ports into out, per identity.
func (k *Client) AddRemoteNamedPorts(out map[identity.NumericIdentity]map[string]policy.NamedPort) {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, rp := range k.remotePorts {
		if out[rp.identity] == nil {
			out[rp.identity] = map[string]policy.NamedPort{}
		}
		for name, np := range rp.ports {
			out[rp.identity][name] = np
		}
	}
}

// Watchers are the informers and their caches; nil before the client's
// step has connected.
func (k *Client) Watchers() *watchers.Watchers { return k.watchers }

// Clients are the API clients; nil before the client's step.
func (k *Client) Clients() *k8s.Clients { return k.clients }
