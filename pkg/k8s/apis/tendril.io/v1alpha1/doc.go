// Package v1alpha1 holds Tendril's custom resources, API group tendril.io,
// version v1alpha1: network policies (namespaced and clusterwide), security
// identities, endpoints and nodes. Clientset, listers and informers are
// generated from these types by `make generate` (hack/update-codegen.sh),
// and so are the CRD manifests under deploy/crds.
//
// +k8s:deepcopy-gen=package
// +kubebuilder:object:generate=true
// +groupName=tendril.io
package v1alpha1
