package k8s

import (
	"sort"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Labels recorded on the rules of a NetworkPolicy (Cilium's keys, source
// k8s), so that `policy get` and `policy trace` show which object a rule
// comes from and the object's deletion removes exactly its rules.
const (
	KeyPolicyName        = "io.cilium.k8s.policy.name"
	KeyPolicyNamespace   = "io.cilium.k8s.policy.namespace"
	KeyPolicyDerivedFrom = "io.cilium.k8s.policy.derived-from"
	KeyPolicyUID         = "io.cilium.k8s.policy.uid"

	// The labels' string forms without their values ("source:key").
	LabelPolicyName        = labels.SourceK8s + ":" + KeyPolicyName
	LabelPolicyNamespace   = labels.SourceK8s + ":" + KeyPolicyNamespace
	LabelPolicyDerivedFrom = labels.SourceK8s + ":" + KeyPolicyDerivedFrom
	LabelPolicyUID         = labels.SourceK8s + ":" + KeyPolicyUID

	// DerivedFromNetworkPolicy is the derived-from value of NetworkPolicy
	// rules (a CiliumNetworkPolicy of the same name is another object).
	DerivedFromNetworkPolicy = "NetworkPolicy"
)

// KeyLabels are the labels that identify the rules of the NetworkPolicy
// namespace/name, whatever its UID: a policy deleted and created again
// under the same name replaces the old one's rules.
func KeyLabels(namespace, name string) api.LabelArray {
	return api.LabelArray{
		{Source: labels.SourceK8s, Key: KeyPolicyDerivedFrom, Value: DerivedFromNetworkPolicy},
		{Source: labels.SourceK8s, Key: KeyPolicyName, Value: name},
		{Source: labels.SourceK8s, Key: KeyPolicyNamespace, Value: namespace},
	}
}

// RuleLabels are the labels recorded on np's rules: KeyLabels and the UID.
func RuleLabels(np *networkingv1.NetworkPolicy) api.LabelArray {
	lbls := KeyLabels(np.Namespace, np.Name)
	if np.UID != "" {
		lbls = append(lbls, labels.Label{Source: labels.SourceK8s, Key: KeyPolicyUID, Value: string(np.UID)})
	}
	return lbls
}

// Source is the repository source of the NetworkPolicy namespace/name.
func Source(namespace, name string) string {
	return "k8s NetworkPolicy " + namespace + "/" + name
}

// EndpointLabels returns the identity labels of a pod of namespace ns: its
// labels with the k8s source, its namespace (policy.NamespaceLabel), and
// its namespace's labels (policy.NamespaceLabelsPrefix), sorted. Pod labels
// under the keys the agent sets itself are dropped, so a pod cannot pose
// as a member of another namespace.
func EndpointLabels(ns string, namespaceLabels, podLabels map[string]string) []string {
	out := make([]string, 0, len(podLabels)+len(namespaceLabels)+1)
	for k, v := range podLabels {
		if reservedPodLabel(k) {
			continue
		}
		out = append(out, podLabelPrefix+k+"="+v)
	}
	out = append(out, policy.NamespaceLabel+"="+ns)
	for k, v := range namespaceLabels {
		out = append(out, policy.NamespaceLabelsPrefix+k+"="+v)
	}
	sort.Strings(out)
	return out
}

// PodNamedPorts returns the named container ports of a pod (containers and
// restartable init containers, the sidecars that serve traffic); the
// protocol defaults to TCP, as in the pod spec.
func PodNamedPorts(pod *corev1.Pod) map[string]policy.NamedPort {
	out := map[string]policy.NamedPort{}
	add := func(c corev1.Container) {
		for _, p := range c.Ports {
			if p.Name == "" || p.ContainerPort < 1 || p.ContainerPort > 65535 {
				continue
			}
			proto, ok := protocolNumber(p.Protocol)
			if !ok {
				continue
			}
			out[p.Name] = policy.NamedPort{Port: uint16(p.ContainerPort), Proto: proto}
		}
	}
	for _, c := range pod.Spec.Containers {
		add(c)
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	return out
}

// EndpointForPod is what policy resolution needs of a pod in namespace ns.
func EndpointForPod(pod *corev1.Pod, ns *corev1.Namespace) policy.Endpoint {
	return policy.Endpoint{Labels: EndpointLabels(pod.Namespace, ns.Labels, pod.Labels), NamedPorts: PodNamedPorts(pod)}
}

func protocolNumber(p corev1.Protocol) (uint8, bool) {
	switch p {
	case "", corev1.ProtocolTCP:
		return api.ProtoTCP, true
	case corev1.ProtocolUDP:
		return api.ProtoUDP, true
	case corev1.ProtocolSCTP:
		return api.ProtoSCTP, true
	}
	return 0, false
}
