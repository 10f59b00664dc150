package observed

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// SuggestOptions say what to suggest policies for.
type SuggestOptions struct {
	// Namespace whose workloads get policies; required.
	Namespace string
	// Selector, when set, limits the workloads to those whose pods carry
	// all of these labels.
	Selector map[string]string
	// IncludeDropped admits dropped connections too (by default only
	// what was forwarded, or passed in audit, is admitted).
	IncludeDropped bool
}

// Suggestion is one workload's policy and what could not be expressed.
type Suggestion struct {
	Policy *networkingv1.NetworkPolicy
	// Connections is how many observed connections it admits.
	Connections int
}

// Suggest writes one NetworkPolicy per workload of the namespace seen in
// the connections: it selects the workload's pods by their workload labels
// and admits exactly the observed connections to them (ingress) and from
// them (egress), by the peers' labels (pods: their workload labels and,
// in another namespace, the namespace's name), ports and protocols; the
// world and other nodes by their addresses (/32 or /128 ipBlocks). Both
// policy types are always set, so a connection that was never observed is
// denied. Traffic between a pod and its own node needs no rule (Tendril
// always admits it).
func Suggest(conns []Connection, opts SuggestOptions) ([]Suggestion, error) {
	if opts.Namespace == "" {
		return nil, fmt.Errorf("suggest: a namespace is required")
	}
	type workload struct {
		labels  map[string]string
		ingress ruleAcc
		egress  ruleAcc
		conns   int
	}
	wls := map[string]*workload{}
	get := func(p Peer) *workload {
		if p.Kind != PeerPod || p.Namespace != opts.Namespace {
			return nil
		}
		wl := p.WorkloadLabels()
		for k, v := range opts.Selector {
			if wl[k] != v {
				return nil
			}
		}
		key := labelString(wl)
		w, ok := wls[key]
		if !ok {
			w = &workload{labels: wl, ingress: ruleAcc{}, egress: ruleAcc{}}
			wls[key] = w
		}
		return w
	}
	for _, c := range conns {
		if c.Verdict == flowpb.Verdict_DROPPED && !opts.IncludeDropped {
			continue
		}
		port := networkingv1.NetworkPolicyPort{Protocol: protocol(c.Proto), Port: ptr(intstr.FromInt32(int32(c.Port)))}
		if w := get(c.Dst); w != nil && c.Src.Kind != PeerHost {
			if pr, ok := peerRule(c.Src, opts.Namespace); ok {
				w.ingress.add(pr, port)
				w.conns++
			}
		}
		if w := get(c.Src); w != nil && c.Dst.Kind != PeerHost {
			if pr, ok := peerRule(c.Dst, opts.Namespace); ok {
				w.egress.add(pr, port)
				w.conns++
			}
		}
	}
	keys := make([]string, 0, len(wls))
	for k := range wls {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	used := map[string]int{}
	var out []Suggestion
	for _, k := range keys {
		w := wls[k]
		name := policyName(w.labels)
		if n := used[name]; n > 0 {
			used[name]++
			name = fmt.Sprintf("%s-%d", name, n+1)
		} else {
			used[name] = 1
		}
		np := &networkingv1.NetworkPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: opts.Namespace},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: w.labels},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{},
				Egress:      []networkingv1.NetworkPolicyEgressRule{},
			},
		}
		for _, r := range w.ingress.sorted() {
			np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{r.peer}, Ports: r.ports})
		}
		for _, r := range w.egress.sorted() {
			np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{r.peer}, Ports: r.ports})
		}
		out = append(out, Suggestion{Policy: np, Connections: w.conns})
	}
	return out, nil
}

// peerRule is how a rule names a peer: a pod by its workload labels (and
// its namespace's name when it is another namespace), anything else by
// its address.
func peerRule(p Peer, ns string) (networkingv1.NetworkPolicyPeer, bool) {
	switch p.Kind {
	case PeerPod:
		out := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: p.WorkloadLabels()}}
		if p.Namespace != ns {
			out.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: p.Namespace}}
		}
		return out, true
	case PeerWorld, PeerRemoteNode, PeerOther:
		if !p.IP.IsValid() {
			return networkingv1.NetworkPolicyPeer{}, false
		}
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("%s/%d", p.IP.Unmap(), p.IP.Unmap().BitLen())}}, true
	}
	return networkingv1.NetworkPolicyPeer{}, false
}

type rule struct {
	key   string
	peer  networkingv1.NetworkPolicyPeer
	ports []networkingv1.NetworkPolicyPort
}

type ruleAcc map[string]*rule

func (m ruleAcc) add(p networkingv1.NetworkPolicyPeer, port networkingv1.NetworkPolicyPort) {
	k := peerKey(p)
	r, ok := m[k]
	if !ok {
		r = &rule{key: k, peer: p}
		m[k] = r
	}
	if !slices.ContainsFunc(r.ports, func(q networkingv1.NetworkPolicyPort) bool {
		return *q.Protocol == *port.Protocol && q.Port.IntVal == port.Port.IntVal
	}) {
		r.ports = append(r.ports, port)
	}
}

func (m ruleAcc) sorted() []*rule {
	out := make([]*rule, 0, len(m))
	for _, r := range m {
		slices.SortFunc(r.ports, func(a, b networkingv1.NetworkPolicyPort) int {
			return cmp.Or(cmp.Compare(*a.Protocol, *b.Protocol), cmp.Compare(a.Port.IntVal, b.Port.IntVal))
		})
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *rule) int { return cmp.Compare(a.key, b.key) })
	return out
}

func peerKey(p networkingv1.NetworkPolicyPeer) string {
	var b strings.Builder
	if p.NamespaceSelector != nil {
		b.WriteString("ns:" + labelString(p.NamespaceSelector.MatchLabels) + ";")
	}
	if p.PodSelector != nil {
		b.WriteString("pod:" + labelString(p.PodSelector.MatchLabels) + ";")
	}
	if p.IPBlock != nil {
		b.WriteString("ip:" + p.IPBlock.CIDR)
	}
	return b.String()
}

var nameChars = regexp.MustCompile(`[^a-z0-9-]+`)

// policyName is "suggested-" and the workload's label values.
func policyName(wl map[string]string) string {
	keys := make([]string, 0, len(wl))
	for k := range wl {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := []string{"suggested"}
	for _, k := range keys {
		parts = append(parts, wl[k])
	}
	name := strings.Trim(nameChars.ReplaceAllString(strings.ToLower(strings.Join(parts, "-")), "-"), "-")
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	return name
}

func protocol(p uint8) *corev1.Protocol {
	var out corev1.Protocol
	switch p {
	case 17:
		out = corev1.ProtocolUDP
	case 132:
		out = corev1.ProtocolSCTP
	default:
		out = corev1.ProtocolTCP
	}
	return &out
}

func ptr[T any](v T) *T { return &v }
