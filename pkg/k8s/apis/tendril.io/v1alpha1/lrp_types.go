package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TendrilLocalRedirectPolicy redirects the traffic of this node's pods
// for an address and ports, or for a Service of the policy's own
// namespace, to pods of that namespace on the same node (after Cilium's
// CiliumLocalRedirectPolicy; the node-local DNS cache is the classic use).
// Every agent applies it with the pods it selects on its own node: a
// serviceMatcher falls back to the Service's own backends while the node
// has none, an addressMatcher stops redirecting. The agent checks the
// object whole and refuses it (logged, not applied) when any part is
// wrong.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:categories=tendril,shortName=tlrp,singular=tendrillocalredirectpolicy
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TendrilLocalRedirectPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`

	Spec LocalRedirectPolicySpec `json:"spec"`
}

// TendrilLocalRedirectPolicyList is a list of TendrilLocalRedirectPolicy.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type TendrilLocalRedirectPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []TendrilLocalRedirectPolicy `json:"items"`
}

// LocalRedirectPolicySpec is what is redirected and where to.
type LocalRedirectPolicySpec struct {
	// RedirectFrontend is the traffic redirected: exactly one of
	// addressMatcher and serviceMatcher.
	RedirectFrontend RedirectFrontend `json:"redirectFrontend"`
	// RedirectBackend selects the pods on the node it goes to.
	RedirectBackend RedirectBackend `json:"redirectBackend"`
	// SkipRedirectFromBackend: traffic from the selected backend pods
	// themselves to the frontend is not redirected back to a local
	// backend but goes where it would without the policy (a
	// serviceMatcher's Service backends, an addressMatcher's address).
	// Applied by the socket load-balancer (the pods by their network
	// namespaces) and the per-packet NAT (by their addresses).
	// +optional
	SkipRedirectFromBackend bool `json:"skipRedirectFromBackend,omitempty"`
	// Description is free text.
	// +optional
	Description string `json:"description,omitempty"`
}

// RedirectFrontend is an address with ports, or a Service.
type RedirectFrontend struct {
	// AddressMatcher redirects an IP address on the listed ports.
	// +optional
	AddressMatcher *LRPAddressMatcher `json:"addressMatcher,omitempty"`
	// ServiceMatcher redirects a ClusterIP Service of the policy's
	// namespace.
	// +optional
	ServiceMatcher *LRPServiceMatcher `json:"serviceMatcher,omitempty"`
}

// LRPAddressMatcher is an address and its ports.
type LRPAddressMatcher struct {
	// IP is an IPv4 or IPv6 address (an agent may allow only the
	// ranges its --lrp-address-matcher-cidrs lists).
	IP string `json:"ip"`
	// ToPorts are the ports redirected (at least one; named when more
	// than one, to pair with the backend's ports).
	ToPorts []LRPPort `json:"toPorts"`
}

// LRPServiceMatcher names a Service.
type LRPServiceMatcher struct {
	// ServiceName is the Service's name.
	ServiceName string `json:"serviceName"`
	// Namespace is the Service's namespace; it must be the policy's.
	Namespace string `json:"namespace"`
	// ToPorts are the Service's ports redirected (by name, else by port
	// and protocol); none: every port.
	// +optional
	ToPorts []LRPPort `json:"toPorts,omitempty"`
}

// RedirectBackend selects the pods on the node and their ports.
type RedirectBackend struct {
	// LocalEndpointSelector selects pods of the policy's namespace.
	LocalEndpointSelector metav1.LabelSelector `json:"localEndpointSelector"`
	// ToPorts are the pods' ports; with more than one, each is named
	// as the frontend port it serves.
	ToPorts []LRPPort `json:"toPorts"`
}

// LRPPort is a port, its protocol and its name.
type LRPPort struct {
	// Port is the port number, 1-65535 (a string, as in Cilium's
	// policies; the agent checks it).
	Port string `json:"port"`
	// Protocol is TCP or UDP (default TCP).
	// +optional
	Protocol string `json:"protocol,omitempty"`
	// Name pairs a frontend port with a backend port.
	// +optional
	Name string `json:"name,omitempty"`
}
