// Package kvsync publishes Kubernetes Services (with their backends from
// EndpointSlices) and Nodes (with their TendrilNode pod CIDRs) into the
// kvstore, on the leader, as the seed's operator does
// (startSynchronizingServices through a shared store, runNodeWatcher): the
// base for clusters that share state through etcd. Keys are the
// operator's local keys of two shared stores, bound to its session lease:
//
//	tendril/state/services/v1/<cluster>/<namespace>/<name> → ClusterService (JSON)
//	tendril/state/nodes/v1/<cluster>/<name>               → ClusterNode (JSON)
//
// A term starts with a full sync and removes keys under the prefixes that
// no object stands for (left by a previous leader); then only changed
// objects are written. Watch callbacks only mark keys dirty; the writes
// happen in the job.
package kvsync

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/operator/kvstoreclient"
	"github.com/tendril-net/tendril/pkg/operator/leader"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/operator/status"
)

// Prefixes of the shared stores.
const (
	ServicesPrefix = kvstore.StatePrefix + "services/v1/"
	NodesPrefix    = kvstore.StatePrefix + "nodes/v1/"
)

// AnnotationGlobal marks a Service shared with other clusters (Cilium's
// service.cilium.io/global is honoured too).
const AnnotationGlobal = "service.tendril.io/global"

// Config of the sync.
type Config struct {
	ClusterName         string
	SynchronizeServices bool
	SynchronizeNodes    bool
}

// DefaultConfig syncs both when a kvstore is configured.
func DefaultConfig() Config {
	return Config{ClusterName: "default", SynchronizeServices: true, SynchronizeNodes: true}
}

// Flags registers the options.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("cluster-name", c.ClusterName, "Name of this cluster in the kvstore keys")
	fs.Bool("synchronize-services", c.SynchronizeServices, "Publish Services and their backends into the kvstore (with --kvstore)")
	fs.Bool("synchronize-nodes", c.SynchronizeNodes, "Publish Nodes into the kvstore (with --kvstore)")
}

// Port is a service or backend port.
type Port struct {
	Port     int32  `json:"port"`
	Protocol string `json:"protocol"`
}

// ClusterService is a Service as published.
type ClusterService struct {
	Cluster   string `json:"cluster"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Frontends: ClusterIPs → port name → port.
	Frontends map[string]map[string]Port `json:"frontends"`
	// Backends: ready endpoint addresses → port name → port.
	Backends map[string]map[string]Port `json:"backends"`
	Labels   map[string]string          `json:"labels,omitempty"`
	Selector map[string]string          `json:"selector,omitempty"`
	Shared   bool                       `json:"shared"`
}

// NodeAddress is one address of a node.
type NodeAddress struct {
	Type string `json:"type"`
	IP   string `json:"ip"`
}

// ClusterNode is a Node as published.
type ClusterNode struct {
	Cluster   string        `json:"cluster"`
	Name      string        `json:"name"`
	Addresses []NodeAddress `json:"addresses"`
	PodCIDRs  []string      `json:"podCIDRs,omitempty"`
}

// Syncer publishes the objects.
type Syncer struct {
	cfg      Config
	log      *slog.Logger
	kv       *kvstoreclient.Client
	res      *resources.Resources
	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister

	mu      sync.Mutex
	dirtySv map[string]bool
	dirtyNd map[string]bool
	poke    chan struct{}
}

// Cell registers the sync as a leader job when a kvstore is configured.
var Cell = cell.Module("kvstore-sync", "Services and nodes into the kvstore",
	cell.Config(DefaultConfig()),
	cell.Invoke(register),
)

type params struct {
	cell.In
	Config    Config
	Log       *slog.Logger
	KVStore   *kvstoreclient.Client
	Resources *resources.Resources
	Elector   *leader.Elector
	Reports   *status.Reports
}

func register(p params) error {
	if !p.KVStore.Enabled() || (!p.Config.SynchronizeServices && !p.Config.SynchronizeNodes) {
		return nil
	}
	s, err := New(p.Config, p.Log, p.KVStore, p.Resources)
	if err != nil {
		return err
	}
	p.Elector.Add("kvstore-sync", func(ctx context.Context) error { return s.Run(ctx, p.Reports) })
	return nil
}

// New subscribes to the objects' informers; call it before the caches
// start (while the hive is built).
func New(cfg Config, log *slog.Logger, kv *kvstoreclient.Client, res *resources.Resources) (*Syncer, error) {
	if strings.ContainsAny(cfg.ClusterName, "/ ") || cfg.ClusterName == "" {
		return nil, fmt.Errorf("cluster-name %q: must be non-empty, without '/' or spaces", cfg.ClusterName)
	}
	s := &Syncer{cfg: cfg, log: log, kv: kv, res: res, dirtySv: map[string]bool{}, dirtyNd: map[string]bool{}, poke: make(chan struct{}, 1)}
	if cfg.SynchronizeServices {
		sv := res.CoreFactory.Core().V1().Services()
		es := res.CoreFactory.Discovery().V1().EndpointSlices()
		s.services, s.slices = sv.Lister(), es.Lister()
		if _, err := sv.Informer().AddEventHandler(s.handler(s.markService)); err != nil {
			return nil, err
		}
		if _, err := es.Informer().AddEventHandler(s.handler(s.markSlice)); err != nil {
			return nil, err
		}
	}
	if cfg.SynchronizeNodes {
		if _, err := res.NodeInformer.AddEventHandler(s.handler(s.markNode)); err != nil {
			return nil, err
		}
		if _, err := res.TNodeInformer.AddEventHandler(s.handler(s.markNode)); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Syncer) handler(mark func(any)) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{AddFunc: mark, UpdateFunc: func(_, o any) { mark(o) }, DeleteFunc: mark}
}

func objectKey(obj any) (string, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	k, err := cache.MetaNamespaceKeyFunc(obj)
	return k, err == nil
}

// Which dirty set a key goes to.
const (
	services = true
	nodes    = false
)

func (s *Syncer) mark(service bool, key string) {
	s.mu.Lock()
	if service {
		s.dirtySv[key] = true
	} else {
		s.dirtyNd[key] = true
	}
	s.mu.Unlock()
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

func (s *Syncer) markService(obj any) {
	if k, ok := objectKey(obj); ok {
		s.mark(services, k)
	}
}

func (s *Syncer) markSlice(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if es, ok := obj.(*discoveryv1.EndpointSlice); ok {
		if svc := es.Labels[discoveryv1.LabelServiceName]; svc != "" {
			s.mark(services, es.Namespace+"/"+svc)
		}
	}
}

func (s *Syncer) markNode(obj any) {
	if k, ok := objectKey(obj); ok {
		s.mark(nodes, k)
	}
}

func (s *Syncer) take() (sv, nd []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.dirtySv {
		sv = append(sv, k)
	}
	for k := range s.dirtyNd {
		nd = append(nd, k)
	}
	s.dirtySv, s.dirtyNd = map[string]bool{}, map[string]bool{}
	return sv, nd
}

// Run publishes for one term: it joins the shared stores, writes every
// object, removes keys no object stands for, then follows changes.
func (s *Syncer) Run(ctx context.Context, reports *status.Reports) error {
	kv := s.kv.KV()
	if kv == nil {
		return fmt.Errorf("kvstore not connected")
	}
	var svcStore, nodeStore *kvstore.SharedStore
	var err error
	if s.cfg.SynchronizeServices {
		if svcStore, err = kvstore.JoinSharedStore(kv, kvstore.SharedStoreConfig{Prefix: ServicesPrefix}, s.log); err != nil {
			return err
		}
		defer func() { _ = svcStore.Close(context.WithoutCancel(ctx)) }()
	}
	if s.cfg.SynchronizeNodes {
		if nodeStore, err = kvstore.JoinSharedStore(kv, kvstore.SharedStoreConfig{Prefix: NodesPrefix}, s.log); err != nil {
			return err
		}
		defer func() { _ = nodeStore.Close(context.WithoutCancel(ctx)) }()
	}
	// Full sync: everything dirty, then the stale keys.
	if svcStore != nil {
		all, _ := s.services.List(labels.Everything())
		for _, sv := range all {
			s.mark(services, sv.Namespace+"/"+sv.Name)
		}
	}
	if nodeStore != nil {
		all, _ := s.res.Nodes.List(labels.Everything())
		for _, n := range all {
			s.mark(nodes, n.Name)
		}
	}
	pruned := false
	for {
		sv, nd := s.take()
		for _, k := range sv {
			if err := s.syncService(ctx, svcStore, k); err != nil && ctx.Err() == nil {
				s.log.Warn("Publishing a service", "service", k, "error", err)
				s.mark(services, k)
			}
		}
		for _, k := range nd {
			if err := s.syncNode(ctx, nodeStore, k); err != nil && ctx.Err() == nil {
				s.log.Warn("Publishing a node", "node", k, "error", err)
				s.mark(nodes, k)
			}
		}
		if !pruned {
			if err := s.prune(ctx, kv, map[string]*kvstore.SharedStore{ServicesPrefix: svcStore, NodesPrefix: nodeStore}); err != nil {
				return err
			}
			pruned = true
		}
		n := 0
		if svcStore != nil {
			n += len(svcStore.LocalKeys())
		}
		if nodeStore != nil {
			n += len(nodeStore.LocalKeys())
		}
		reports.Set("kvstore-sync", fmt.Sprintf("%d keys published", n))
		select {
		case <-ctx.Done():
			return nil
		case <-s.poke:
		}
	}
}

// prune deletes the keys under the prefixes that this term does not
// publish (a previous leader's, for objects gone meanwhile).
func (s *Syncer) prune(ctx context.Context, kv *kvstore.Client, stores map[string]*kvstore.SharedStore) error {
	for prefix, st := range stores {
		if st == nil {
			continue
		}
		select {
		case <-st.Synced():
		case <-ctx.Done():
			return nil
		}
		local := map[string]bool{}
		for _, k := range st.LocalKeys() {
			local[k] = true
		}
		for name := range st.List() {
			if local[name] || !strings.HasPrefix(name, s.cfg.ClusterName+"/") {
				continue
			}
			if err := kv.Delete(ctx, prefix+name); err != nil {
				return fmt.Errorf("remove stale key %s: %w", prefix+name, err)
			}
			s.log.Info("Removed a stale kvstore key", "key", prefix+name)
		}
	}
	return nil
}

func (s *Syncer) syncService(ctx context.Context, st *kvstore.SharedStore, key string) error {
	ns, name, _ := strings.Cut(key, "/")
	storeKey := s.cfg.ClusterName + "/" + ns + "/" + name
	svc, err := s.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return st.DeleteLocal(ctx, storeKey)
	}
	if err != nil {
		return err
	}
	sel, _ := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: name}).Requirements()
	slices, err := s.slices.EndpointSlices(ns).List(labels.NewSelector().Add(sel...))
	if err != nil {
		return err
	}
	b, err := json.Marshal(s.clusterService(svc, slices))
	if err != nil {
		return err
	}
	return st.UpsertLocal(ctx, storeKey, b)
}

func (s *Syncer) clusterService(svc *corev1.Service, slices []*discoveryv1.EndpointSlice) ClusterService {
	cs := ClusterService{Cluster: s.cfg.ClusterName, Namespace: svc.Namespace, Name: svc.Name,
		Frontends: map[string]map[string]Port{}, Backends: map[string]map[string]Port{},
		Labels: svc.Labels, Selector: svc.Spec.Selector,
		Shared: svc.Annotations[AnnotationGlobal] == "true" || svc.Annotations["service.cilium.io/global"] == "true"}
	for _, ip := range svc.Spec.ClusterIPs {
		if ip == "" || ip == corev1.ClusterIPNone {
			continue
		}
		ports := map[string]Port{}
		for _, p := range svc.Spec.Ports {
			ports[p.Name] = Port{Port: p.Port, Protocol: string(p.Protocol)}
		}
		cs.Frontends[ip] = ports
	}
	sort.Slice(slices, func(i, j int) bool { return slices[i].Name < slices[j].Name })
	for _, es := range slices {
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, addr := range ep.Addresses {
				ports := cs.Backends[addr]
				if ports == nil {
					ports = map[string]Port{}
					cs.Backends[addr] = ports
				}
				for _, p := range es.Ports {
					if p.Port == nil {
						continue
					}
					proto := "TCP"
					if p.Protocol != nil {
						proto = string(*p.Protocol)
					}
					name := ""
					if p.Name != nil {
						name = *p.Name
					}
					ports[name] = Port{Port: *p.Port, Protocol: proto}
				}
			}
		}
	}
	return cs
}

func (s *Syncer) syncNode(ctx context.Context, st *kvstore.SharedStore, name string) error {
	storeKey := s.cfg.ClusterName + "/" + name
	n, err := s.res.Nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return st.DeleteLocal(ctx, storeKey)
	}
	if err != nil {
		return err
	}
	cn := ClusterNode{Cluster: s.cfg.ClusterName, Name: name}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
			cn.Addresses = append(cn.Addresses, NodeAddress{Type: string(a.Type), IP: a.Address})
		}
	}
	if tn, err := s.res.TNodes.Get(name); err == nil {
		for _, a := range tn.Spec.Addresses {
			if a.Type == "TendrilInternalIP" {
				cn.Addresses = append(cn.Addresses, NodeAddress{Type: a.Type, IP: a.IP})
			}
		}
		cn.PodCIDRs = tn.Spec.IPAM.PodCIDRs
	}
	if len(cn.PodCIDRs) == 0 {
		cn.PodCIDRs = n.Spec.PodCIDRs
	}
	b, err := json.Marshal(cn)
	if err != nil {
		return err
	}
	return st.UpsertLocal(ctx, storeKey, b)
}
