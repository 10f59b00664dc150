package agent

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/identity/crdalloc"
	"github.com/tendril-net/tendril/pkg/ipam"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/crdinstall"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/node"
	"github.com/tendril-net/tendril/pkg/nodemanager"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
	policyk8s "github.com/tendril-net/tendril/pkg/policy/k8s"
	"github.com/tendril-net/tendril/pkg/version"
)

// kubernetesModule is the agent's Kubernetes side: clients, CRDs, the
// node's pod CIDRs and their write-back, the watchers, and what they feed
// (endpoint labels from pods and namespaces, Tendril policies).
type kubernetesModule struct {
	a        *Agent
	clients  *k8s.Clients
	watchers *watchers.Watchers
	writer   *node.Writer
	nodes    *nodemanager.Manager

	mu            sync.Mutex
	serverVersion string
	nodeObj       *corev1.Node
	selection     node.Selection
	policyGen     map[string]int64 // policy source -> generation realized
	remote        map[string][]netip.Addr
	// remotePorts are other nodes' pods' named ports by TendrilEndpoint
	// key, for egress rules naming a remote destination's port.
	remotePorts map[string]remoteNamedPorts
	cancel      context.CancelFunc
	done        sync.WaitGroup
}

func newKubernetesModule(a *Agent) *kubernetesModule {
	return &kubernetesModule{a: a, policyGen: map[string]int64{}}
}

// connect is start step 2: build the clients, reach the API server
// (retrying until the cache-sync timeout), install or update the CRDs.
func (k *kubernetesModule) connect(ctx context.Context) error {
	c, err := k8s.NewClients(k.a.cfg.K8s, "tendril-agent/"+version.Version)
	if err != nil {
		return err
	}
	k.clients = c
	var lastErr error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, k.a.cfg.K8sCacheSyncTimeout, true, func(context.Context) (bool, error) {
		v, err := c.Core.Discovery().ServerVersion()
		if err != nil {
			lastErr = err
			k.a.log.Info("Waiting for the Kubernetes API server", "error", err)
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
	if k.a.cfg.K8sInstallCRDs {
		if _, err := crdinstall.Install(ctx, c.Dynamic, k.a.log.With("module", "crd-install")); err != nil {
			return err
		}
	}
	if alloc, ok := k.a.identities.(*crdalloc.Allocator); ok {
		alloc.SetClient(c.Tendril)
	}
	k.watchers = watchers.New(c, k.a.cfg.NodeName, k.a.log.With("module", "k8s-watchers"))
	k.writer = node.NewWriter(c.Core, c.Tendril, 10*time.Second, k.a.log.With("module", "node-writeback"))
	return nil
}

// selectPodCIDRs is part of start step 5: wait for this node's Node object
// and pick the pod CIDRs by precedence.
func (k *kubernetesModule) selectPodCIDRs(ctx context.Context) (node.Selection, error) {
	n, err := node.WaitForNode(ctx, k.clients.Core, k.a.cfg.NodeName, k.a.log)
	if err != nil {
		return node.Selection{}, err
	}
	auto4, auto6 := autoPodCIDRs(k.a.cfg.NodeName)
	sel, err := node.SelectPodCIDRs(n, node.Ranges{IPv4: k.a.cfg.IPv4Range, IPv6: k.a.cfg.IPv6Range, AutoIPv4: auto4, AutoIPv6: auto6})
	if err != nil {
		return sel, err
	}
	k.mu.Lock()
	k.nodeObj, k.selection = n, sel
	k.mu.Unlock()
	k.a.log.Info("Pod CIDRs selected", "ipv4", sel.IPv4, "ipv4-from", sel.IPv4From, "ipv6", sel.IPv6, "ipv6-from", sel.IPv6From)
	return sel, nil
}

// startWriteBack is the end of step 5: publish the CIDRs, router IPs and
// node addresses in the background, retrying until the API server takes
// them.
func (k *kubernetesModule) startWriteBack(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	k.mu.Lock()
	l := node.Local{Name: k.a.cfg.NodeName, Selection: k.selection, Addresses: node.AddressesOf(k.nodeObj)}
	k.mu.Unlock()
	if m := k.a.endpoints.ipam; m != nil {
		l.RouterIPv4 = m.RouterIP(ipam.IPv4)
		l.RouterIPv6 = m.RouterIP(ipam.IPv6)
	}
	k.done.Add(1)
	go func() {
		defer k.done.Done()
		_ = k.writer.Run(ctx, l)
	}()
	return nil
}

// startWatchers is start step 6: subscribe, start the informers and wait
// for their caches; on timeout the agent stops, naming what did not sync.
func (k *kubernetesModule) startWatchers(ctx context.Context) error {
	w := k.watchers
	if _, err := w.Pods.Subscribe(k.onPod); err != nil {
		return err
	}
	if _, err := w.Namespaces.Subscribe(k.onNamespace); err != nil {
		return err
	}
	if alloc, ok := k.a.identities.(*crdalloc.Allocator); ok {
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
	if _, err := w.NetworkPolicies.Subscribe(k.onNetworkPolicy); err != nil {
		return err
	}
	if _, err := w.Pods.Subscribe(func(ev watchers.Event[*corev1.Pod]) {
		// A pod's named ports may change what named-port rules open.
		if ev.Kind == watchers.Upsert && len(policyk8s.PodNamedPorts(ev.Object)) > 0 {
			k.a.policy.triggerRegeneration()
		}
	}); err != nil {
		return err
	}
	if _, err := w.TendrilNetworkPolicies.Subscribe(func(ev watchers.Event[*v1alpha1.TendrilNetworkPolicy]) {
		if ev.Kind == watchers.Synced {
			return
		}
		p := ev.Object
		k.applyPolicy(ctx, ev.Kind, "TendrilNetworkPolicy", p.Namespace, p.Name, string(p.UID), p.Generation, p.Spec, p.Specs, p.Status.Conditions)
	}); err != nil {
		return err
	}
	if _, err := w.TendrilClusterwideNetworkPolicies.Subscribe(func(ev watchers.Event[*v1alpha1.TendrilClusterwideNetworkPolicy]) {
		if ev.Kind == watchers.Synced {
			return
		}
		p := ev.Object
		k.applyPolicy(ctx, ev.Kind, "TendrilClusterwideNetworkPolicy", "", p.Name, string(p.UID), p.Generation, p.Spec, p.Specs, p.Status.Conditions)
	}); err != nil {
		return err
	}
	var cache nodemanager.IPCache
	if k.a.datapath != nil {
		cache = k.a.datapath
	}
	k.nodes = nodemanager.New(nodemanager.Config{LocalNode: k.a.cfg.NodeName, InstallRoutes: k.a.cfg.InstallHostNetworking},
		k.a.endpoints.nl, cache, k.a.log.With("module", "node-manager"))
	if _, err := w.Nodes.Subscribe(func(ev watchers.Event[*corev1.Node]) { k.onPeerChange(ev.Kind, ev.Key) }); err != nil {
		return err
	}
	if _, err := w.TendrilNodes.Subscribe(func(ev watchers.Event[*v1alpha1.TendrilNode]) { k.onPeerChange(ev.Kind, ev.Key) }); err != nil {
		return err
	}
	w.Start(context.Background())
	start := time.Now()
	if err := w.WaitForCacheSync(ctx, k.a.cfg.K8sCacheSyncTimeout); err != nil {
		return err
	}
	k.a.log.Info("Kubernetes caches synced", "duration", time.Since(start))
	runCtx, cancel := context.WithCancel(context.Background())
	prev := k.cancel
	k.cancel = func() {
		cancel()
		if prev != nil {
			prev()
		}
	}
	k.done.Add(1)
	go func() {
		defer k.done.Done()
		k.nodes.Run(runCtx)
	}()
	return nil
}

// onPeerChange recomputes a peer from its Node and TendrilNode (either
// event may come first); the node is gone when its Node is.
func (k *kubernetesModule) onPeerChange(kind watchers.EventKind, name string) {
	if kind == watchers.Synced {
		return
	}
	n, ok := k.watchers.Nodes.Get(name)
	if !ok {
		k.nodes.DeletePeer(name)
		return
	}
	tn, _ := k.watchers.TendrilNodes.Get(name)
	k.nodes.UpsertPeer(nodemanager.MergeTendrilNode(nodemanager.PeerFromNode(n), tn))
}

func (k *kubernetesModule) stop(context.Context) error {
	if k.cancel != nil {
		k.cancel()
	}
	k.done.Wait()
	if k.watchers != nil {
		k.watchers.Stop()
	}
	return nil
}

// Label names Cilium gives pods, kept so policies written for Cilium select
// the same pods here.
const (
	labelServiceAccount  = "io.cilium.k8s.policy.serviceaccount"
	labelPolicyName      = "io.cilium.k8s.policy.name"
	labelPolicyNamespace = "io.cilium.k8s.policy.namespace"
	labelPolicyDerived   = "io.cilium.k8s.policy.derived-from"
	labelPolicyUID       = "io.cilium.k8s.policy.uid"
)

// podLabels are an endpoint's labels from its pod and the pod's namespace,
// named as Cilium names them; pod labels under the keys the agent sets
// itself are dropped (policyk8s.EndpointLabels), so a pod cannot pose as a
// member of another namespace, and labels the identity filter
// (--identity-labels-*) calls irrelevant are left out, so a rollout's
// pod-template-hash does not give each ReplicaSet its own identity.
func (k *kubernetesModule) podLabels(pod *corev1.Pod, ns *corev1.Namespace) []string {
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
		if err != nil || (k.a.labelFilter != nil && !k.a.labelFilter.Relevant(l)) {
			continue
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// namedPorts returns the named container ports of an endpoint's pod (nil
// when it has no pod in the cache).
func (k *kubernetesModule) namedPorts(ep *endpoint.Endpoint) map[string]policy.NamedPort {
	if k == nil || k.watchers == nil || ep.PodName == "" {
		return nil
	}
	pod, ok := k.watchers.Pods.Get(ep.PodNamespace + "/" + ep.PodName)
	if !ok {
		return nil
	}
	return policyk8s.PodNamedPorts(pod)
}

// labelsForEndpoint returns the labels of the endpoint's pod, waiting a
// little for the pod to reach the cache (CNI ADD can race the watch event).
func (k *kubernetesModule) labelsForEndpoint(ctx context.Context, ns, name string) ([]string, bool) {
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

func (k *kubernetesModule) onPod(ev watchers.Event[*corev1.Pod]) {
	if ev.Kind != watchers.Upsert {
		return
	}
	nsObj, _ := k.watchers.Namespaces.Get(ev.Object.Namespace)
	k.relabel(ev.Object.Namespace, ev.Object.Name, k.podLabels(ev.Object, nsObj))
}

func (k *kubernetesModule) onNamespace(ev watchers.Event[*corev1.Namespace]) {
	if ev.Kind != watchers.Upsert {
		return
	}
	for _, pod := range k.watchers.Pods.List() {
		if pod.Namespace == ev.Object.Name {
			k.relabel(pod.Namespace, pod.Name, k.podLabels(pod, ev.Object))
		}
	}
}

// onNetworkPolicy puts a Kubernetes NetworkPolicy into the repository (its
// translation with the exact Kubernetes semantics) or takes it out. A
// policy that does not translate is rejected whole and logged; its earlier
// version stays, as the API server would not have accepted it either.
func (k *kubernetesModule) onNetworkPolicy(ev watchers.Event[*networkingv1.NetworkPolicy]) {
	repo := k.a.policy.repo
	switch ev.Kind {
	case watchers.Upsert:
		rev, err := policyk8s.Apply(repo, ev.Object)
		if err != nil {
			k.a.log.Warn("NetworkPolicy rejected", "policy", ev.Key, "error", err)
			return
		}
		k.a.log.Info("NetworkPolicy imported", "policy", ev.Key, "revision", rev)
	case watchers.Delete:
		rev, n := policyk8s.Delete(repo, ev.Object.Namespace, ev.Object.Name)
		k.a.log.Info("NetworkPolicy removed", "policy", ev.Key, "rules", n, "revision", rev)
	}
}

// relabel records new labels for the endpoints of a pod. It only records
// them and queues the endpoints' regeneration: the manager's workers
// allocate the identity (over the network in CRD or kvstore mode) and
// realize the policy, retried until they succeed, so this watcher callback
// never blocks.
func (k *kubernetesModule) relabel(ns, name string, labels []string) {
	mgr := k.a.endpoints.mgr
	if mgr == nil {
		return
	}
	for _, ep := range mgr.List() {
		if ep.PodNamespace != ns || ep.PodName != name {
			continue
		}
		changed, err := mgr.SetLabels(ep.ID, labels, "Pod labels changed")
		if err != nil {
			k.a.log.Warn("Update endpoint labels", "endpoint", ep.ID, "pod", ns+"/"+name, "error", err)
			continue
		}
		if changed {
			k.a.log.Info("Endpoint labels changed; regeneration queued", "endpoint", ep.ID, "pod", ns+"/"+name)
		}
	}
}

// applyPolicy puts a Tendril policy's rules in the repository, replacing
// what the same object had; a policy that does not validate is rejected
// whole (its previous rules go too) and its status says why.
func (k *kubernetesModule) applyPolicy(ctx context.Context, kind watchers.EventKind, derivedFrom, ns, name, uid string,
	gen int64, spec *api.Rule, specs api.Rules, conds []metav1.Condition) {
	source := "k8s/" + derivedFrom + "/" + ns + "/" + name
	repo := k.a.policy.repo
	if kind == watchers.Delete {
		k.mu.Lock()
		delete(k.policyGen, source)
		k.mu.Unlock()
		if _, err := repo.ReplaceSource(source, ns, nil); err != nil {
			k.a.log.Error("Remove policy", "policy", source, "error", err)
		}
		return
	}
	k.mu.Lock()
	if g, ok := k.policyGen[source]; ok && g == gen {
		k.mu.Unlock()
		return // a status write or a resync: the spec is unchanged
	}
	k.policyGen[source] = gen
	k.mu.Unlock()

	var rules api.Rules
	if spec != nil {
		rules = append(rules, spec.DeepCopy())
	}
	for _, r := range specs {
		rules = append(rules, r.DeepCopy())
	}
	origin := api.LabelArray{
		{Source: labels.SourceK8s, Key: labelPolicyName, Value: name},
		{Source: labels.SourceK8s, Key: labelPolicyDerived, Value: derivedFrom},
		{Source: labels.SourceK8s, Key: labelPolicyUID, Value: uid},
	}
	if ns != "" {
		origin = append(origin, labels.Label{Source: labels.SourceK8s, Key: labelPolicyNamespace, Value: ns})
	}
	for _, r := range rules {
		r.Labels = append(r.Labels, origin...)
	}
	var err error
	if len(rules) == 0 {
		err = fmt.Errorf("the policy has neither spec nor specs")
	} else {
		_, err = repo.ReplaceSource(source, ns, rules)
	}
	if err != nil {
		// Rejected whole: nothing of this object stays enforced from an
		// earlier, valid version either, as the object now says otherwise.
		_, _ = repo.ReplaceSource(source, ns, nil)
		k.a.log.Warn("Policy rejected", "policy", source, "error", err)
	} else {
		k.a.log.Info("Policy imported", "policy", source, "rules", len(rules), "revision", repo.Revision())
	}
	k.writePolicyStatus(ctx, derivedFrom, ns, name, gen, conds, err)
}

func (k *kubernetesModule) writePolicyStatus(ctx context.Context, kind, ns, name string, gen int64, conds []metav1.Condition, verr error) {
	cond := metav1.Condition{Type: v1alpha1.ConditionValid, Status: metav1.ConditionTrue, Reason: "Valid", Message: "policy imported", ObservedGeneration: gen}
	if verr != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Invalid", verr.Error()
	}
	if cur := apimeta.FindStatusCondition(conds, v1alpha1.ConditionValid); cur != nil &&
		cur.Status == cond.Status && cur.Message == cond.Message && cur.ObservedGeneration == gen {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		td := k.clients.Tendril.TendrilV1alpha1()
		var err error
		if kind == "TendrilNetworkPolicy" {
			var p *v1alpha1.TendrilNetworkPolicy
			if p, err = td.TendrilNetworkPolicies(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
				apimeta.SetStatusCondition(&p.Status.Conditions, cond)
				_, err = td.TendrilNetworkPolicies(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			}
		} else {
			var p *v1alpha1.TendrilClusterwideNetworkPolicy
			if p, err = td.TendrilClusterwideNetworkPolicies().Get(ctx, name, metav1.GetOptions{}); err == nil {
				apimeta.SetStatusCondition(&p.Status.Conditions, cond)
				_, err = td.TendrilClusterwideNetworkPolicies().UpdateStatus(ctx, p, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			k.a.log.Debug("Write policy status", "policy", ns+"/"+name, "error", err)
		}
	}()
	_ = ctx
}

// statusSection is the Kubernetes part of `tendril status`.
func (k *kubernetesModule) statusSection() ext.Section {
	s := ext.Section{Title: "Kubernetes"}
	k.mu.Lock()
	ver, sel := k.serverVersion, k.selection
	k.mu.Unlock()
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
	if k.writer != nil {
		st := k.writer.Status()
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
		v := fmt.Sprintf("%d peers", len(k.nodes.Peers()))
		if err := k.nodes.LastError(); err != nil {
			v += ", last reconciliation failed: " + err.Error()
		}
		s.Lines = append(s.Lines, ext.Line{Key: "Nodes", Value: v})
	}
	if k.watchers != nil {
		synced := 0
		st := k.watchers.Status()
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

// model is the Kubernetes line of the v1 status.
func (k *kubernetesModule) model() *models.K8sStatus {
	k.mu.Lock()
	ver := k.serverVersion
	k.mu.Unlock()
	if ver == "" {
		return &models.K8sStatus{State: models.StatusStateWarning, Msg: "API server not reached yet"}
	}
	st := &models.K8sStatus{State: models.StatusStateOk, Msg: "API server " + ver}
	if k.watchers != nil {
		for _, r := range k.watchers.Status() {
			st.K8sAPIVersions = append(st.K8sAPIVersions, r.Name)
			if !r.Synced {
				st.State, st.Msg = models.StatusStateWarning, "waiting for the caches to sync"
			}
		}
	}
	return st
}
