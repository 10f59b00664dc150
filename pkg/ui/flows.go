// Package ui is `tendril ui`: a web UI over the relay's Observer API. It
// keeps the most recent flows in memory, aggregates them into a service map
// per namespace, filters them as `hubble observe` does, and answers policy
// questions (suggested policies, what-if) with pkg/policy/observed. The
// page's assets are embedded, so the binary needs nothing at run time.
package ui

import (
	"slices"
	"strconv"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/observer"
)

// Node kinds of the service map.
const (
	KindWorkload = "workload"
	KindService  = "service"
	KindWorld    = "world"
	KindHost     = "host"
	KindNode     = "remote-node"
	KindOther    = "other"
)

// Peer names one side of a flow as the map draws it.
type Peer struct {
	ID        string `json:"id"`
	Kind      string `json:"kind"`
	Label     string `json:"label"`
	Namespace string `json:"namespace,omitempty"`
}

// peerOf names an endpoint: a pod by its workload (or its name when it has
// none), the reserved identities by their kind.
func peerOf(e *flowpb.Endpoint, ip string) Peer {
	labels := e.GetLabels()
	id := identity.NumericIdentity(e.GetIdentity())
	switch {
	case slices.Contains(labels, "reserved:host") || id == identity.Host:
		return Peer{ID: KindHost, Kind: KindHost, Label: "host"}
	case slices.Contains(labels, "reserved:remote-node") || id == identity.RemoteNode:
		return Peer{ID: KindNode, Kind: KindNode, Label: "other nodes"}
	case e.GetNamespace() != "":
		name := e.GetPodName()
		if w := e.GetWorkloads(); len(w) > 0 && w[0].GetName() != "" {
			name = w[0].GetName()
		}
		if name == "" {
			name = "identity " + strconv.Itoa(int(id))
		}
		return Peer{ID: e.GetNamespace() + "/" + name, Kind: KindWorkload, Label: name, Namespace: e.GetNamespace()}
	case slices.Contains(labels, "reserved:world") || id == identity.World || id == identity.WorldIPv4 || id == identity.WorldIPv6 || id.IsLocal():
		return Peer{ID: KindWorld, Kind: KindWorld, Label: "world"}
	}
	if ip != "" {
		return Peer{ID: "ip:" + ip, Kind: KindOther, Label: ip}
	}
	return Peer{ID: KindOther, Kind: KindOther, Label: "unknown"}
}

// Row is a flow as the page shows it.
type Row struct {
	Time        time.Time `json:"time"`
	Node        string    `json:"node,omitempty"`
	Source      Peer      `json:"source"`
	Destination Peer      `json:"destination"`
	SourcePod   string    `json:"sourcePod,omitempty"`
	DestPod     string    `json:"destinationPod,omitempty"`
	Service     string    `json:"service,omitempty"`
	SourceIP    string    `json:"sourceIP,omitempty"`
	DestIP      string    `json:"destinationIP,omitempty"`
	Protocol    string    `json:"protocol"`
	SourcePort  uint32    `json:"sourcePort,omitempty"`
	Port        uint32    `json:"port,omitempty"`
	Verdict     string    `json:"verdict"`
	DropReason  string    `json:"dropReason,omitempty"`
	Type        string    `json:"type"`
	Reply       bool      `json:"reply,omitempty"`
	// Policies are the policies that decided: the ones that denied a
	// dropped or audited flow, else the ones that allowed it
	// ("namespace/name").
	Policies []string `json:"policies,omitempty"`
	Summary  string   `json:"summary,omitempty"`
}

// protoPorts is a flow's protocol name and ports.
func protoPorts(f *flowpb.Flow) (string, uint32, uint32) {
	l4 := f.GetL4()
	switch {
	case l4.GetTCP() != nil:
		return "TCP", l4.GetTCP().GetSourcePort(), l4.GetTCP().GetDestinationPort()
	case l4.GetUDP() != nil:
		return "UDP", l4.GetUDP().GetSourcePort(), l4.GetUDP().GetDestinationPort()
	case l4.GetSCTP() != nil:
		return "SCTP", l4.GetSCTP().GetSourcePort(), l4.GetSCTP().GetDestinationPort()
	case l4.GetICMPv4() != nil:
		return "ICMPv4", 0, 0
	case l4.GetICMPv6() != nil:
		return "ICMPv6", 0, 0
	}
	return "other", 0, 0
}

// policyNames are the policies a flow names: the denying ones for a drop
// or an audit verdict, the allowing ones otherwise.
func policyNames(f *flowpb.Flow) []string {
	var ps []*flowpb.Policy
	if f.GetVerdict() == flowpb.Verdict_DROPPED || f.GetVerdict() == flowpb.Verdict_AUDIT {
		ps = append(append(ps, f.GetIngressDeniedBy()...), f.GetEgressDeniedBy()...)
	}
	if len(ps) == 0 && f.GetVerdict() != flowpb.Verdict_DROPPED {
		ps = append(append(ps, f.GetIngressAllowedBy()...), f.GetEgressAllowedBy()...)
	}
	var out []string
	for _, p := range ps {
		n := p.GetName()
		if p.GetNamespace() != "" {
			n = p.GetNamespace() + "/" + n
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// eventType names a flow's event as hubble's -t values do.
func eventType(f *flowpb.Flow) string {
	switch f.GetEventType().GetType() {
	case observer.MessageTypeDrop:
		return "drop"
	case observer.MessageTypeTrace:
		return "trace"
	case observer.MessageTypePolicyVerdict:
		return "policy-verdict"
	case observer.MessageTypeTraceSock:
		return "trace-sock"
	}
	return strconv.Itoa(int(f.GetEventType().GetType()))
}

// RowOf is the page's form of a flow.
func RowOf(f *flowpb.Flow) Row {
	proto, sport, dport := protoPorts(f)
	r := Row{
		Time: f.GetTime().AsTime(), Node: f.GetNodeName(),
		Source: peerOf(f.GetSource(), f.GetIP().GetSource()), Destination: peerOf(f.GetDestination(), f.GetIP().GetDestination()),
		SourceIP: f.GetIP().GetSource(), DestIP: f.GetIP().GetDestination(),
		Protocol: proto, SourcePort: sport, Port: dport,
		Verdict: f.GetVerdict().String(), Type: eventType(f), Reply: f.GetIsReply().GetValue(),
		Policies: policyNames(f), Summary: f.GetSummary(),
	}
	if p := f.GetSource().GetPodName(); p != "" {
		r.SourcePod = f.GetSource().GetNamespace() + "/" + p
	}
	if p := f.GetDestination().GetPodName(); p != "" {
		r.DestPod = f.GetDestination().GetNamespace() + "/" + p
	}
	if s := f.GetDestinationService(); s.GetName() != "" {
		r.Service = s.GetNamespace() + "/" + s.GetName()
	}
	if f.GetVerdict() == flowpb.Verdict_DROPPED {
		r.DropReason = f.GetDropReasonDesc().String()
	}
	return r
}

// hasPolicy reports whether a flow names policy p ("name" or
// "namespace/name") among those that allowed or denied it.
func hasPolicy(f *flowpb.Flow, p string) bool {
	for _, set := range [][]*flowpb.Policy{f.GetIngressDeniedBy(), f.GetEgressDeniedBy(), f.GetIngressAllowedBy(), f.GetEgressAllowedBy()} {
		for _, pol := range set {
			if pol.GetName() == p || pol.GetNamespace()+"/"+pol.GetName() == p {
				return true
			}
		}
	}
	return false
}
