package agent

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"

	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/ipcache"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/policy"
)

// startPublisher publishes every local endpoint of a pod as a
// TendrilEndpoint (and removes it with the endpoint), through a rate
// limited work queue so failed writes are retried.
func (k *kubernetesModule) startPublisher() {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	mgr := k.eps.mgr
	mgr.Subscribe(func(ev endpointmanager.Event) {
		if ev.Endpoint != nil && ev.Endpoint.PodName != "" {
			q.Add(ev.Endpoint.PodNamespace + "/" + ev.Endpoint.PodName)
		}
	})
	for _, ep := range mgr.List() {
		if ep.PodName != "" {
			q.Add(ep.PodNamespace + "/" + ep.PodName)
		}
	}
	k.pubQueue = q
}

// runPublisher writes the queued pods' TendrilEndpoints until ctx ends,
// a failed write retried with backoff.
func (k *kubernetesModule) runPublisher(ctx context.Context, _ cell.Health) error {
	q := k.pubQueue
	// The queue's Get returns quit once it is shut down.
	defer context.AfterFunc(ctx, q.ShutDown)()
	for {
		key, quit := q.Get()
		if quit {
			return nil
		}
		if err := k.publish(key); err != nil {
			k.log.Warn("Publish endpoint; will retry", "pod", key, "error", err)
			q.AddRateLimited(key)
		} else {
			q.Forget(key)
		}
		q.Done(key)
	}
}

func (k *kubernetesModule) localEndpointOf(ns, name string) *endpoint.Endpoint {
	for _, ep := range k.eps.mgr.List() {
		if ep.PodNamespace == ns && ep.PodName == name {
			return ep
		}
	}
	return nil
}

// publish makes the TendrilEndpoint of pod key match the local endpoint.
func (k *kubernetesModule) publish(key string) error {
	ns, name, _ := strings.Cut(key, "/")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := k.client.clients.Tendril.TendrilV1alpha1().TendrilEndpoints(ns)
	ep := k.localEndpointOf(ns, name)
	if ep == nil {
		err := client.Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete TendrilEndpoint %s: %w", key, err)
		}
		return nil
	}
	status := v1alpha1.EndpointStatus{ID: int64(ep.ID), State: string(ep.State),
		Networking: &v1alpha1.EndpointNetworking{NodeIP: k.nodeIP()}}
	pair := v1alpha1.AddressPair{}
	if ep.IPv4.IsValid() {
		pair.IPv4 = ep.IPv4.String()
	}
	if ep.IPv6.IsValid() {
		pair.IPv6 = ep.IPv6.String()
	}
	status.Networking.Addressing = []v1alpha1.AddressPair{pair}
	if ep.Identity != 0 {
		status.Identity = &v1alpha1.EndpointIdentity{ID: int64(ep.Identity), Labels: endpointLabels(ep)}
	}
	for pname, np := range k.client.namedPorts(ep) {
		proto := map[uint8]string{6: "TCP", 17: "UDP", 132: "SCTP"}[np.Proto]
		status.NamedPorts = append(status.NamedPorts, v1alpha1.NamedPort{Name: pname, Port: int32(np.Port), Protocol: proto})
	}
	cur, err := client.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		obj := &v1alpha1.TendrilEndpoint{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Status: status}
		if _, err := client.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create TendrilEndpoint %s: %w", key, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get TendrilEndpoint %s: %w", key, err)
	}
	cur = cur.DeepCopy()
	cur.Status = status
	if _, err := client.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update TendrilEndpoint %s: %w", key, err)
	}
	return nil
}

// onRemoteEndpoint puts other nodes' pod addresses into the ipcache with
// their identities; this node's own endpoints are skipped (the local
// endpoint is the better source for its addresses).
func (k *kubernetesModule) onRemoteEndpoint(ev watchers.Event[*v1alpha1.TendrilEndpoint]) {
	if ev.Kind == watchers.Synced {
		// The listing's claims are queued before this: the ipcache's
		// prune waits until they are in.
		k.remoteEndpointsSynced()
		return
	}
	if k.ipcache == nil {
		return
	}
	st := ev.Object.Status
	if st.Networking == nil || st.Networking.NodeIP == k.nodeIP() {
		return
	}
	var ips []netip.Addr
	for _, p := range st.Networking.Addressing {
		for _, s := range []string{p.IPv4, p.IPv6} {
			if ip, err := netip.ParseAddr(s); err == nil {
				ips = append(ips, ip)
			}
		}
	}
	k.recordRemotePorts(ev)
	k.mu.Lock()
	if k.remote == nil {
		k.remote = map[string][]netip.Addr{}
	}
	old := k.remote[ev.Key]
	if ev.Kind == watchers.Delete || st.Identity == nil || st.Identity.ID == 0 {
		delete(k.remote, ev.Key)
		ips = nil
	} else {
		k.remote[ev.Key] = ips
	}
	k.mu.Unlock()
	// The claims are this object's own: another object claiming one of
	// these addresses (the pod that reuses it) keeps its claim when this
	// one goes.
	ns, name, _ := strings.Cut(ev.Key, "/")
	owner := ipcache.OwnerTendrilEndpoint(ns, name)
	keep := map[netip.Addr]bool{}
	for _, ip := range ips {
		keep[ip] = true
		if k.isLocalAddress(ip) {
			continue
		}
		e := ipcache.Entry{Identity: identity.NumericIdentity(st.Identity.ID), Source: ipcache.SourceKubernetes, Owner: owner,
			Name: ev.Object.Name, Namespace: ev.Object.Namespace}
		e.HostIP, _ = netip.ParseAddr(st.Networking.NodeIP)
		if err := k.ipcache.UpsertRemoteEndpoint(ip, e); err != nil {
			k.log.Warn("ipcache: remote endpoint", "endpoint", ev.Key, "ip", ip, "error", err)
		}
	}
	for _, ip := range old {
		if keep[ip] {
			continue
		}
		// Withdrawn even when the address is local now: the local claim
		// wins anyway, and a claim left behind would resurface when the
		// local endpoint goes.
		if err := k.ipcache.DeleteRemoteEndpoint(ip, ipcache.SourceKubernetes, owner); err != nil {
			k.log.Warn("ipcache: remove remote endpoint", "endpoint", ev.Key, "ip", ip, "error", err)
		}
	}
}

func (k *kubernetesModule) isLocalAddress(ip netip.Addr) bool {
	for _, ep := range k.eps.mgr.List() {
		if ep.IPv4 == ip || ep.IPv6 == ip {
			return true
		}
	}
	return false
}

// remoteNamedPorts are the named ports a remote endpoint publishes.
type remoteNamedPorts struct {
	identity identity.NumericIdentity
	ports    map[string]policy.NamedPort
}

// recordRemotePorts keeps other nodes' named ports per endpoint; a change
// triggers a policy regeneration when it may change egress named ports.
func (k *kubernetesModule) recordRemotePorts(ev watchers.Event[*v1alpha1.TendrilEndpoint]) {
	st := ev.Object.Status
	var rp remoteNamedPorts
	if ev.Kind == watchers.Upsert && st.Identity != nil && len(st.NamedPorts) > 0 {
		rp = remoteNamedPorts{identity: identity.NumericIdentity(st.Identity.ID), ports: map[string]policy.NamedPort{}}
		for _, np := range st.NamedPorts {
			proto := uint8(6)
			switch np.Protocol {
			case "UDP":
				proto = 17
			case "SCTP":
				proto = 132
			}
			rp.ports[np.Name] = policy.NamedPort{Port: uint16(np.Port), Proto: proto}
		}
	}
	if k.client.setRemotePorts(ev.Key, rp) {
		k.policy.triggerRegeneration()
	}
}
