// Package k8ssource turns Kubernetes Services and EndpointSlices
// (discovery/v1) into the load-balancer tables' services and backends. Its
// event handlers only convert and write the tables through a
// loadbalancer.Writer in one short transaction each; the frontends table
// is marked initialized once both kinds have delivered their initial list.
package k8ssource

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/k8scache"
)

// AnnotationLBAlgorithm picks a service's backend selection: "maglev" or
// "random" (the node's default otherwise).
const AnnotationLBAlgorithm = k8scache.AnnotationLBAlgorithm

// ServiceFrom converts a Service (k8scache.ServiceFrom).
func ServiceFrom(s *corev1.Service, defaultMaglev bool) (*loadbalancer.Service, bool, error) {
	return k8scache.ServiceFrom(s, defaultMaglev)
}

// Source feeds the tables from the watchers' events.
type Source struct {
	w             *loadbalancer.Writer
	log           *slog.Logger
	defaultMaglev bool
	// nodePortMin and nodePortMax bound the node ports answered (the
	// agent's --node-port-range; 0, 0: any).
	nodePortMin, nodePortMax uint16
	// externalIPRanges are the ranges a Service's externalIPs may lie in
	// (--service-external-ip-cidrs; empty: any).
	externalIPRanges []netip.Prefix
	// podRanges are the cluster's pod address pools: an external IP in
	// them is no frontend, whatever externalIPRanges say.
	podRanges []netip.Prefix

	mu sync.Mutex
	// sliceOwner remembers each slice's service, so a slice whose label
	// changed or that is deleted is taken out of the right service.
	sliceOwner map[string]loadbalancer.ServiceName
	synced     map[string]bool
	done       func()

	// Events of each kind's initial listing, written in batches once the
	// kind has synced; each is touched only by its kind's subscription
	// (whose calls are serialized).
	pendingServices, pendingSlices []op
	servicesListed, slicesListed   bool
	// The same for this node's pods (their host ports), and which pods
	// have host ports in the tables.
	pendingPods []op
	podsListed  bool
	hostPorts   map[string]bool

	// extMu guards what external IPs are judged against that changes
	// with the Nodes, and the Services they were judged for.
	extMu sync.Mutex
	// nodePodCIDRs are each Node's spec.podCIDRs (the kube-controller-
	// manager's allocations, which a node cannot change once set): pod
	// ranges beside podRanges, known without the pools configured.
	nodePodCIDRs map[string][]netip.Prefix
	// withExternalIPs are the Services naming external IPs, before the
	// external IPs were judged: judged again when a Node's pod CIDRs
	// change.
	withExternalIPs map[loadbalancer.ServiceName]*loadbalancer.Service
}

// NewSource returns a source writing through w; it marks the frontends
// table initialized once services, EndpointSlices, nodes (this node's
// zone and addresses, every node's pod CIDRs), TendrilNodes (their pod
// CIDRs) and this node's pods (host ports) have all synced.
func NewSource(w *loadbalancer.Writer, defaultMaglev bool, log *slog.Logger) *Source {
	return &Source{w: w, log: log, defaultMaglev: defaultMaglev, sliceOwner: map[string]loadbalancer.ServiceName{},
		synced: map[string]bool{}, hostPorts: map[string]bool{}, done: w.RegisterInitializer("k8s-services"),
		nodePodCIDRs: map[string][]netip.Prefix{}, withExternalIPs: map[loadbalancer.ServiceName]*loadbalancer.Service{}}
}

// SetNodePortRange limits the node ports answered to [lo, hi]: a service's
// node port outside it is left out (logged), as it would collide with the
// ports the node's own sockets or masquerade use. Call before the events
// flow.
func (s *Source) SetNodePortRange(lo, hi uint16) {
	s.nodePortMin, s.nodePortMax = lo, hi
}

// SetExternalIPRanges limits the external IPs answered to ranges (empty:
// any, as kube-proxy): anyone who may create a Service writes its
// spec.externalIPs, and an external IP draws the traffic every pod and
// node sends to that address and port (CVE-2020-8554), so an operator
// who knows which addresses are external lists them. Call before the
// events flow.
func (s *Source) SetExternalIPRanges(ranges []netip.Prefix) {
	s.externalIPRanges = ranges
}

// SetPodRanges names the cluster's pod address pools (the agent's
// --cluster-pool-ipv4-cidr and --cluster-pool-ipv6-cidr): an external IP
// inside them is left out. A pod's address is never external, and a
// Service naming one as its external IP would take every connection
// the node's pods and processes make to that pod on the port (the socket
// LB translates external IPs for clients inside the cluster too): one
// tenant's Service would capture another tenant's pod. Call before the
// events flow.
func (s *Source) SetPodRanges(pools []netip.Prefix) {
	s.podRanges = pools
}

// judgedExternalIPs is svc with the external IPs inside the pod ranges
// (the pools and every Node's pod CIDRs) or outside the external ranges
// left out; svc itself is not changed. Called with extMu held.
func (s *Source) judgedExternalIPs(svc *loadbalancer.Service) *loadbalancer.Service {
	if len(svc.ExternalIPs) == 0 {
		return svc
	}
	key := svc.Name.String()
	c := *svc
	c.ExternalIPs = slices.DeleteFunc(slices.Clone(svc.ExternalIPs), func(a netip.Addr) bool {
		a = a.Unmap()
		for _, r := range s.podRanges {
			if r.Contains(a) {
				s.log.Warn("External IP inside the cluster's pod pools left out: it is a pod's address", "service", key, "externalIP", a, "pool", r)
				return true
			}
		}
		for node, cidrs := range s.nodePodCIDRs {
			for _, r := range cidrs {
				if r.Contains(a) {
					s.log.Warn("External IP inside a node's pod CIDR left out: it is a pod's address", "service", key, "externalIP", a, "node", node, "podCIDR", r)
					return true
				}
			}
		}
		if len(s.externalIPRanges) == 0 {
			return false
		}
		for _, r := range s.externalIPRanges {
			if r.Contains(a) {
				return false
			}
		}
		s.log.Warn("External IP outside --service-external-ip-cidrs left out", "service", key, "externalIP", a)
		return true
	})
	return &c
}

// upsertJudged is the op writing svc with its external IPs judged when
// the op runs (not when the event came: a Node's pod CIDR may arrive in
// between), remembered for the next judgement.
func (s *Source) upsertJudged(key string, svc *loadbalancer.Service) op {
	return func(b *loadbalancer.Batch) {
		s.extMu.Lock()
		defer s.extMu.Unlock()
		if len(svc.ExternalIPs) > 0 {
			s.withExternalIPs[svc.Name] = svc
		} else {
			delete(s.withExternalIPs, svc.Name)
		}
		s.logErr("Write service", key, b.UpsertService(s.judgedExternalIPs(svc)))
	}
}

// setNodePodCIDRs records node's pod CIDRs (none: the Node is gone) and,
// when they changed, judges the Services' external IPs again. Services
// not written yet (the initial listing) are judged when they are. The
// lock order is the ops': the writer's batch, then extMu.
func (s *Source) setNodePodCIDRs(node string, cidrs []netip.Prefix) {
	s.extMu.Lock()
	same := slices.Equal(s.nodePodCIDRs[node], cidrs)
	if !same && len(s.withExternalIPs) == 0 {
		// No Service to judge again (the common case, and every Node
		// of the initial listing): no write transaction per Node. An
		// op running later judges with these.
		s.recordPodCIDRsLocked(node, cidrs)
		same = true
	}
	s.extMu.Unlock()
	if same {
		// Most Node events are status updates.
		return
	}
	err := s.w.Batch(func(b *loadbalancer.Batch) error {
		s.extMu.Lock()
		defer s.extMu.Unlock()
		s.recordPodCIDRsLocked(node, cidrs)
		for _, svc := range s.withExternalIPs {
			s.logErr("Write service", svc.Name.String(), b.UpsertService(s.judgedExternalIPs(svc)))
		}
		return nil
	})
	if err != nil {
		s.log.Error("Judge the external IPs again after a node's pod CIDRs changed", "node", node, "error", err)
	}
}

// recordPodCIDRsLocked sets node's pod CIDRs (none: forgets the node).
func (s *Source) recordPodCIDRsLocked(node string, cidrs []netip.Prefix) {
	if len(cidrs) == 0 {
		delete(s.nodePodCIDRs, node)
	} else {
		s.nodePodCIDRs[node] = cidrs
	}
}

// podCIDRsOf are a Node's spec.podCIDRs that parse (the Node object is
// the API server's, validated there), else its spec.podCIDR.
func podCIDRsOf(n *corev1.Node) []netip.Prefix {
	if out := parsePrefixes(n.Spec.PodCIDRs); len(out) > 0 {
		return out
	}
	return parsePrefixes([]string{n.Spec.PodCIDR})
}

// parsePrefixes are the prefixes of cidrs that parse, masked.
func parsePrefixes(cidrs []string) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// clampNodePorts drops the node ports outside the range.
// nodePortsOutOfRange tells whether clampNodePorts would change svc.
func (s *Source) nodePortsOutOfRange(svc *loadbalancer.Service) bool {
	if s.nodePortMax == 0 {
		return false
	}
	out := func(p uint16) bool { return p != 0 && (p < s.nodePortMin || p > s.nodePortMax) }
	for _, p := range svc.Ports {
		if out(p.NodePort) {
			return true
		}
	}
	return out(svc.HealthCheckNodePort)
}

func (s *Source) clampNodePorts(key string, svc *loadbalancer.Service) {
	if s.nodePortMax == 0 {
		return
	}
	for i, p := range svc.Ports {
		if p.NodePort != 0 && (p.NodePort < s.nodePortMin || p.NodePort > s.nodePortMax) {
			s.log.Warn("Node port outside --node-port-range left out", "service", key, "port", p.Name, "nodePort", p.NodePort,
				"range", fmt.Sprintf("%d-%d", s.nodePortMin, s.nodePortMax))
			svc.Ports[i].NodePort = 0
		}
	}
	if svc.HealthCheckNodePort != 0 && (svc.HealthCheckNodePort < s.nodePortMin || svc.HealthCheckNodePort > s.nodePortMax) {
		s.log.Warn("Health check node port outside --node-port-range left out", "service", key, "healthCheckNodePort", svc.HealthCheckNodePort)
		svc.HealthCheckNodePort = 0
	}
}

func (s *Source) markSynced(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.synced[kind] = true
	if s.synced["services"] && s.synced["endpointslices"] && s.synced["nodes"] && s.synced["tendrilnodes"] && s.synced["pods"] && s.done != nil {
		s.done()
		s.done = nil
		s.log.Info("Services, EndpointSlices, nodes, TendrilNodes and pods synced; stale load-balancer entries may now be pruned")
	}
}

// initialBatch is how many events of the initial listing go into one
// write transaction.
const initialBatch = 1000

// op is one event's change to the tables; it logs its own errors, so that
// one bad object does not fail the others of its batch.
type op func(*loadbalancer.Batch)

// apply writes o now, or keeps it for the batches of the initial listing
// while kind has not synced (the frontends table is not initialized
// before both kinds have, so nothing reconciles a partial view meanwhile).
func (s *Source) apply(pending *[]op, synced bool, o op) {
	if !synced {
		*pending = append(*pending, o)
		return
	}
	s.write([]op{o})
}

func (s *Source) write(ops []op) {
	for len(ops) > 0 {
		n := min(len(ops), initialBatch)
		err := s.w.Batch(func(b *loadbalancer.Batch) error {
			for _, o := range ops[:n] {
				o(b)
			}
			return nil
		})
		if err != nil {
			s.log.Error("Write services and backends", "changes", n, "error", err)
		}
		ops = ops[n:]
	}
}

// OnService handles a Service event.
func (s *Source) OnService(ev watchers.Event[*k8scache.Service]) {
	if ev.Kind == watchers.Synced {
		s.write(s.pendingServices)
		s.pendingServices, s.servicesListed = nil, true
		s.markSynced("services")
		return
	}
	name := loadbalancer.ServiceName{Namespace: ev.Object.Namespace, Name: ev.Object.Name}
	var o op
	switch c := ev.Object; {
	case ev.Kind == watchers.Delete:
		o = s.deleteService(ev.Key, name)
	case c.Err != nil:
		s.log.Warn("Service not translated", "service", ev.Key, "error", c.Err)
		o = s.deleteService(ev.Key, name)
	case c.Service == nil:
		o = s.deleteService(ev.Key, name)
	default:
		o = s.upsertJudged(ev.Key, s.withNodeSettings(ev.Key, c))
	}
	s.apply(&s.pendingServices, s.servicesListed, o)
}

// withNodeSettings is the cached conversion with this node's settings
// applied: the default backend selection, node ports out of range left
// out. Usually none changes it, and the services table holds the cache's
// object itself; otherwise a copy (the cache's is shared).
func (s *Source) withNodeSettings(key string, c *k8scache.Service) *loadbalancer.Service {
	svc := c.Service
	maglev := !c.MaglevSet && s.defaultMaglev
	if !maglev && !s.nodePortsOutOfRange(svc) {
		return svc
	}
	cp := *svc
	cp.Ports = slices.Clone(svc.Ports)
	if maglev {
		cp.Maglev = true
	}
	s.clampNodePorts(key, &cp)
	return &cp
}

// deleteService is the op deleting a Service.
func (s *Source) deleteService(key string, name loadbalancer.ServiceName) op {
	return func(b *loadbalancer.Batch) {
		s.extMu.Lock()
		defer s.extMu.Unlock()
		delete(s.withExternalIPs, name)
		s.logErr("Write service", key, b.DeleteService(name))
	}
}

func (s *Source) logErr(what, key string, err error) {
	if err != nil {
		s.log.Error(what, "object", key, "error", err)
	}
}

// OnEndpointSlice handles an EndpointSlice event: the informer caches
// each slice as its backends (k8scache.Slice), which the backends table
// then holds too.
func (s *Source) OnEndpointSlice(ev watchers.Event[*k8scache.Slice]) {
	if ev.Kind == watchers.Synced {
		s.write(s.pendingSlices)
		s.pendingSlices, s.slicesListed = nil, true
		s.markSynced("endpointslices")
		return
	}
	s.mu.Lock()
	prev, hadPrev := s.sliceOwner[ev.Key]
	s.mu.Unlock()
	source := ev.Object.Name
	name, backends, ok := ev.Object.Service, ev.Object.Backends, ev.Object.OK
	if ev.Kind == watchers.Delete {
		ok = false
	}
	moved := hadPrev && (!ok || prev != name)
	s.mu.Lock()
	if ok {
		s.sliceOwner[ev.Key] = name
	} else {
		delete(s.sliceOwner, ev.Key)
	}
	s.mu.Unlock()
	if !moved && !ok {
		return
	}
	s.apply(&s.pendingSlices, s.slicesListed, func(b *loadbalancer.Batch) {
		if moved {
			s.logErr("Remove EndpointSlice backends", ev.Key, b.SetBackends(prev, source, nil))
		}
		if ok {
			s.logErr("Write EndpointSlice backends", ev.Key, b.SetBackends(name, source, backends))
		}
	})
}

// OnNode handles a Node event: this node's topology.kubernetes.io/zone
// label is the zone that trafficDistribution PreferClose prefers, and its
// internal and external addresses are those node ports are answered on.
func (s *Source) OnNode(ev watchers.Event[*corev1.Node]) {
	if ev.Kind == watchers.Synced {
		s.markSynced("nodes")
		return
	}
	var cidrs []netip.Prefix
	if ev.Kind != watchers.Delete {
		cidrs = podCIDRsOf(ev.Object)
	}
	s.setNodePodCIDRs(ev.Object.Name, cidrs)
	if ev.Object.Name != s.w.NodeName() {
		return
	}
	zone := ""
	if ev.Kind != watchers.Delete {
		zone = ev.Object.Labels[corev1.LabelTopologyZone]
	}
	if err := s.w.SetNodeZone(zone); err != nil {
		s.log.Error("Write this node's zone", "zone", zone, "error", err)
	}
	var addrs []netip.Addr
	if ev.Kind != watchers.Delete {
		addrs = NodeAddresses(ev.Object)
	}
	if err := s.w.SetNodeAddresses(addrs); err != nil {
		s.log.Error("Write this node's addresses", "addresses", addrs, "error", err)
	}
}

// OnTendrilNode handles a TendrilNode event: its spec.ipam.podCIDRs
// (cluster-pool IPAM's allocations, or the Node's mirrored) are pod
// ranges for the external IPs, as a Node's spec.podCIDRs are. A node
// writes its own TendrilNode, so one could name a range that is not its
// own: that takes external IPs in it away (they are left out), never
// gives any.
func (s *Source) OnTendrilNode(ev watchers.Event[*v1alpha1.TendrilNode]) {
	if ev.Kind == watchers.Synced {
		s.markSynced("tendrilnodes")
		return
	}
	var cidrs []netip.Prefix
	if ev.Kind != watchers.Delete {
		cidrs = parsePrefixes(ev.Object.Spec.IPAM.PodCIDRs)
	}
	s.setNodePodCIDRs("TendrilNode "+ev.Object.Name, cidrs)
}

// NodeAddresses are a node's InternalIP and ExternalIP addresses: those its
// node ports are answered on.
func NodeAddresses(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// HostPortName is the services-table name of a pod's host ports: the
// pod's namespace and "pod/<name>", which no Service can be named (a
// Service name has no slash).
func HostPortName(namespace, pod string) loadbalancer.ServiceName {
	return loadbalancer.ServiceName{Namespace: namespace, Name: "pod/" + pod}
}

// hostPortSource is the backends' source of a pod's host ports.
const hostPortSource = "pod"

// HostPortsFrom converts a pod's containers' hostPorts into a service of
// type HostPort and its backends (the pod's addresses on the container
// ports), as the portmap plugin would map them; ok is false for a pod with
// no host port, no address yet, or that has ended. A hostIP of 0.0.0.0 or
// :: (or none) means every address of the node.
func HostPortsFrom(pod *corev1.Pod, nodeName string) (svc *loadbalancer.Service, backends []*loadbalancer.Backend, ok bool) {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.DeletionTimestamp != nil {
		return nil, nil, false
	}
	var podIPs []netip.Addr
	for _, ip := range pod.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			podIPs = append(podIPs, a.Unmap())
		}
	}
	if len(podIPs) == 0 {
		if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
			podIPs = append(podIPs, a.Unmap())
		}
	}
	if len(podIPs) == 0 {
		return nil, nil, false
	}
	svc = &loadbalancer.Service{Name: HostPortName(pod.Namespace, pod.Name), Type: loadbalancer.FrontendHostPort,
		InternalTrafficPolicy: loadbalancer.TrafficPolicyCluster, ExternalTrafficPolicy: loadbalancer.TrafficPolicyLocal}
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.HostPort == 0 {
				continue
			}
			proto, err := k8scache.ProtoOf(cp.Protocol)
			if err != nil {
				continue
			}
			name := fmt.Sprintf("%s-%d", strings.ToLower(loadbalancer.ProtoName(proto)), cp.HostPort)
			svc.Ports = append(svc.Ports, loadbalancer.ServicePort{Name: name, Port: uint16(cp.HostPort), Proto: proto})
			if ip, err := netip.ParseAddr(cp.HostIP); err == nil && !ip.IsUnspecified() && !slices.Contains(svc.ExternalIPs, ip.Unmap()) {
				svc.ExternalIPs = append(svc.ExternalIPs, ip.Unmap())
			}
			for _, a := range podIPs {
				backends = append(backends, &loadbalancer.Backend{Service: svc.Name, Source: hostPortSource, Addr: netip.AddrPortFrom(a, uint16(cp.ContainerPort)), Proto: proto, PortName: name,
					NodeName: nodeName, Ready: true, Serving: true})
			}
		}
	}
	if len(svc.Ports) == 0 {
		return nil, nil, false
	}
	return svc, backends, true
}

// OnPod handles an event of this node's pods: their host ports.
func (s *Source) OnPod(ev watchers.Event[*corev1.Pod]) {
	if ev.Kind == watchers.Synced {
		s.write(s.pendingPods)
		s.pendingPods, s.podsListed = nil, true
		s.markSynced("pods")
		return
	}
	ns, name, _ := strings.Cut(ev.Key, "/")
	svcName := HostPortName(ns, name)
	var svc *loadbalancer.Service
	var backends []*loadbalancer.Backend
	ok := false
	if ev.Kind != watchers.Delete {
		svc, backends, ok = HostPortsFrom(ev.Object, s.w.NodeName())
	}
	s.mu.Lock()
	had := s.hostPorts[ev.Key]
	if ok {
		s.hostPorts[ev.Key] = true
	} else {
		delete(s.hostPorts, ev.Key)
	}
	s.mu.Unlock()
	if !ok && !had {
		return // no host port before or now: nothing to write
	}
	s.apply(&s.pendingPods, s.podsListed, func(b *loadbalancer.Batch) {
		if !ok {
			s.logErr("Remove pod host ports", ev.Key, b.DeleteService(svcName))
			s.logErr("Remove pod host ports", ev.Key, b.SetBackends(svcName, hostPortSource, nil))
			return
		}
		s.logErr("Write pod host ports", ev.Key, b.UpsertService(svc))
		s.logErr("Write pod host ports", ev.Key, b.SetBackends(svcName, hostPortSource, backends))
	})
}
