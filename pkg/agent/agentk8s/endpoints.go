package agentk8s

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/agent/agentpolicy"
	"github.com/tendril-net/tendril/pkg/dbinspect"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/endpointpub"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/policy"
)

// newEndpointPublisher registers the TendrilEndpoint publisher's table
// and reconciler (jobs of the module's group, after the watchers' step).
// Its prune reads the watcher's cache, and removes only objects that name
// this node's address.
func (k *Module) newEndpointPublisher(p Params) error {
	pub, err := endpointpub.New(endpointpub.Params{DB: p.DB, Jobs: k.jobs, Log: logging.For(k.root, "endpoint-publisher"),
		ModuleID: p.ModuleID, Client: publisherClient{k: k},
		Owned: func(tep *v1alpha1.TendrilEndpoint) bool {
			ip := k.NodeIP()
			return ip != "" && tep.Status.Networking != nil && tep.Status.Networking.NodeIP == ip
		}})
	if err != nil {
		return err
	}
	k.publisher = pub
	p.Inspector.AddReconciled(endpointpub.TableName, func(txn statedb.ReadTxn) dbinspect.Realization {
		return dbinspect.CountStatus(pub.Table().All(txn), func(d *endpointpub.Desired) reconciler.Status { return d.Reconciliation })
	})
	return nil
}

// publisherClient is the publisher's API server: the clientset, made by
// the k8s-client step (after the reconciler is registered), and for the
// prune's list the watcher's cache.
type publisherClient struct{ k *Module }

func (c publisherClient) cs() endpointpub.Clientset {
	return endpointpub.Clientset{CS: c.k.client.clients.Tendril}
}

func (c publisherClient) Get(ctx context.Context, ns, name string) (*v1alpha1.TendrilEndpoint, error) {
	return c.cs().Get(ctx, ns, name)
}

func (c publisherClient) Create(ctx context.Context, obj *v1alpha1.TendrilEndpoint) error {
	return c.cs().Create(ctx, obj)
}

func (c publisherClient) Update(ctx context.Context, obj *v1alpha1.TendrilEndpoint) error {
	return c.cs().Update(ctx, obj)
}

func (c publisherClient) Delete(ctx context.Context, ns, name string) error {
	return c.cs().Delete(ctx, ns, name)
}

func (c publisherClient) List(context.Context) ([]v1alpha1.TendrilEndpoint, error) {
	var out []v1alpha1.TendrilEndpoint
	for _, tep := range c.k.client.watchers.TendrilEndpoints.List() {
		out = append(out, tep.TendrilEndpoint())
	}
	return out, nil
}

// startPublisher publishes every local endpoint of a pod as a
// TendrilEndpoint (and removes it with the endpoint): each endpoint event
// writes the desired object to the publisher's table in one short
// transaction, and its reconciler talks to the API server. The restored
// endpoints are in once this returns: the prune may run.
func (k *Module) startPublisher() {
	mgr := k.eps.Manager()
	mgr.Subscribe(func(ev endpointmanager.Event) {
		if ev.Endpoint != nil && ev.Endpoint.PodName != "" {
			k.publish(ev.Endpoint.PodNamespace, ev.Endpoint.PodName)
		}
	})
	for _, ep := range mgr.List() {
		if ep.PodName != "" {
			k.publish(ep.PodNamespace, ep.PodName)
		}
	}
	k.publisher.MarkRestored()
}

func (k *Module) localEndpointOf(ns, name string) *endpoint.Endpoint {
	for _, ep := range k.eps.Manager().List() {
		if ep.PodNamespace == ns && ep.PodName == name {
			return ep
		}
	}
	return nil
}

// publish records the TendrilEndpoint the pod should have as its local
// endpoint is now (the event may be older than a later change), or none.
func (k *Module) publish(ns, name string) {
	ep := k.localEndpointOf(ns, name)
	var err error
	if ep == nil {
		err = k.publisher.Delete(ns, name)
	} else {
		err = k.publisher.Set(ns, name, k.endpointStatus(ep))
	}
	if err != nil {
		k.log.Error("Record the TendrilEndpoint to publish", "pod", ns+"/"+name, "error", err)
	}
}

// endpointStatus is the TendrilEndpoint status of a local endpoint.
func (k *Module) endpointStatus(ep *endpoint.Endpoint) v1alpha1.EndpointStatus {
	status := v1alpha1.EndpointStatus{ID: int64(ep.ID), State: string(ep.State),
		Networking: &v1alpha1.EndpointNetworking{NodeIP: k.NodeIP()}}
	pair := v1alpha1.AddressPair{}
	if ep.IPv4.IsValid() {
		pair.IPv4 = ep.IPv4.String()
	}
	if ep.IPv6.IsValid() {
		pair.IPv6 = ep.IPv6.String()
	}
	status.Networking.Addressing = []v1alpha1.AddressPair{pair}
	if ep.Identity != 0 {
		status.Identity = &v1alpha1.EndpointIdentity{ID: int64(ep.Identity), Labels: agentpolicy.EndpointLabels(ep)}
	}
	ports := k.client.NamedPorts(ep)
	for _, pname := range slices.Sorted(maps.Keys(ports)) {
		np := ports[pname]
		proto := map[uint8]string{6: "TCP", 17: "UDP", 132: "SCTP"}[np.Proto]
		status.NamedPorts = append(status.NamedPorts, v1alpha1.NamedPort{Name: pname, Port: int32(np.Port), Protocol: proto})
	}
	return status
}

// onRemoteEndpoint puts other nodes' pod addresses into the ipcache with
// their identities; this node's own endpoints are skipped (the local
// endpoint is the better source for its addresses).
func (k *Module) onRemoteEndpoint(ev watchers.Event[*k8s.CachedEndpoint]) {
	if ev.Kind == watchers.Synced {
		// The listing's claims are queued before this: the ipcache's
		// prune waits until they are in, and until the gate judged them
		// against the nodes' listing.
		if k.gate != nil {
			k.gate.Synced(k.remoteEndpointsSynced)
		}
		return
	}
	if k.ipcache == nil {
		return
	}
	nodeIP := k.NodeIP()
	if st := ev.Object.Status; st.Networking == nil || st.Networking.NodeIP == nodeIP {
		return
	}
	k.recordRemotePorts(ev)
	k.claimRemote(ev, nodeIP, k.isLocalAddress)
}

// claimRemote hands the gate the claims of another node's TendrilEndpoint
// (localNodeIP: this node's address, whose objects are skipped; isLocal:
// an address of a local endpoint, which the local claim covers). The gate
// holds each object's claims by owner, so nothing is kept here: the
// object's addresses no longer listed are withdrawn from what the gate
// holds for it.
func (k *Module) claimRemote(ev watchers.Event[*k8s.CachedEndpoint], localNodeIP string, isLocal func(netip.Addr) bool) {
	st := ev.Object.Status
	if st.Networking == nil || st.Networking.NodeIP == localNodeIP {
		return
	}
	// One address per family in a pair, one pair in the common case: a
	// fixed array keeps the usual one or two off the heap.
	var buf [2]netip.Addr
	ips := buf[:0]
	if ev.Kind != watchers.Delete && st.Identity != nil && st.Identity.ID != 0 {
		for _, p := range st.Networking.Addressing {
			for _, s := range []string{p.IPv4, p.IPv6} {
				if ip, err := netip.ParseAddr(s); err == nil {
					ips = append(ips, ip)
				}
			}
		}
	}
	// The claims are this object's own: another object claiming one of
	// these addresses (the pod that reuses it) keeps its claim when this
	// one goes. They pass the gate: a cluster-scope identity, addresses
	// inside the accepted pod CIDRs of the node the status names.
	ns, name, _ := strings.Cut(ev.Key, "/")
	owner := ipcache.OwnerTendrilEndpoint(ns, name)
	nodeIP, _ := netip.ParseAddr(st.Networking.NodeIP)
	for _, ip := range ips {
		if isLocal(ip) {
			continue
		}
		k.gate.Upsert(nodemanager.Claim{IP: ip, Identity: st.Identity.ID, NodeIP: nodeIP,
			Entry: ipcache.Entry{Source: ipcache.SourceKubernetes, Owner: owner, Name: ev.Object.Name,
				Namespace: ev.Object.Namespace, HostIP: nodeIP}})
	}
	// Withdrawn even when the address is local now: the local claim wins
	// anyway, and a claim left behind would resurface when the local
	// endpoint goes. An address still listed keeps its claim (a local one
	// included, as before).
	k.gate.Retain(ipcache.SourceKubernetes, owner, func(ip netip.Addr) bool { return slices.Contains(ips, ip) })
}

func (k *Module) isLocalAddress(ip netip.Addr) bool {
	for _, ep := range k.eps.Manager().List() {
		if ep.IPv4 == ip || ep.IPv6 == ip {
			return true
		}
	}
	return false
}

var errNoIdentity = errors.New("no identity")

// remoteNamedPorts are the named ports a remote endpoint publishes.
type remoteNamedPorts struct {
	identity identity.NumericIdentity
	ports    map[string]policy.NamedPort
}

// recordRemotePorts keeps other nodes' named ports per endpoint; a change
// triggers a policy regeneration when it may change egress named ports.
func (k *Module) recordRemotePorts(ev watchers.Event[*k8s.CachedEndpoint]) {
	st := ev.Object.Status
	var rp remoteNamedPorts
	var id identity.NumericIdentity
	var idErr error = errNoIdentity
	if st.Identity != nil {
		id, idErr = nodemanager.CheckIdentity(st.Identity.ID)
	}
	// Named ports of an identity another node may not claim are ignored.
	if ev.Kind == watchers.Upsert && idErr == nil && len(st.NamedPorts) > 0 {
		rp = remoteNamedPorts{identity: id, ports: map[string]policy.NamedPort{}}
		for _, np := range st.NamedPorts {
			var proto uint8
			switch np.Protocol {
			case "", "TCP":
				proto = 6
			case "UDP":
				proto = 17
			case "SCTP":
				proto = 132
			}
			// Another node wrote these: a port out of range (it wrapped
			// into another port as uint16) or an unknown protocol (it
			// read as TCP) would open a port nobody named.
			if proto == 0 || np.Port < 1 || np.Port > 65535 {
				k.log.Warn("Skipping a remote named port that is not a port", "endpoint", ev.Key, "name", np.Name, "port", np.Port, "protocol", np.Protocol)
				continue
			}
			rp.ports[np.Name] = policy.NamedPort{Port: uint16(np.Port), Proto: proto}
		}
	}
	if k.client.setRemotePorts(ev.Key, rp) {
		k.policy.TriggerRegeneration()
	}
}
