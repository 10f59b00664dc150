package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tendril-net/tendril/pkg/agent/agentkv"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/crdalloc"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Why TendrilEndpoints (and kvstore keys) are written into etcd: 50,000
// creates through kube-apiserver on this 2-core machine, shared with CI,
// take minutes (each create is admission, validation against the CRD's
// schema, a JSON encode, an etcd transaction and a watch event); written
// as the API server stores them (JSON for custom resources, under
// /registry/<group>/<resource>/<namespace>/<name>), the API server's
// watch cache picks them up from etcd and the agent still reads
// everything from the API server. -direct=false creates them through the
// API server instead.

// parallel runs fn(i) for i in [0, n) on workers goroutines and returns
// the first error.
func parallel(n, workers int, fn func(i int) error) error {
	work := make(chan int)
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	return first
}

// fillCommon creates what both identity modes read from the API server:
// namespaces, this node and the remote nodes (Node and TendrilNode),
// Services with EndpointSlices, policies.
func (b *bench) fillCommon(ctx context.Context) error {
	c, cs, td := b.cl, b.clients.Core, b.clients.Tendril.TendrilV1alpha1()
	t0 := time.Now()
	if err := parallel(c.namespaces, b.workers, func(i int) error {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns-%02d", i)}}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("namespaces: %w", err)
	}
	local := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: localNode}, Spec: corev1.NodeSpec{PodCIDRs: []string{localCIDR}, PodCIDR: localCIDR}}
	n, err := cs.CoreV1().Nodes().Create(ctx, local, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("local node: %w", err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: localNodeIP}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("local node status: %w", err)
	}
	if err := parallel(c.nodes, b.workers, func(i int) error {
		cidr := podCIDR(i).String()
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i), Labels: map[string]string{"kubernetes.io/os": "linux"}},
			Spec: corev1.NodeSpec{PodCIDRs: []string{cidr}, PodCIDR: cidr}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
		_, err := td.TendrilNodes().Create(ctx, &v1alpha1.TendrilNode{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i)},
			Spec: v1alpha1.NodeSpec{Addresses: []v1alpha1.NodeAddress{{Type: "InternalIP", IP: nodeIP(i).String()}},
				IPAM: v1alpha1.IPAMSpec{PodCIDRs: []string{cidr}}}}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("tendrilnode %d: %w", i, err)
		}
		return nil
	}); err != nil {
		return err
	}
	b.logf("%d namespaces, %d nodes + TendrilNodes in %s", c.namespaces, c.nodes, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	if err := parallel(c.services, b.workers, func(s int) error {
		a := c.serviceApp(s)
		ns, name := c.appNS(a), fmt.Sprintf("svc-%04d", s)
		if _, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": appName(a)},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(clientPort), Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("service %s: %w", name, err)
		}
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(clientPort)), Protocol: ptr(corev1.ProtocolTCP)}},
		}
		for _, j := range c.servicePods(s) {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{c.podIP(j).String()}, NodeName: ptr(nodeName(c.podNode(j))),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}})
		}
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("slice %s: %w", name, err)
		}
		return nil
	}); err != nil {
		return err
	}
	b.logf("%d Services + EndpointSlices in %s", c.services, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	if err := parallel(c.policies, b.workers, func(p int) error {
		a := c.policyApp(p)
		ns, name := c.appNS(a), fmt.Sprintf("pol-%03d", p)
		if p%2 == 0 {
			_, err := cs.NetworkingV1().NetworkPolicies(ns).Create(ctx, c.networkPolicy(p), metav1.CreateOptions{})
			return err
		}
		_, err := td.TendrilNetworkPolicies(ns).Create(ctx, &v1alpha1.TendrilNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: c.tendrilRule(p)}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("policies: %w", err)
	}
	b.logf("%d policies in %s", c.policies, time.Since(t0).Round(time.Millisecond))
	return nil
}

func ptr[T any](v T) *T { return &v }

func (c cluster) policyApp(p int) int { return p % c.apps }

// networkPolicy is policy p as a Kubernetes NetworkPolicy.
func (c cluster) networkPolicy(p int) *networkingv1.NetworkPolicy {
	a := c.policyApp(p)
	b := (a + 1) % c.apps
	tcp := corev1.ProtocolTCP
	port := func(n int) []networkingv1.NetworkPolicyPort {
		return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr(intstr.FromInt(n))}}
	}
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pol-%03d", p), Namespace: c.appNS(a)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": appName(a)}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{},
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}}, Ports: port(clientPort)},
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": c.appNS(b)}},
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": appName(b)}}}}, Ports: port(peerPort)},
			}}}
}

// tendrilRule is policy p as a TendrilNetworkPolicy rule: the same as
// networkPolicy in the CiliumNetworkPolicy schema.
func (c cluster) tendrilRule(p int) *api.Rule {
	a := c.policyApp(p)
	b := (a + 1) % c.apps
	port := func(n int) []api.PortRule {
		return []api.PortRule{{Ports: []api.PortProtocol{{Port: strconv.Itoa(n), Protocol: "TCP"}}}}
	}
	return &api.Rule{
		EndpointSelector: &api.EndpointSelector{MatchLabels: map[string]string{"app": appName(a)}},
		Ingress: []api.IngressRule{
			{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"role": "client"},
				MatchExpressions: []api.Requirement{{Key: "k8s:io.kubernetes.pod.namespace", Operator: "Exists"}}}}, ToPorts: port(clientPort)},
			{FromEndpoints: []api.EndpointSelector{{MatchLabels: map[string]string{"app": appName(b), "k8s:io.kubernetes.pod.namespace": c.appNS(b)}}},
				ToPorts: port(peerPort)},
		},
	}
}

// tendrilIdentity is the TendrilIdentity object of a label set.
func tendrilIdentity(id identity.NumericIdentity, labels []string) *v1alpha1.TendrilIdentity {
	return &v1alpha1.TendrilIdentity{TypeMeta: metav1.TypeMeta{APIVersion: "tendril.io/v1alpha1", Kind: "TendrilIdentity"},
		ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(int(id))}, SecurityLabels: crdalloc.SecurityLabels(labels)}
}

// tendrilEndpoint is the TendrilEndpoint a remote node's agent publishes
// for a pod.
func tendrilEndpoint(ns, name string, epID int, id identity.NumericIdentity, labels []string, ip, node string) *v1alpha1.TendrilEndpoint {
	return &v1alpha1.TendrilEndpoint{TypeMeta: metav1.TypeMeta{APIVersion: "tendril.io/v1alpha1", Kind: "TendrilEndpoint"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Status: v1alpha1.EndpointStatus{ID: int64(epID), State: "ready",
			Identity:   &v1alpha1.EndpointIdentity{ID: int64(id), Labels: labels},
			Networking: &v1alpha1.EndpointNetworking{Addressing: []v1alpha1.AddressPair{{IPv4: ip}}, NodeIP: node}}}
}

func podName(j int) string { return fmt.Sprintf("pod-%06d", j) }

// podEndpoint is pod j's TendrilEndpoint.
func (c cluster) podEndpoint(j int) *v1alpha1.TendrilEndpoint {
	a := c.podApp(j)
	return tendrilEndpoint(c.appNS(a), podName(j), 1+j/c.nodes, c.podIdentity(j), c.labelsOf(a, versionName(c.podVersion(j))),
		c.podIP(j).String(), nodeIP(c.podNode(j)).String())
}

// etcdWriter writes objects and keys into etcd in transactions of up to
// 128 puts, 8 at a time.
type etcdWriter struct{ cli *clientv3.Client }

func newEtcdWriter(url string) (*etcdWriter, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return &etcdWriter{cli: cli}, nil
}

func (w *etcdWriter) close() { _ = w.cli.Close() }

// putAll puts n key/value pairs made by kv.
func (w *etcdWriter) putAll(ctx context.Context, n int, kv func(i int) (string, string, error)) error {
	const perTxn = 128
	return parallel((n+perTxn-1)/perTxn, 8, func(t int) error {
		var ops []clientv3.Op
		for i := t * perTxn; i < min(n, (t+1)*perTxn); i++ {
			k, v, err := kv(i)
			if err != nil {
				return err
			}
			ops = append(ops, clientv3.OpPut(k, v))
		}
		if _, err := w.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return fmt.Errorf("etcd txn: %w", err)
		}
		return nil
	})
}

// storedCR is a custom resource as the API server stores it (JSON).
func storedCR(obj interface{ GetObjectMeta() metav1.Object }) (string, error) {
	m := obj.GetObjectMeta()
	m.SetUID(types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012x", uidSeq.next())))
	m.SetCreationTimestamp(metav1.Now())
	m.SetGeneration(1)
	b, err := json.Marshal(obj)
	return string(b), err
}

type seq struct {
	mu sync.Mutex
	n  uint64
}

func (s *seq) next() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return s.n
}

var uidSeq seq

func teKey(ns, name string) string {
	return path.Join("/registry/tendril.io/tendrilendpoints", ns, name)
}
func tidKey(id identity.NumericIdentity) string {
	return path.Join("/registry/tendril.io/tendrilidentities", strconv.Itoa(int(id)))
}

// fillCRD writes the CRD identity mode's data: a TendrilIdentity per
// label set and a TendrilEndpoint per pod.
func (b *bench) fillCRD(ctx context.Context) error {
	c := b.cl
	t0 := time.Now()
	td := b.clients.Tendril.TendrilV1alpha1()
	if err := parallel(c.identities(), b.workers, func(n int) error {
		_, err := td.TendrilIdentities().Create(ctx, tendrilIdentity(identity.NumericIdentity(firstIdentity+n), c.identityLabels(n)), metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("identities: %w", err)
	}
	b.logf("%d TendrilIdentities in %s", c.identities(), time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	if b.direct {
		w, err := newEtcdWriter(b.etcdURL)
		if err != nil {
			return err
		}
		defer w.close()
		if err := w.putAll(ctx, c.pods, func(j int) (string, string, error) {
			te := c.podEndpoint(j)
			v, err := storedCR(te)
			return teKey(te.Namespace, te.Name), v, err
		}); err != nil {
			return err
		}
		if err := b.waitEndpoints(ctx, c.pods); err != nil {
			return err
		}
		b.logf("%d TendrilEndpoints written into etcd, listed by the API server, in %s", c.pods, time.Since(t0).Round(time.Millisecond))
		return nil
	}
	if err := parallel(c.pods, b.workers, func(j int) error {
		te := c.podEndpoint(j)
		_, err := td.TendrilEndpoints(te.Namespace).Create(ctx, te, metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("endpoints: %w", err)
	}
	b.logf("%d TendrilEndpoints created through the API server in %s", c.pods, time.Since(t0).Round(time.Millisecond))
	return nil
}

// waitEndpoints waits until the API server lists n TendrilEndpoints.
func (b *bench) waitEndpoints(ctx context.Context, n int) error {
	td := b.clients.Tendril.TendrilV1alpha1()
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(time.Second) {
		got := 0
		opts := metav1.ListOptions{Limit: 5000}
		var err error
		for {
			var l *v1alpha1.TendrilEndpointList
			if l, err = td.TendrilEndpoints("").List(ctx, opts); err != nil {
				break
			}
			got += len(l.Items)
			if opts.Continue = l.Continue; opts.Continue == "" {
				break
			}
		}
		if err == nil && got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("API server lists %d of %d TendrilEndpoints 5 min after the etcd writes: %v", got, n, err)
		}
	}
}

// clearCRD removes the CRD mode's endpoints and identities (from etcd;
// the API server's watch cache follows).
func (b *bench) clearCRD(ctx context.Context) error {
	w, err := newEtcdWriter(b.etcdURL)
	if err != nil {
		return err
	}
	defer w.close()
	for _, p := range []string{"/registry/tendril.io/tendrilendpoints/", "/registry/tendril.io/tendrilidentities/"} {
		if _, err := w.cli.Delete(ctx, p, clientv3.WithPrefix()); err != nil {
			return fmt.Errorf("delete %s: %w", p, err)
		}
	}
	return b.waitEndpointsGone(ctx)
}

func (b *bench) waitEndpointsGone(ctx context.Context) error {
	td := b.clients.Tendril.TendrilV1alpha1()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		l, err := td.TendrilEndpoints("").List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil && len(l.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("TendrilEndpoints still listed 2 min after their deletion from etcd: %v", err)
		}
	}
}

// kvIdentityKeys are the keys the kvstore allocator reads for an
// identity: the master key and the label set's index.
func kvIdentityKeys(id identity.NumericIdentity, labels []string) [][2]string {
	key := identity.LabelsKey(labels)
	return [][2]string{{kvalloc.IDPrefix + strconv.Itoa(int(id)), key}, {kvalloc.LabelsPrefix + kvalloc.LabelsHash(key), strconv.Itoa(int(id))}}
}

// kvIPKey is the kvstore ipcache key of a pod on remote node i.
func kvIPKey(ip string, id identity.NumericIdentity, node int, ns, name string) (string, string, error) {
	v, err := json.Marshal(agentkv.IPEntry{IP: ip, Identity: uint32(id), HostIP: nodeIP(node).String(), Node: nodeName(node), Namespace: ns, Name: name})
	return agentkv.IPPrefix + ip, string(v), err
}

// fillKV writes the kvstore identity mode's data into etcd: the
// identities and one ipcache key per pod.
func (b *bench) fillKV(ctx context.Context) error {
	c := b.cl
	t0 := time.Now()
	w, err := newEtcdWriter(b.etcdURL)
	if err != nil {
		return err
	}
	defer w.close()
	if err := w.putAll(ctx, 2*c.identities(), func(i int) (string, string, error) {
		kv := kvIdentityKeys(identity.NumericIdentity(firstIdentity+i/2), c.identityLabels(i/2))[i%2]
		return kv[0], kv[1], nil
	}); err != nil {
		return err
	}
	if err := w.putAll(ctx, c.pods, func(j int) (string, string, error) {
		return kvIPKey(c.podIP(j).String(), c.podIdentity(j), c.podNode(j), c.appNS(c.podApp(j)), podName(j))
	}); err != nil {
		return err
	}
	b.logf("%d identities and %d ipcache keys written into the kvstore in %s", c.identities(), c.pods, time.Since(t0).Round(time.Millisecond))
	return nil
}

// newRemotePod is what the remote node's agent writes for a new pod: in
// CRD mode its identity (when new) then its TendrilEndpoint, in kvstore
// mode the identity's keys then the address key. del removes the pod.
type remoteWriter interface {
	addPod(ctx context.Context, k int, id identity.NumericIdentity, labels []string, newIdentity bool) error
	delPod(ctx context.Context, k int, labels []string) error
}

type crdWriter struct {
	b *bench
}

func (w crdWriter) addPod(ctx context.Context, k int, id identity.NumericIdentity, labels []string, newIdentity bool) error {
	td := w.b.clients.Tendril.TendrilV1alpha1()
	if newIdentity {
		if _, err := td.TendrilIdentities().Create(ctx, tendrilIdentity(id, labels), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("identity %d: %w", id, err)
		}
	}
	node, ip := w.b.cl.newPod(k)
	_, err := td.TendrilEndpoints(w.b.cl.appNS(0)).Create(ctx, tendrilEndpoint(w.b.cl.appNS(0), newPodName(k), 5000+k%60000, id, labels, ip.String(), nodeIP(node).String()), metav1.CreateOptions{})
	return err
}

func (w crdWriter) delPod(ctx context.Context, k int, _ []string) error {
	return w.b.clients.Tendril.TendrilV1alpha1().TendrilEndpoints(w.b.cl.appNS(0)).Delete(ctx, newPodName(k), metav1.DeleteOptions{})
}

func newPodName(k int) string { return fmt.Sprintf("new-%06d", k) }

type kvWriter struct {
	b *bench
	w *etcdWriter
}

func (w kvWriter) addPod(ctx context.Context, k int, id identity.NumericIdentity, labels []string, newIdentity bool) error {
	if newIdentity {
		for _, kv := range kvIdentityKeys(id, labels) {
			if _, err := w.w.cli.Put(ctx, kv[0], kv[1]); err != nil {
				return fmt.Errorf("identity %d: %w", id, err)
			}
		}
	}
	node, ip := w.b.cl.newPod(k)
	key, val, err := kvIPKey(ip.String(), id, node, w.b.cl.appNS(0), newPodName(k))
	if err != nil {
		return err
	}
	_, err = w.w.cli.Put(ctx, key, val)
	return err
}

func (w kvWriter) delPod(ctx context.Context, k int, _ []string) error {
	_, ip := w.b.cl.newPod(k)
	_, err := w.w.cli.Delete(ctx, agentkv.IPPrefix+ip.String())
	return err
}

// watchFloor records when a plain watch of this process (the API server's
// or etcd's, as the agent watches it) saw each new pod's address: what any
// agent waits for before it can act.
type watchFloor struct {
	mu   sync.Mutex
	seen map[string]time.Time
	stop func()
}

func (f *watchFloor) record(ip string) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.seen[ip]; !ok {
		f.seen[ip] = now
	}
}

// at is when the watch saw ip, waiting up to wait for it.
func (f *watchFloor) at(ip string, wait time.Duration) (time.Time, bool) {
	for deadline := time.Now().Add(wait); ; time.Sleep(time.Millisecond) {
		f.mu.Lock()
		t, ok := f.seen[ip]
		f.mu.Unlock()
		if ok || time.Now().After(deadline) {
			return t, ok
		}
	}
}

// startWatchFloor watches the new pods' namespace's TendrilEndpoints (crd)
// or the kvstore's ipcache keys (kvstore) from now on.
func (b *bench) startWatchFloor(ctx context.Context, mode string) (*watchFloor, error) {
	f := &watchFloor{seen: map[string]time.Time{}}
	ctx, cancel := context.WithCancel(ctx)
	f.stop = cancel
	if mode == "kvstore" {
		w, err := newEtcdWriter(b.etcdURL)
		if err != nil {
			cancel()
			return nil, err
		}
		wc := w.cli.Watch(ctx, agentkv.IPPrefix, clientv3.WithPrefix())
		go func() {
			defer w.close()
			for resp := range wc {
				for _, ev := range resp.Events {
					if ev.Type == clientv3.EventTypePut {
						f.record(strings.TrimPrefix(string(ev.Kv.Key), agentkv.IPPrefix))
					}
				}
			}
		}()
		return f, nil
	}
	tes := b.clients.Tendril.TendrilV1alpha1().TendrilEndpoints(b.cl.appNS(0))
	l, err := tes.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("list endpoints: %w", err)
	}
	w, err := tes.Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch endpoints: %w", err)
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if te, ok := ev.Object.(*v1alpha1.TendrilEndpoint); ok && ev.Type == watch.Added && te.Status.Networking != nil {
				for _, a := range te.Status.Networking.Addressing {
					f.record(a.IPv4)
				}
			}
		}
	}()
	go func() { <-ctx.Done(); w.Stop() }()
	return f, nil
}
