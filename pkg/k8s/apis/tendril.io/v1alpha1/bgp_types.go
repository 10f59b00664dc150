package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TendrilBGPClusterConfig is the BGP control plane's cluster-wide
// configuration (after Cilium's CiliumBGPClusterConfig, v2): the nodes it
// selects run a BGP speaker with LocalASN and open a session to each of
// its peers. What they announce is the TendrilBGPAdvertisements its
// advertisementSelector picks; a prefix outside what the node was given
// (its pod CIDRs, LoadBalancer addresses from a TendrilLoadBalancerIPPool)
// is never announced, whatever they say.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster,categories=tendril;tendrilbgp,shortName=tbgpcc,singular=tendrilbgpclusterconfig
// +kubebuilder:storageversion
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="ASN",type=integer,JSONPath=`.spec.localASN`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TendrilBGPClusterConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`

	Spec BGPClusterConfigSpec `json:"spec"`
	// +optional
	Status BGPClusterConfigStatus `json:"status,omitempty"`
}

// TendrilBGPClusterConfigList is a list of TendrilBGPClusterConfig.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type TendrilBGPClusterConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []TendrilBGPClusterConfig `json:"items"`
}

// BGPClusterConfigSpec selects the nodes and names their peers.
type BGPClusterConfigSpec struct {
	// NodeSelector picks the nodes that run this configuration; none:
	// every node. A node two configurations select runs the first by
	// name and reports the other in its status.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// LocalASN is the nodes' autonomous system number.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	LocalASN int64 `json:"localASN"`
	// Peers are the routers every selected node opens a session to.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Peers []BGPPeer `json:"peers,omitempty"`
	// AdvertisementSelector picks the TendrilBGPAdvertisements announced
	// to every peer (by their labels); none: nothing is announced.
	// +optional
	AdvertisementSelector *metav1.LabelSelector `json:"advertisementSelector,omitempty"`
}

// BGPPeer is one router the nodes peer with.
type BGPPeer struct {
	// Name names the peer in the status and the metrics.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// PeerAddress is the router's IPv4 or IPv6 address.
	// +kubebuilder:validation:MinLength=2
	PeerAddress string `json:"peerAddress"`
	// PeerASN is the router's autonomous system number.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	PeerASN int64 `json:"peerASN"`
	// PeerConfigRef names the TendrilBGPPeerConfig with the session's
	// timers and graceful restart; none: the defaults.
	// +optional
	PeerConfigRef string `json:"peerConfigRef,omitempty"`
}

// BGPClusterConfigStatus is each selected node's report.
type BGPClusterConfigStatus struct {
	// Nodes are the selected nodes' reports, by node name, each
	// written by its own agent.
	// +optional
	// +listType=map
	// +listMapKey=node
	Nodes []BGPNodeStatus `json:"nodes,omitempty"`
}

// BGPNodeStatus is one node's view of its configuration and sessions.
type BGPNodeStatus struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Error says why the configuration is not applied (empty: it is).
	// +optional
	Error string `json:"error,omitempty"`
	// Peers are the sessions' states.
	// +optional
	Peers []BGPPeerStatus `json:"peers,omitempty"`
	// Advertised counts the prefixes the node announces.
	// +optional
	Advertised int `json:"advertised,omitempty"`
	// Refused are the prefixes an advertisement asked for that the node
	// did not announce, with the reason.
	// +optional
	Refused []string `json:"refused,omitempty"`
}

// BGPPeerStatus is one session's state on one node.
type BGPPeerStatus struct {
	Name string `json:"name"`
	// State is the session state (RFC 4271 8.2.2: idle, connect,
	// active, opensent, openconfirm, established).
	State string `json:"state"`
	// Reason is the last error of a session that is not established.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// TendrilBGPPeerConfig is a session template a TendrilBGPClusterConfig's
// peers refer to by name (after Cilium's CiliumBGPPeerConfig): the
// timers and graceful restart.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster,categories=tendril;tendrilbgp,shortName=tbgppc,singular=tendrilbgppeerconfig
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TendrilBGPPeerConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`

	Spec BGPPeerConfigSpec `json:"spec"`
}

// TendrilBGPPeerConfigList is a list of TendrilBGPPeerConfig.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type TendrilBGPPeerConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []TendrilBGPPeerConfig `json:"items"`
}

// BGPPeerConfigSpec are a session's settings.
type BGPPeerConfigSpec struct {
	// Timers of the session; unset fields take RFC 4271's suggested
	// values (hold 90 s, keepalive 30 s, connect retry 120 s).
	// +optional
	Timers *BGPTimers `json:"timers,omitempty"`
	// GracefulRestart (RFC 4724) lets the router keep a restarting
	// node's routes for restartTimeSeconds.
	// +optional
	GracefulRestart *BGPGracefulRestart `json:"gracefulRestart,omitempty"`
	// EBGPMultihop is the TTL of an eBGP session's packets (1: the
	// router is directly connected).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	// +optional
	EBGPMultihop *int32 `json:"ebgpMultihop,omitempty"`
	// PeerPort is the router's TCP port (default 179).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	PeerPort *int32 `json:"peerPort,omitempty"`
	// AuthSecretRef names a Secret in the agents' BGP secrets namespace
	// (--bgp-secrets-namespace, kube-system by default) whose key
	// "password" is the session's TCP MD5 password (RFC 2385). A session
	// whose Secret or key is missing is not opened.
	// +optional
	AuthSecretRef *string `json:"authSecretRef,omitempty"`
}

// BGPTimers are a session's timers, in seconds.
type BGPTimers struct {
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	ConnectRetryTimeSeconds *int32 `json:"connectRetryTimeSeconds,omitempty"`
	// HoldTimeSeconds: 0 or at least 3 (RFC 4271 4.2).
	// +kubebuilder:validation:Minimum=3
	// +kubebuilder:validation:Maximum=65535
	// +optional
	HoldTimeSeconds *int32 `json:"holdTimeSeconds,omitempty"`
	// KeepAliveTimeSeconds: below the hold time.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	KeepAliveTimeSeconds *int32 `json:"keepAliveTimeSeconds,omitempty"`
}

// BGPGracefulRestart is RFC 4724's capability.
type BGPGracefulRestart struct {
	Enabled bool `json:"enabled"`
	// RestartTimeSeconds is how long the router keeps the routes of a
	// node whose session dropped (default 120).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4095
	// +optional
	RestartTimeSeconds *int32 `json:"restartTimeSeconds,omitempty"`
}

// TendrilBGPAdvertisement says what the nodes announce (after Cilium's
// CiliumBGPAdvertisement); TendrilBGPClusterConfigs pick advertisements
// by label.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:resource:scope=Cluster,categories=tendril;tendrilbgp,shortName=tbgpadvert,singular=tendrilbgpadvertisement
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TendrilBGPAdvertisement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`

	Spec BGPAdvertisementSpec `json:"spec"`
}

// TendrilBGPAdvertisementList is a list of TendrilBGPAdvertisement.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type TendrilBGPAdvertisementList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []TendrilBGPAdvertisement `json:"items"`
}

// BGPAdvertisementSpec lists what is announced.
type BGPAdvertisementSpec struct {
	// +kubebuilder:validation:MinItems=1
	Advertisements []BGPAdvertisementEntry `json:"advertisements"`
}

// BGPAdvertisementEntry is one kind of prefix to announce.
//
// +kubebuilder:validation:XValidation:rule="self.advertisementType == 'Service' ? has(self.service) : !has(self.service)",message="service is set exactly when advertisementType is Service"
type BGPAdvertisementEntry struct {
	// AdvertisementType is PodCIDR (the node's own pod CIDRs) or
	// Service (addresses of the Services the service selector picks).
	// +kubebuilder:validation:Enum=PodCIDR;Service
	AdvertisementType string `json:"advertisementType"`
	// Service picks the Services and which of their addresses.
	// +optional
	Service *BGPServiceAdvertisement `json:"service,omitempty"`
	// Attributes are the BGP path attributes the entry's prefixes carry.
	// A prefix two entries announce carries both entries' communities and
	// the higher local preference.
	// +optional
	Attributes *BGPAttributes `json:"attributes,omitempty"`
}

// BGPAttributes are path attributes of announced prefixes (Cilium's
// CiliumBGPAdvertisement attributes).
type BGPAttributes struct {
	// Communities are RFC 1997 and RFC 8092 communities.
	// +optional
	Communities *BGPCommunities `json:"communities,omitempty"`
	// LocalPreference is the LOCAL_PREF sent to iBGP peers (eBGP peers
	// never get it, RFC 4271).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	// +optional
	LocalPreference *int64 `json:"localPreference,omitempty"`
}

// BGPCommunities are the communities of announced prefixes.
type BGPCommunities struct {
	// Standard communities: "ASN:value" (each 0-65535) or one decimal
	// 32-bit number.
	// +optional
	Standard []string `json:"standard,omitempty"`
	// WellKnown communities by name: no-export, no-advertise,
	// no-export-subconfed, no-peer, blackhole, graceful-shutdown,
	// accept-own, llgr-stale, no-llgr.
	// +optional
	WellKnown []string `json:"wellKnown,omitempty"`
	// Large communities (RFC 8092): "global:local1:local2", each a 32-bit
	// number.
	// +optional
	Large []string `json:"large,omitempty"`
}

// Advertisement types.
const (
	BGPAdvertPodCIDR = "PodCIDR"
	BGPAdvertService = "Service"
)

// BGPServiceAdvertisement picks Services and their addresses.
type BGPServiceAdvertisement struct {
	// Selector picks the Services by label; none: every Service.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	// Addresses are the kinds of address announced: LoadBalancerIP
	// (status.loadBalancer.ingress addresses that lie in a
	// TendrilLoadBalancerIPPool serving the Service), ExternalIP
	// (spec.externalIPs, under the same pool rule: anyone who may create a
	// Service may write any external IP), ClusterIP (the cluster IPs, inside
	// the cluster's ServiceCIDRs).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:items:Enum=LoadBalancerIP;ExternalIP;ClusterIP
	Addresses []string `json:"addresses"`
}

// BGPServiceAddressLoadBalancerIP is a Service's load-balancer ingress
// address.
const BGPServiceAddressLoadBalancerIP = "LoadBalancerIP"

// BGPServiceAddressExternalIP is a Service's spec.externalIPs address.
const BGPServiceAddressExternalIP = "ExternalIP"

// BGPServiceAddressClusterIP is a Service's cluster IP.
const BGPServiceAddressClusterIP = "ClusterIP"
