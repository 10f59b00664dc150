// Package observer turns the datapath's events into Hubble flows
// (github.com/cilium/cilium/api/v1/flow): it decodes each event with what
// the node knows (identities and their labels, pods and namespaces, policy
// rules), keeps the flows in a fixed-size ring, and answers GetFlows-style
// queries over it (allow and deny filter lists, number, first, follow,
// since, until). It knows nothing of gRPC (package hubble serves it) nor of
// Kubernetes (the agent implements NodeKnowledge).
package observer

import "net/netip"

// NodeKnowledge is what the node knows that the events do not carry. The
// agent implements it over its tables; every method must be cheap and safe
// for concurrent use (the decoder calls it for every event).
type NodeKnowledge interface {
	// NodeName is this node's name, as flows and GetNodes report it.
	NodeName() string
	// IdentityLabels returns the labels of a security identity in
	// "source:key=value" form (k8s:app=web, reserved:world), or nil.
	IdentityLabels(identity uint32) []string
	// EndpointByID returns a local endpoint by its endpoint ID.
	EndpointByID(id uint16) (Endpoint, bool)
	// EndpointByIP returns the endpoint (local or on another node) that
	// holds an address.
	EndpointByIP(ip netip.Addr) (Endpoint, bool)
	// PolicyByCookie names the policy rule a datapath rule cookie stands
	// for; cookie 0 is never asked (it is the default deny).
	PolicyByCookie(cookie uint32) (Policy, bool)
}

// ServiceKnowledge is what a NodeKnowledge may also know: the services
// of the node's load balancer, so a flow names the service it went to.
type ServiceKnowledge interface {
	// ServiceByAddr names the service an address and port (and IP
	// protocol) belong to: one of its frontends (a cluster IP) or, since
	// the socket load balancer translates before the datapath sees the
	// packet, one of its backends.
	ServiceByAddr(addr netip.AddrPort, proto uint8) (Service, bool)
}

// CgroupKnowledge is what a NodeKnowledge may also know: the pod a cgroup
// belongs to, so that a socket load-balancer flow (whose event carries the
// connecting process's cgroup, no address) names its client pod.
type CgroupKnowledge interface {
	EndpointByCgroup(cgroupID uint64) (Endpoint, bool)
}

// DefaultDenyKnowledge is what a NodeKnowledge may also know: the
// policies that put a local endpoint into default deny in a direction
// (the rules selecting it there), so a default-deny drop names them.
type DefaultDenyKnowledge interface {
	DefaultDenyPolicies(endpointID uint16, ingress bool) []Policy
}

// Service is a service as flows name it.
type Service struct {
	Namespace, Name string
}

// Endpoint is a pod (or another workload) as flows name it.
type Endpoint struct {
	// ID is the endpoint ID on its node (0 when not known).
	ID uint32
	// Identity is its security identity.
	Identity  uint32
	Namespace string
	PodName   string
	// Labels in "source:key=value" form; when empty the identity's are
	// used.
	Labels []string
	// Workload is the owner (a Deployment's name and its kind), if known.
	WorkloadName, WorkloadKind string
}

// Policy is the policy a rule came from.
type Policy struct {
	Name      string
	Namespace string
	// Kind is NetworkPolicy, CiliumNetworkPolicy,
	// CiliumClusterwideNetworkPolicy or TendrilNetworkPolicy.
	Kind     string
	Labels   []string
	Revision uint64
}
