// Package k8s translates Kubernetes NetworkPolicy objects
// (networking.k8s.io/v1) into the policy engine's rules with the
// Kubernetes semantics, records on each rule which object it came from,
// and names the identity labels of pods (their labels, namespace and
// namespace labels) that those rules select.
//
// A NetworkPolicy becomes one rule whose endpointSelector is the policy's
// podSelector within its namespace, with one ingress (egress) section per
// ingress (egress) rule of the policy in each direction its policyTypes
// list, and one more allowing the pod's own node (always allowed in
// Kubernetes). The rule language's own defaults differ from Kubernetes'
// (an empty section selects no peer there, a peer selector defaults to the
// rule's namespace), so the translation spells everything out: peers
// absent become the entity "all", every selector names its namespace scope
// explicitly. docs/policy.md has the full mapping and the known gaps.
package k8s

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// podLabelPrefix is the source of a pod's Kubernetes labels on its
// identity: a podSelector key "app" selects the identity label "k8s:app".
const podLabelPrefix = "k8s:"

// AnnotationEnforcementMode puts a NetworkPolicy in audit mode ("audit"):
// what it would deny passes, reported with an AUDIT verdict naming it.
const AnnotationEnforcementMode = "policy.tendril.io/enforcement-mode"

// Translate turns a NetworkPolicy into rules for the repository (one rule,
// labelled with the policy's name, namespace, kind and UID). Invalid input
// (what the API server would refuse, and selectors on the label keys the
// agent reserves) is rejected whole; the error names the field.
func Translate(np *networkingv1.NetworkPolicy) (api.Rules, error) {
	if np == nil {
		return nil, errors.New("NetworkPolicy: nil")
	}
	if np.Name == "" {
		return nil, errors.New("NetworkPolicy: metadata.name: required")
	}
	if np.Namespace == "" {
		return nil, fmt.Errorf("NetworkPolicy %s: metadata.namespace: required (NetworkPolicy is namespaced)", np.Name)
	}
	rule, err := translator{namespace: np.Namespace}.rule(&np.Spec)
	if err != nil {
		return nil, fmt.Errorf("NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
	}
	rule.Labels = RuleLabels(np)
	rule.Description = "NetworkPolicy " + np.Namespace + "/" + np.Name
	switch mode := np.Annotations[AnnotationEnforcementMode]; mode {
	case "", api.ModeEnforce:
	case api.ModeAudit:
		rule.EnforcementMode = api.ModeAudit
	default:
		return nil, fmt.Errorf("NetworkPolicy %s/%s: metadata.annotations[%s]: %q: want %s or %s",
			np.Namespace, np.Name, AnnotationEnforcementMode, mode, api.ModeEnforce, api.ModeAudit)
	}
	// The engine's own validation is a second line: a failure here is a
	// translation bug, reported as such rather than stored.
	if err := rule.Validate(); err != nil {
		return nil, fmt.Errorf("NetworkPolicy %s/%s: translated rule invalid: %w", np.Namespace, np.Name, err)
	}
	return api.Rules{rule}, nil
}

// translator holds what every part of one policy's translation needs.
type translator struct {
	namespace string
}

// directions applies the policyTypes defaults: absent, a policy isolates
// ingress always and egress only when it has egress rules.
func directions(spec *networkingv1.NetworkPolicySpec) (ingress, egress bool, err error) {
	if len(spec.PolicyTypes) == 0 {
		return true, len(spec.Egress) > 0, nil
	}
	path := field.NewPath("spec", "policyTypes")
	for i, pt := range spec.PolicyTypes {
		switch pt {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		default:
			return false, false, field.NotSupported(path.Index(i), pt, []string{string(networkingv1.PolicyTypeIngress), string(networkingv1.PolicyTypeEgress)})
		}
	}
	return ingress, egress, nil
}

func (t translator) rule(spec *networkingv1.NetworkPolicySpec) (*api.Rule, error) {
	ingress, egress, err := directions(spec)
	if err != nil {
		return nil, err
	}
	sel, err := t.podSelector(&spec.PodSelector, field.NewPath("spec", "podSelector"))
	if err != nil {
		return nil, err
	}
	rule := &api.Rule{EndpointSelector: &sel}
	// Rules of a direction the policy does not isolate are ignored, but
	// still validated: the API server refuses them when malformed too.
	ingressRules := make([]api.IngressRule, 0, len(spec.Ingress)+1)
	for i, r := range spec.Ingress {
		path := field.NewPath("spec", "ingress").Index(i)
		p, err := t.peers(r.From, path.Child("from"))
		if err != nil {
			return nil, err
		}
		ports, err := translatePorts(r.Ports, path.Child("ports"))
		if err != nil {
			return nil, err
		}
		ingressRules = append(ingressRules, api.IngressRule{FromEndpoints: p.endpoints, FromEntities: p.entities, FromCIDRSet: p.cidrs, ToPorts: ports})
	}
	egressRules := make([]api.EgressRule, 0, len(spec.Egress)+1)
	for i, r := range spec.Egress {
		path := field.NewPath("spec", "egress").Index(i)
		p, err := t.peers(r.To, path.Child("to"))
		if err != nil {
			return nil, err
		}
		ports, err := translatePorts(r.Ports, path.Child("ports"))
		if err != nil {
			return nil, err
		}
		egressRules = append(egressRules, api.EgressRule{ToEndpoints: p.endpoints, ToEntities: p.entities, ToCIDRSet: p.cidrs, ToPorts: ports})
	}
	// Traffic between a pod and the node it runs on is always allowed
	// (Kubernetes: kubelet probes must reach isolated pods). The section
	// also makes an isolated direction with no rules deny everything else:
	// the engine enforces a direction in which a rule has a section.
	if ingress {
		rule.Ingress = append(ingressRules, api.IngressRule{FromEntities: []string{"host"}})
	}
	if egress {
		rule.Egress = append(egressRules, api.EgressRule{ToEntities: []string{"host"}})
	}
	return rule, nil
}

// peerSet is one rule's peers in the engine's terms.
type peerSet struct {
	endpoints []api.EndpointSelector
	entities  []string
	cidrs     []api.CIDRRule
}

// peers translates a from/to list: absent or empty means every peer, in
// and outside the cluster; otherwise the peers are ORed.
func (t translator) peers(list []networkingv1.NetworkPolicyPeer, path *field.Path) (peerSet, error) {
	var out peerSet
	if len(list) == 0 {
		out.entities = []string{"all"}
		return out, nil
	}
	for i, p := range list {
		pp := path.Index(i)
		switch {
		case p.IPBlock != nil && (p.PodSelector != nil || p.NamespaceSelector != nil):
			return peerSet{}, field.Forbidden(pp, "may not specify both ipBlock and another peer")
		case p.IPBlock != nil:
			c, err := translateIPBlock(p.IPBlock, pp.Child("ipBlock"))
			if err != nil {
				return peerSet{}, err
			}
			out.cidrs = append(out.cidrs, c)
		case p.NamespaceSelector != nil:
			sel, err := t.namespacedPeer(p.NamespaceSelector, p.PodSelector, pp)
			if err != nil {
				return peerSet{}, err
			}
			out.endpoints = append(out.endpoints, sel)
		case p.PodSelector != nil:
			sel, err := t.podSelector(p.PodSelector, pp.Child("podSelector"))
			if err != nil {
				return peerSet{}, err
			}
			out.endpoints = append(out.endpoints, sel)
		default:
			return peerSet{}, field.Required(pp, "must specify a peer (podSelector, namespaceSelector or ipBlock)")
		}
	}
	return out, nil
}

// podSelector selects pods of the policy's namespace by their labels.
func (t translator) podSelector(sel *metav1.LabelSelector, path *field.Path) (api.EndpointSelector, error) {
	if err := validatePodSelector(sel, path); err != nil {
		return api.EndpointSelector{}, err
	}
	out := prefixed(sel, podLabelPrefix)
	out.MatchLabels[policy.NamespaceLabel] = t.namespace
	return out, nil
}

// namespacedPeer selects the pods of the namespaces nsSel matches (every
// namespace when it is empty), narrowed by podSel when set: both selectors
// in one peer are ANDed.
func (t translator) namespacedPeer(nsSel, podSel *metav1.LabelSelector, path *field.Path) (api.EndpointSelector, error) {
	if errs := metav1validation.ValidateLabelSelector(nsSel, metav1validation.LabelSelectorValidationOptions{}, path.Child("namespaceSelector")); len(errs) > 0 {
		return api.EndpointSelector{}, errs.ToAggregate()
	}
	out := prefixed(nsSel, policy.NamespaceLabelsPrefix)
	// Only pods have a namespace: without this, a selector of only NotIn
	// or DoesNotExist would also select identities that are no pod. Naming
	// the namespace label also keeps the engine from scoping the peer to
	// the policy's own namespace.
	out.MatchExpressions = append(out.MatchExpressions, api.Requirement{Key: policy.NamespaceLabel, Operator: string(metav1.LabelSelectorOpExists)})
	if podSel != nil {
		if err := validatePodSelector(podSel, path.Child("podSelector")); err != nil {
			return api.EndpointSelector{}, err
		}
		pods := prefixed(podSel, podLabelPrefix)
		for k, v := range pods.MatchLabels {
			out.MatchLabels[k] = v
		}
		out.MatchExpressions = append(out.MatchExpressions, pods.MatchExpressions...)
	}
	return out, nil
}

// reservedPodLabel reports whether a pod label key is one the agent sets on
// identities itself: a pod must not claim another namespace or another
// namespace's labels by labelling itself, so such pod labels are dropped
// from identities (EndpointLabels) and selectors on them refused.
func reservedPodLabel(key string) bool {
	return key == strings.TrimPrefix(policy.NamespaceLabel, podLabelPrefix) ||
		strings.HasPrefix(key, strings.TrimPrefix(policy.NamespaceLabelsPrefix, podLabelPrefix)) ||
		strings.HasPrefix(key, "io.cilium.k8s.policy.")
}

func validatePodSelector(sel *metav1.LabelSelector, path *field.Path) error {
	if errs := metav1validation.ValidateLabelSelector(sel, metav1validation.LabelSelectorValidationOptions{}, path); len(errs) > 0 {
		return errs.ToAggregate()
	}
	for k := range sel.MatchLabels {
		if reservedPodLabel(k) {
			return field.Invalid(path.Child("matchLabels"), k, "label key reserved by the agent for namespace and policy metadata")
		}
	}
	for i, r := range sel.MatchExpressions {
		if reservedPodLabel(r.Key) {
			return field.Invalid(path.Child("matchExpressions").Index(i).Child("key"), r.Key, "label key reserved by the agent for namespace and policy metadata")
		}
	}
	return nil
}

// prefixed converts a validated label selector, prefixing its keys.
func prefixed(sel *metav1.LabelSelector, prefix string) api.EndpointSelector {
	out := api.EndpointSelector{MatchLabels: make(map[string]string, len(sel.MatchLabels)+1)}
	for k, v := range sel.MatchLabels {
		out.MatchLabels[prefix+k] = v
	}
	for _, r := range sel.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, api.Requirement{
			Key: prefix + r.Key, Operator: string(r.Operator), Values: append([]string(nil), r.Values...),
		})
	}
	return out
}

// translateIPBlock checks an ipBlock as the API server does: a CIDR, and
// exceptions strictly inside it. A CIDR with host bits set means its
// network, as it does to the API server's parser.
func translateIPBlock(b *networkingv1.IPBlock, path *field.Path) (api.CIDRRule, error) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return api.CIDRRule{}, field.Invalid(path.Child("cidr"), b.CIDR, "must be a CIDR (address/prefix length)")
	}
	cidr = cidr.Masked()
	out := api.CIDRRule{CIDR: cidr.String()}
	for i, e := range b.Except {
		ep, err := netip.ParsePrefix(e)
		if err != nil {
			return api.CIDRRule{}, field.Invalid(path.Child("except").Index(i), e, "must be a CIDR (address/prefix length)")
		}
		ep = ep.Masked()
		if ep.Addr().Is4() != cidr.Addr().Is4() || !cidr.Contains(ep.Addr()) || ep.Bits() <= cidr.Bits() {
			return api.CIDRRule{}, field.Invalid(path.Child("except").Index(i), e, "must be a strict subset of cidr "+cidr.String())
		}
		out.Except = append(out.Except, ep.String())
	}
	return out, nil
}

// translatePorts turns a ports list into one port rule: absent or empty
// means every port of every protocol; each entry is a protocol (TCP when
// unset) with a port, a port range, a container port name, or no port
// (every port of that protocol).
func translatePorts(ports []networkingv1.NetworkPolicyPort, path *field.Path) ([]api.PortRule, error) {
	if len(ports) == 0 {
		return nil, nil
	}
	out := make([]api.PortProtocol, 0, len(ports))
	for i, p := range ports {
		pp, err := translatePort(p, path.Index(i))
		if err != nil {
			return nil, err
		}
		out = append(out, pp)
	}
	return []api.PortRule{{Ports: out}}, nil
}

func translatePort(p networkingv1.NetworkPolicyPort, path *field.Path) (api.PortProtocol, error) {
	proto := corev1.ProtocolTCP
	if p.Protocol != nil {
		proto = *p.Protocol
	}
	switch proto {
	case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
	default:
		return api.PortProtocol{}, field.NotSupported(path.Child("protocol"), proto, []string{string(corev1.ProtocolTCP), string(corev1.ProtocolUDP), string(corev1.ProtocolSCTP)})
	}
	out := api.PortProtocol{Protocol: string(proto)}
	if p.Port == nil {
		if p.EndPort != nil {
			return api.PortProtocol{}, field.Forbidden(path.Child("endPort"), "may not be specified when port is not specified")
		}
		return out, nil
	}
	if p.Port.Type == intstr.String {
		if msgs := validation.IsValidPortName(p.Port.StrVal); len(msgs) > 0 {
			return api.PortProtocol{}, field.Invalid(path.Child("port"), p.Port.StrVal, strings.Join(msgs, "; "))
		}
		if p.EndPort != nil {
			return api.PortProtocol{}, field.Forbidden(path.Child("endPort"), "may not be specified when port is a name")
		}
		out.Port = p.Port.StrVal
		return out, nil
	}
	port := int(p.Port.IntVal)
	if msgs := validation.IsValidPortNum(port); len(msgs) > 0 {
		return api.PortProtocol{}, field.Invalid(path.Child("port"), port, strings.Join(msgs, "; "))
	}
	out.Port = strconv.Itoa(port)
	if p.EndPort != nil {
		end := int(*p.EndPort)
		if msgs := validation.IsValidPortNum(end); len(msgs) > 0 {
			return api.PortProtocol{}, field.Invalid(path.Child("endPort"), end, strings.Join(msgs, "; "))
		}
		if end < port {
			return api.PortProtocol{}, field.Invalid(path.Child("endPort"), end, fmt.Sprintf("must be greater than or equal to port %d", port))
		}
		out.EndPort = int32(end)
	}
	return out, nil
}
