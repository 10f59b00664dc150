// Package observed reasons about policy from observed traffic: it reduces
// flows (Hubble's flow.Flow, from a node or the relay) to the distinct
// connections policy decides on, suggests Kubernetes NetworkPolicies that
// admit exactly those connections, and evaluates candidate policies
// against them (what-if), with the agent's own policy engine.
package observed

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/policy"
)

// PeerKind is what a side of a connection is.
type PeerKind int

// Kinds of peers.
const (
	// PeerPod is a pod: it has a namespace and identity labels.
	PeerPod PeerKind = iota
	// PeerHost is the node a pod runs on.
	PeerHost
	// PeerRemoteNode is another node of the cluster.
	PeerRemoteNode
	// PeerWorld is an address outside the cluster.
	PeerWorld
	// PeerOther is another reserved identity (health, init, ...).
	PeerOther
)

func (k PeerKind) String() string {
	return [...]string{"pod", "host", "remote-node", "world", "other"}[k]
}

// Peer is one side of a connection.
type Peer struct {
	Kind      PeerKind
	Identity  identity.NumericIdentity
	Labels    []string // the identity's labels as the agent writes them ("k8s:app=web")
	Namespace string
	Pod       string
	IP        netip.Addr
}

// metaPrefixes are identity labels that are not the pod's own labels.
var metaPrefixes = []string{policy.NamespaceLabel + "=", policy.NamespaceLabelsPrefix, "k8s:io.cilium.k8s.policy.", "k8s:io.kubernetes.pod."}

// perPodKeys are pod labels that differ between the pods of one workload.
var perPodKeys = map[string]bool{
	"pod-template-hash": true, "controller-revision-hash": true, "pod-template-generation": true,
	"statefulset.kubernetes.io/pod-name": true, "apps.kubernetes.io/pod-index": true,
	"batch.kubernetes.io/job-completion-index": true, "job-name": true, "controller-uid": true,
	"batch.kubernetes.io/controller-uid": true, "batch.kubernetes.io/job-name": true,
}

// PodLabels are the pod's own labels (source k8s), without the namespace
// and policy metadata the agent adds.
func (p Peer) PodLabels() map[string]string {
	out := map[string]string{}
	for _, l := range p.Labels {
		if !strings.HasPrefix(l, "k8s:") || slices.ContainsFunc(metaPrefixes, func(m string) bool { return strings.HasPrefix(l, m) }) {
			continue
		}
		k, v, _ := strings.Cut(strings.TrimPrefix(l, "k8s:"), "=")
		out[k] = v
	}
	return out
}

// WorkloadLabels are the pod labels its workload's pods share: without
// the per-pod ones (pod-template-hash, ...).
func (p Peer) WorkloadLabels() map[string]string {
	out := p.PodLabels()
	for k := range out {
		if perPodKeys[k] {
			delete(out, k)
		}
	}
	return out
}

// Workload names a pod's workload for display and grouping: its namespace
// and its workload labels; another peer by its kind and address.
func (p Peer) Workload() string {
	switch p.Kind {
	case PeerPod:
		wl := p.WorkloadLabels()
		if len(wl) == 0 {
			return p.Namespace + "/" + p.Pod
		}
		return p.Namespace + "/" + labelString(wl)
	case PeerWorld, PeerRemoteNode:
		return p.Kind.String() + ":" + p.IP.String()
	}
	return p.Kind.String()
}

func labelString(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + m[k])
	}
	return b.String()
}

// Connection is a distinct connection policy decides on: its first
// packet's sides, protocol and destination port, and what the datapath
// did with it.
type Connection struct {
	Src, Dst Peer
	Proto    uint8
	Port     uint16
	// Verdict is the latest recorded one: FORWARDED, DROPPED or AUDIT.
	Verdict flowpb.Verdict
	// Flows is how many flows reported it (both nodes, retries).
	Flows int
}

// Key identifies a connection by addresses, protocol and port.
func (c Connection) Key() string {
	return c.Src.IP.String() + ">" + c.Dst.IP.String() + "/" + protoName(c.Proto) + "/" + strconv.Itoa(int(c.Port))
}

// Connections reduces flows to the distinct connections: the flows of a
// connection's first packets (not replies) with a layer 4 port, from both
// nodes' observation points; the latest flow's verdict wins. Flows are
// expected oldest first, as GetFlows returns them.
func Connections(flows []*flowpb.Flow) []Connection {
	byKey := map[string]*Connection{}
	var order []string
	for _, f := range flows {
		c, ok := fromFlow(f)
		if !ok {
			continue
		}
		k := c.Key()
		if old, ok := byKey[k]; ok {
			old.Flows++
			old.Verdict = c.Verdict
			continue
		}
		byKey[k] = &c
		order = append(order, k)
	}
	out := make([]Connection, 0, len(order))
	for _, k := range order {
		out = append(out, *byKey[k])
	}
	slices.SortStableFunc(out, func(a, b Connection) int {
		return cmp.Or(cmp.Compare(a.Src.Workload(), b.Src.Workload()), cmp.Compare(a.Dst.Workload(), b.Dst.Workload()),
			cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Key(), b.Key()))
	})
	return out
}

func fromFlow(f *flowpb.Flow) (Connection, bool) {
	if f.GetIsReply() == nil || f.GetIsReply().GetValue() {
		return Connection{}, false // a reply, or direction unknown
	}
	switch f.GetVerdict() {
	case flowpb.Verdict_FORWARDED, flowpb.Verdict_DROPPED, flowpb.Verdict_AUDIT:
	default:
		return Connection{}, false
	}
	var proto uint8
	var port uint32
	switch l4 := f.GetL4().GetProtocol().(type) {
	case *flowpb.Layer4_TCP:
		proto, port = 6, l4.TCP.GetDestinationPort()
	case *flowpb.Layer4_UDP:
		proto, port = 17, l4.UDP.GetDestinationPort()
	case *flowpb.Layer4_SCTP:
		proto, port = 132, l4.SCTP.GetDestinationPort()
	default:
		return Connection{}, false // ICMP: NetworkPolicy has no words for it
	}
	src, ok1 := peer(f.GetSource(), f.GetIP().GetSource())
	dst, ok2 := peer(f.GetDestination(), f.GetIP().GetDestination())
	if !ok1 || !ok2 {
		return Connection{}, false
	}
	return Connection{Src: src, Dst: dst, Proto: proto, Port: uint16(port), Verdict: f.GetVerdict(), Flows: 1}, true
}

func peer(e *flowpb.Endpoint, ip string) (Peer, bool) {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return Peer{}, false
	}
	p := Peer{Identity: identity.NumericIdentity(e.GetIdentity()), Labels: e.GetLabels(), Namespace: e.GetNamespace(), Pod: e.GetPodName(), IP: addr}
	switch {
	case slices.Contains(p.Labels, "reserved:host") || p.Identity == identity.Host:
		p.Kind = PeerHost
	case slices.Contains(p.Labels, "reserved:remote-node") || p.Identity == identity.RemoteNode:
		p.Kind = PeerRemoteNode
	case p.Identity == identity.World || p.Identity == identity.WorldIPv4 || p.Identity == identity.WorldIPv6 || p.Identity.IsLocal() ||
		p.Identity == 0 || slices.Contains(p.Labels, "reserved:world"):
		p.Kind = PeerWorld
	case p.Namespace != "" || slices.ContainsFunc(p.Labels, func(l string) bool { return strings.HasPrefix(l, policy.NamespaceLabel+"=") }):
		p.Kind = PeerPod
		if p.Namespace == "" {
			for _, l := range p.Labels {
				if v, ok := strings.CutPrefix(l, policy.NamespaceLabel+"="); ok {
					p.Namespace = v
				}
			}
		}
	default:
		p.Kind = PeerOther
	}
	return p, true
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "TCP"
	case 17:
		return "UDP"
	case 132:
		return "SCTP"
	}
	return strconv.Itoa(int(p))
}
