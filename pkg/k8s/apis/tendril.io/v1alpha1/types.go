package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/policy/api"
)

// TendrilNetworkPolicy is a namespaced policy in the CiliumNetworkPolicy
// schema: one rule in spec, several in specs (either or both). Its endpoint
// selectors only select endpoints of its own namespace.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:categories=tendril;tendrilpolicy,shortName=tnp,singular=tendrilnetworkpolicy
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Valid",type=string,JSONPath=`.status.conditions[?(@.type=="Valid")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TendrilNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`

	// Spec is the policy rule.
	// +optional
	Spec *api.Rule `json:"spec,omitempty"`
	// Specs is a list of policy rules.
	// +optional
	Specs api.Rules `json:"specs,omitempty"`
	// Status is written by the agents.
	// +optional
	Status NetworkPolicyStatus `json:"status,omitempty"`
}

// TendrilNetworkPolicyList is a list of TendrilNetworkPolicy.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type TendrilNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []TendrilNetworkPolicy `json:"items"`
}

// TendrilClusterwideNetworkPolicy is a cluster-scoped policy in the
// CiliumNetworkPolicy schema; its selectors span every namespace, and a
// rule may select nodes (nodeSelector) for host policies.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster,categories=tendril;tendrilpolicy,shortName=tcnp,singular=tendrilclusterwidenetworkpolicy
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Valid",type=string,JSONPath=`.status.conditions[?(@.type=="Valid")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TendrilClusterwideNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`

	// Spec is the policy rule.
	// +optional
	Spec *api.Rule `json:"spec,omitempty"`
	// Specs is a list of policy rules.
	// +optional
	Specs api.Rules `json:"specs,omitempty"`
	// Status is written by the agents.
	// +optional
	Status NetworkPolicyStatus `json:"status,omitempty"`
}

// TendrilClusterwideNetworkPolicyList is a list of
// TendrilClusterwideNetworkPolicy.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type TendrilClusterwideNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []TendrilClusterwideNetworkPolicy `json:"items"`
}

// NetworkPolicyStatus reports whether the agents accepted a policy. A policy
// that fails validation is rejected whole: condition Valid=False with the
// reason in its message, and none of its rules are enforced.
type NetworkPolicyStatus struct {
	// Conditions: Valid.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Nodes is each agent's report on the policy, by node name: whether
	// its node imported it and enforces it on every local endpoint, and at
	// which policy revision. Each agent writes only its own key (a merge
	// patch of the status), so agents never overwrite one another.
	// +optional
	Nodes map[string]NodePolicyStatus `json:"nodes,omitempty"`
}

// NodePolicyStatus is one node's report on a policy.
type NodePolicyStatus struct {
	// OK is true when the node imported the policy into its repository.
	OK bool `json:"ok"`
	// Error says why the node rejected the policy.
	// +optional
	Error string `json:"error,omitempty"`
	// Enforcing is true once every endpoint of the node has realized the
	// revision that imported the policy (or a later one).
	Enforcing bool `json:"enforcing"`
	// LocalPolicyRevision is the node's policy revision that imported
	// the policy.
	// +optional
	LocalPolicyRevision uint64 `json:"localPolicyRevision,omitempty"`
	// ObservedGeneration is the object's generation the report is about.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// AuditedConnections counts, for a policy in audit mode, the
	// connections on this node it would have denied and let pass, since
	// the node's agent started.
	// +optional
	AuditedConnections uint64 `json:"auditedConnections,omitempty"`
	// LastUpdated is when the node last changed its report.
	// +optional
	LastUpdated metav1.Time `json:"lastUpdated,omitempty"`
}

// ConditionValid is the condition type saying whether a policy validated.
const ConditionValid = "Valid"

// TendrilIdentity is a cluster-wide security identity in CRD allocation
// mode: the object's name is the numeric identity, its labels are the
// security-relevant labels it stands for. Agents create one per new label
// set; the create conflicts when another agent took the number first.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster,categories=tendril,shortName=tid,singular=tendrilidentity
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.metadata.labels.io\.kubernetes\.pod\.namespace`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TendrilIdentity struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`

	// SecurityLabels are the identity's labels, keyed "source:key".
	// +kubebuilder:validation:Required
	SecurityLabels map[string]string `json:"security-labels"`
}

// TendrilIdentityList is a list of TendrilIdentity.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type TendrilIdentityList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []TendrilIdentity `json:"items"`
}

// TendrilEndpoint publishes one local endpoint (a pod's network presence)
// to the cluster: its identity and addresses, so other nodes can map the
// addresses to the identity in their ipcache. Named after the pod, in the
// pod's namespace; written by the agent of the pod's node.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:categories=tendril,shortName=tep,singular=tendrilendpoint
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Endpoint ID",type=integer,JSONPath=`.status.id`
// +kubebuilder:printcolumn:name="Identity ID",type=integer,JSONPath=`.status.identity.id`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="IPv4",type=string,JSONPath=`.status.networking.addressing[0].ipv4`
// +kubebuilder:printcolumn:name="IPv6",type=string,JSONPath=`.status.networking.addressing[0].ipv6`
type TendrilEndpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`

	// +optional
	Status EndpointStatus `json:"status,omitempty"`
}

// TendrilEndpointList is a list of TendrilEndpoint.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type TendrilEndpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []TendrilEndpoint `json:"items"`
}

// EndpointStatus is the published state of an endpoint.
type EndpointStatus struct {
	// ID is the endpoint's node-local ID.
	// +optional
	ID int64 `json:"id,omitempty"`
	// Identity is the endpoint's security identity.
	// +optional
	Identity *EndpointIdentity `json:"identity,omitempty"`
	// Networking holds the endpoint's addresses and its node.
	// +optional
	Networking *EndpointNetworking `json:"networking,omitempty"`
	// State is the endpoint's state (ready, regenerating, ...).
	// +optional
	State string `json:"state,omitempty"`
	// NamedPorts are the pod's named container ports, so peers can
	// resolve named ports in egress rules.
	// +optional
	NamedPorts []NamedPort `json:"named-ports,omitempty"`
}

// EndpointIdentity is an identity with its labels.
type EndpointIdentity struct {
	// +kubebuilder:validation:Minimum=0
	ID int64 `json:"id"`
	// +optional
	Labels []string `json:"labels,omitempty"`
}

// EndpointNetworking is where an endpoint lives.
type EndpointNetworking struct {
	// +optional
	Addressing []AddressPair `json:"addressing,omitempty"`
	// NodeIP is the address of the endpoint's node.
	// +optional
	NodeIP string `json:"node,omitempty"`
}

// AddressPair is an endpoint's IPv4 and IPv6 address.
type AddressPair struct {
	// +optional
	IPv4 string `json:"ipv4,omitempty"`
	// +optional
	IPv6 string `json:"ipv6,omitempty"`
}

// NamedPort is a named container port.
type NamedPort struct {
	Name string `json:"name"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
	// +kubebuilder:validation:Enum=TCP;UDP;SCTP
	// +optional
	Protocol string `json:"protocol,omitempty"`
}

// TendrilNode describes a node of the cluster as the agents need it: its
// addresses and the pod CIDRs it allocates from. The agent of the node
// writes it; the other agents route to it.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster,categories=tendril,shortName=tn,singular=tendrilnode
// +kubebuilder:storageversion
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Pod CIDRs",type=string,JSONPath=`.spec.ipam.podCIDRs`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TendrilNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`

	Spec NodeSpec `json:"spec"`
	// +optional
	Status NodeStatus `json:"status,omitempty"`
}

// TendrilNodeList is a list of TendrilNode.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type TendrilNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []TendrilNode `json:"items"`
}

// NodeSpec is a node's addresses and address management.
type NodeSpec struct {
	// Addresses of the node.
	// +optional
	Addresses []NodeAddress `json:"addresses,omitempty"`
	// IPAM holds the node's pod CIDRs.
	// +optional
	IPAM IPAMSpec `json:"ipam,omitempty"`
	// Encryption is what the other nodes need to encrypt traffic to this
	// node (--enable-wireguard).
	// +optional
	Encryption NodeEncryption `json:"encryption,omitempty"`
}

// NodeEncryption is a node's public encryption material.
type NodeEncryption struct {
	// WireGuardPublicKey is the node's WireGuard public key (base64 of 32
	// bytes). The private key never leaves the node. Readers check it
	// again: the schema's pattern is not all a malformed key can be.
	// +optional
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$`
	WireGuardPublicKey string `json:"wireguardPublicKey,omitempty"`
}

// NodeAddress is one address of a node.
type NodeAddress struct {
	// Type is InternalIP, ExternalIP, TendrilInternalIP (the router IP) or
	// TendrilHealthIP (the address of the node's health endpoint, Cilium's
	// health.ipv4/ipv6; readers accept it only inside the node's pod CIDR).
	// +kubebuilder:validation:Enum=InternalIP;ExternalIP;TendrilInternalIP;TendrilHealthIP
	Type string `json:"type"`
	// IP is an IPv4 or IPv6 address.
	// +kubebuilder:validation:MinLength=2
	IP string `json:"ip"`
}

// NodeAddressHealthIP is the NodeAddress type of a node's health
// endpoint address.
const NodeAddressHealthIP = "TendrilHealthIP"

// IPAMSpec lists the CIDRs the node allocates pod addresses from.
type IPAMSpec struct {
	// PodCIDRs: at most one per family.
	// +optional
	// +kubebuilder:validation:MaxItems=2
	PodCIDRs []string `json:"podCIDRs,omitempty"`
}

// NodeConditionPodCIDRsAllocated is the TendrilNode condition
// tendril-operator's cluster-pool IPAM writes: True (reason Allocated), or
// False (reason NodeReasonPodCIDRPoolExhausted) when a pool had no CIDR
// left for a family the node lacks.
const NodeConditionPodCIDRsAllocated = "PodCIDRsAllocated"

// NodeReasonPodCIDRPoolExhausted is the reason of a False
// NodeConditionPodCIDRsAllocated.
const NodeReasonPodCIDRPoolExhausted = "PodCIDRPoolExhausted"

// NodeStatus is what the node's agent reports.
type NodeStatus struct {
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// TendrilLoadBalancerIPPool is a pool of addresses from which
// tendril-operator gives Services of type LoadBalancer their
// status.loadBalancer.ingress addresses (issue 16, LB IPAM). Pools are
// cluster-wide; a pool serves the Services its serviceSelector matches
// (all of them without one).
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster,categories=tendril,shortName=tlbpool,singular=tendrilloadbalancerippool
// +kubebuilder:storageversion
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Disabled",type=boolean,JSONPath=`.spec.disabled`
// +kubebuilder:printcolumn:name="Exhausted",type=string,JSONPath=`.status.conditions[?(@.type=="Exhausted")].status`
// +kubebuilder:printcolumn:name="Used",type=string,JSONPath=`.status.conditions[?(@.type=="Exhausted")].message`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TendrilLoadBalancerIPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`

	Spec LoadBalancerIPPoolSpec `json:"spec"`
	// +optional
	Status LoadBalancerIPPoolStatus `json:"status,omitempty"`
}

// TendrilLoadBalancerIPPoolList is a list of TendrilLoadBalancerIPPool.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type TendrilLoadBalancerIPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []TendrilLoadBalancerIPPool `json:"items"`
}

// LoadBalancerIPPoolSpec is what a pool holds and whom it serves.
type LoadBalancerIPPoolSpec struct {
	// Blocks are the pool's addresses: CIDRs and start/stop ranges, IPv4
	// and IPv6.
	// +kubebuilder:validation:MinItems=1
	Blocks []LoadBalancerIPBlock `json:"blocks"`
	// ServiceSelector picks the Services the pool serves; none: every
	// Service.
	// +optional
	ServiceSelector *metav1.LabelSelector `json:"serviceSelector,omitempty"`
	// Disabled stops new assignments from the pool; addresses already
	// assigned stay with their Services.
	// +optional
	Disabled bool `json:"disabled,omitempty"`
	// L2Announcements opts the pool's addresses in to L2 announcements
	// (agents with --enable-l2-announcements answer ARP for them): an
	// address outside every pool that sets it is never announced.
	// +optional
	L2Announcements *L2AnnouncementPolicy `json:"l2Announcements,omitempty"`
}

// L2AnnouncementPolicy says which of a pool's addresses the agents
// announce, from which nodes and on which interfaces (after Cilium's
// CiliumL2AnnouncementPolicy, bound to the pool's blocks). Whatever it
// says, no node announces a node's address, the gateway of the device's
// subnet, or an address another Service's announcement holds.
type L2AnnouncementPolicy struct {
	// ServiceSelector narrows the Services whose addresses are announced
	// (within those the pool serves); none: all of them.
	// +optional
	ServiceSelector *metav1.LabelSelector `json:"serviceSelector,omitempty"`
	// NodeSelector picks the nodes that may announce; none: every node.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// Interfaces are regular expressions, matched against the whole
	// name, of the devices to announce on (of the host programs'
	// devices); none: every device on the address's subnet.
	// +optional
	Interfaces []string `json:"interfaces,omitempty"`
	// LoadBalancerIPs announces the Services' load-balancer ingress
	// addresses that lie in the pool's blocks (default true).
	// +optional
	LoadBalancerIPs *bool `json:"loadBalancerIPs,omitempty"`
	// ExternalIPs also announces the Services' spec.externalIPs that lie
	// in the pool's blocks (default false: whoever may create a Service
	// may set them, CVE-2020-8554).
	// +optional
	ExternalIPs bool `json:"externalIPs,omitempty"`
}

// LoadBalancerIPBlock is a CIDR, or a range from start to stop (both
// included). In a CIDR of more than two IPv4 addresses the network and
// broadcast addresses are not handed out.
//
// +kubebuilder:validation:XValidation:rule="has(self.cidr) ? !has(self.start) && !has(self.stop) : has(self.start) && has(self.stop)",message="a block is either cidr, or start and stop"
type LoadBalancerIPBlock struct {
	// CIDR such as 172.30.1.0/28 or fd00:30:1::/120.
	// +optional
	CIDR string `json:"cidr,omitempty"`
	// Start is the first address of a range.
	// +optional
	Start string `json:"start,omitempty"`
	// Stop is the last address of a range, of Start's family.
	// +optional
	Stop string `json:"stop,omitempty"`
}

// LoadBalancerIPPoolStatus is the operator's report on a pool.
type LoadBalancerIPPoolStatus struct {
	// Conditions: Valid (the blocks parse) and Exhausted (no address
	// left; its message counts the used ones and the Services waiting).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Conditions of a TendrilLoadBalancerIPPool.
const (
	PoolConditionValid     = "Valid"
	PoolConditionExhausted = "Exhausted"
)
