package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of every Tendril resource.
const GroupName = "tendril.io"

// SchemeGroupVersion is the group and version the types register under.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource names (plural, as in the CRDs and the REST paths).
const (
	ResourceNetworkPolicies            = "tendrilnetworkpolicies"
	ResourceClusterwideNetworkPolicies = "tendrilclusterwidenetworkpolicies"
	ResourceIdentities                 = "tendrilidentities"
	ResourceEndpoints                  = "tendrilendpoints"
	ResourceNodes                      = "tendrilnodes"
	ResourceLoadBalancerIPPools        = "tendrilloadbalancerippools"
	ResourceBGPClusterConfigs          = "tendrilbgpclusterconfigs"
	ResourceBGPPeerConfigs             = "tendrilbgppeerconfigs"
	ResourceBGPAdvertisements          = "tendrilbgpadvertisements"
	ResourceLocalRedirectPolicies      = "tendrillocalredirectpolicies"
)

// Resource qualifies a resource name with the group.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

// AddToScheme registers the types; the generated clientset uses it.
func AddToScheme(scheme *runtime.Scheme) error { return addKnownTypes(scheme) }

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&TendrilNetworkPolicy{}, &TendrilNetworkPolicyList{},
		&TendrilClusterwideNetworkPolicy{}, &TendrilClusterwideNetworkPolicyList{},
		&TendrilIdentity{}, &TendrilIdentityList{},
		&TendrilEndpoint{}, &TendrilEndpointList{},
		&TendrilNode{}, &TendrilNodeList{},
		&TendrilLoadBalancerIPPool{}, &TendrilLoadBalancerIPPoolList{},
		&TendrilBGPClusterConfig{}, &TendrilBGPClusterConfigList{},
		&TendrilBGPPeerConfig{}, &TendrilBGPPeerConfigList{},
		&TendrilBGPAdvertisement{}, &TendrilBGPAdvertisementList{},
		&TendrilLocalRedirectPolicy{}, &TendrilLocalRedirectPolicyList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
