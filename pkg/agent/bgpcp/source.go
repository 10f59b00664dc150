package bgpcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilinformers "github.com/tendril-net/tendril/pkg/k8s/client/informers/externalversions"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
)

// Snapshot is the cluster's side of the input: this node's Node, the
// BGP objects and the pools.
type Snapshot struct {
	// NodeFound: this node's Node is in the cache.
	NodeFound  bool
	NodeLabels map[string]string
	// RouterID is the node's first IPv4 InternalIP (else ExternalIP).
	RouterID       netip.Addr
	ClusterConfigs []*v1alpha1.TendrilBGPClusterConfig
	PeerConfigs    []*v1alpha1.TendrilBGPPeerConfig
	Adverts        []*v1alpha1.TendrilBGPAdvertisement
	Pools          []*v1alpha1.TendrilLoadBalancerIPPool
	// Passwords are the "password" keys of the Secrets of the BGP secrets
	// namespace, by Secret name.
	Passwords map[string]string
	// ServiceCIDRs are the cluster's, from its ServiceCIDR objects (the
	// API server allocates cluster IPs there): where a cluster IP may be
	// announced.
	ServiceCIDRs []netip.Prefix
}

// Source starts following the cluster (once the agent is connected):
// read returns the current Snapshot, changed receives after each change,
// until ctx ends; writeStatus applies this node's entry of a cluster
// config's status.
type Source func(ctx context.Context) (read func() Snapshot, changed <-chan struct{}, writeStatus StatusWriter, err error)

// StatusWriter applies this node's entry of config's status (nil st
// removes it).
type StatusWriter func(ctx context.Context, config string, st *v1alpha1.BGPNodeStatus) error

// kubeSource follows the Node and the pools in the agent's watchers and
// the three BGP kinds in informers of their own (started only with the
// control plane on, so an agent without it lists none of them).
func kubeSource(k *agentk8s.Client, node, secretsNamespace string) Source {
	if k == nil {
		return nil
	}
	return func(ctx context.Context) (func() Snapshot, <-chan struct{}, StatusWriter, error) {
		w := k.Watchers()
		if w == nil {
			return nil, nil, nil, errors.New("not connected to Kubernetes")
		}
		changed := make(chan struct{}, 1)
		poke := func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		}
		unPools, err := w.TendrilLoadBalancerIPPools.Subscribe(func(watchers.Event[*v1alpha1.TendrilLoadBalancerIPPool]) { poke() })
		if err != nil {
			return nil, nil, nil, fmt.Errorf("follow %s: %w", v1alpha1.ResourceLoadBalancerIPPools, err)
		}
		unNodes, err := w.Nodes.Subscribe(func(ev watchers.Event[*corev1.Node]) {
			if ev.Kind == watchers.Synced || ev.Key == node {
				poke()
			}
		})
		if err != nil {
			unPools()
			return nil, nil, nil, fmt.Errorf("follow nodes: %w", err)
		}
		clients := k.Clients()
		f := tendrilinformers.NewSharedInformerFactoryWithOptions(clients.Tendril, 0, tendrilinformers.WithTransform(k8s.StripManagedFields))
		v := f.Tendril().V1alpha1()
		ccs, pcs, ads := v.TendrilBGPClusterConfigs(), v.TendrilBGPPeerConfigs(), v.TendrilBGPAdvertisements()
		handler := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { poke() }, UpdateFunc: func(any, any) { poke() }, DeleteFunc: func(any) { poke() }}
		// Secrets of the one namespace peer configs may name, and only
		// while the control plane runs: the agent holds no other Secret.
		sf := informers.NewSharedInformerFactoryWithOptions(clients.Core, 0, informers.WithNamespace(secretsNamespace),
			informers.WithTransform(k8s.StripManagedFields))
		secrets := sf.Core().V1().Secrets()
		cf := informers.NewSharedInformerFactoryWithOptions(clients.Core, 0, informers.WithTransform(k8s.StripManagedFields))
		serviceCIDRs := cf.Networking().V1().ServiceCIDRs()
		for _, inf := range []cache.SharedIndexInformer{ccs.Informer(), pcs.Informer(), ads.Informer(), secrets.Informer(), serviceCIDRs.Informer()} {
			if _, err := inf.AddEventHandler(handler); err != nil {
				unPools()
				unNodes()
				return nil, nil, nil, fmt.Errorf("follow the BGP objects: %w", err)
			}
		}
		f.Start(ctx.Done())
		sf.Start(ctx.Done())
		cf.Start(ctx.Done())
		context.AfterFunc(ctx, func() { unPools(); unNodes(); f.Shutdown(); sf.Shutdown(); cf.Shutdown() })
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return nil, nil, nil, fmt.Errorf("BGP objects: %s not synced", typ)
			}
		}
		for typ, ok := range sf.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return nil, nil, nil, fmt.Errorf("BGP secrets in %s: %s not synced", secretsNamespace, typ)
			}
		}
		for typ, ok := range cf.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return nil, nil, nil, fmt.Errorf("ServiceCIDRs: %s not synced", typ)
			}
		}
		read := func() Snapshot {
			var s Snapshot
			if n, ok := w.Nodes.Get(node); ok {
				s.NodeFound, s.NodeLabels, s.RouterID = true, n.Labels, routerID(n)
			}
			s.ClusterConfigs, _ = ccs.Lister().List(labels.Everything())
			s.PeerConfigs, _ = pcs.Lister().List(labels.Everything())
			s.Adverts, _ = ads.Lister().List(labels.Everything())
			s.Pools = w.TendrilLoadBalancerIPPools.List()
			list, _ := secrets.Lister().Secrets(secretsNamespace).List(labels.Everything())
			s.Passwords = map[string]string{}
			for _, sec := range list {
				if pw, ok := sec.Data["password"]; ok {
					s.Passwords[sec.Name] = string(pw)
				}
			}
			cidrs, _ := serviceCIDRs.Lister().List(labels.Everything())
			for _, c := range cidrs {
				for _, v := range c.Spec.CIDRs {
					if p, err := netip.ParsePrefix(v); err == nil {
						s.ServiceCIDRs = append(s.ServiceCIDRs, p.Masked())
					}
				}
			}
			return s
		}
		write := func(ctx context.Context, config string, st *v1alpha1.BGPNodeStatus) error {
			body := map[string]any{
				"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": "TendrilBGPClusterConfig",
				"metadata": map[string]any{"name": config},
				"status":   map[string]any{"nodes": []*v1alpha1.BGPNodeStatus{}},
			}
			if st != nil {
				body["status"] = map[string]any{"nodes": []*v1alpha1.BGPNodeStatus{st}}
			}
			b, err := json.Marshal(body)
			if err != nil {
				return err
			}
			// Server-side apply with a field manager per node: each agent
			// owns its own entry of status.nodes (a list map by node), and
			// applying an empty list drops it.
			_, err = clients.Tendril.TendrilV1alpha1().TendrilBGPClusterConfigs().Patch(ctx, config, types.ApplyPatchType, b,
				metav1.PatchOptions{FieldManager: "tendril-agent-bgp/" + node, Force: ptrTrue()}, "status")
			if err != nil {
				return fmt.Errorf("write the status of TendrilBGPClusterConfig %s: %w", config, err)
			}
			return nil
		}
		return read, changed, write, nil
	}
}

func ptrTrue() *bool { t := true; return &t }

// routerID is the node's first IPv4 InternalIP, else its first IPv4
// ExternalIP (invalid without either).
func routerID(n *corev1.Node) netip.Addr {
	for _, typ := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if a.Type != typ {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Unmap().Is4() {
				return ip.Unmap()
			}
		}
	}
	return netip.Addr{}
}
