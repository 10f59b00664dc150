package ui

import (
	"cmp"
	"slices"
	"strconv"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
)

// Map is the service map of a namespace: who talks to whom.
type Map struct {
	Namespace string `json:"namespace"`
	// Window is the span of the flows it was built from, in seconds.
	Window float64 `json:"window"`
	Flows  int     `json:"flows"`
	Nodes  []Peer  `json:"nodes"`
	Edges  []*Edge `json:"edges"`
}

// Edge is the observed traffic from one node of the map to another on one
// protocol and port with one verdict.
type Edge struct {
	ID       string `json:"id"`
	Source   string `json:"source"`
	Target   string `json:"target"`
	Protocol string `json:"protocol"`
	Port     uint32 `json:"port,omitempty"`
	// Verdict is FORWARDED, DROPPED or AUDIT; SERVICE on the link of a
	// Service to a workload that answered for it.
	Verdict string `json:"verdict"`
	// Service is the Service the traffic went to, if any.
	Service string `json:"service,omitempty"`
	Flows   int    `json:"flows"`
	// Rate is flows per second over the map's window.
	Rate float64 `json:"rate"`
	// Policies: for drops and audit verdicts those that denied
	// ("default deny" when none did, the namespace being isolated), else
	// those that allowed.
	Policies    []string  `json:"policies,omitempty"`
	DropReasons []string  `json:"dropReasons,omitempty"`
	LastSeen    time.Time `json:"lastSeen"`
}

// verdictService marks the link of a Service to a workload answering it.
const verdictService = "SERVICE"

// DefaultDenyName stands for the absence of a denying policy on a dropped
// edge: the destination (or source) is isolated and no rule allowed it.
const DefaultDenyName = "default deny"

// BuildMap aggregates flows (oldest first) into the map of namespace ns
// (every namespace when empty): an edge for each source, destination,
// protocol, destination port and verdict seen, leaving replies out (they
// belong to the connection their request opened). Traffic edges join the
// workloads that talked; a Service that traffic went to is a node of its
// own, linked to the workloads that answered for it (verdict SERVICE).
func BuildMap(flows []*flowpb.Flow, ns string) *Map {
	m := &Map{Namespace: ns, Nodes: []Peer{}, Edges: []*Edge{}}
	nodes := map[string]Peer{}
	edges := map[string]*Edge{}
	var first, last time.Time
	add := func(src, dst Peer, proto string, port uint32, verdict, service string, f *flowpb.Flow, t time.Time) {
		id := src.ID + "|" + dst.ID + "|" + proto + "|" + strconv.Itoa(int(port)) + "|" + verdict
		e := edges[id]
		if e == nil {
			e = &Edge{ID: id, Source: src.ID, Target: dst.ID, Protocol: proto, Port: port, Verdict: verdict, Service: service}
			edges[id] = e
		}
		if verdict == verdictService {
			e.Flows++
			nodes[src.ID], nodes[dst.ID] = src, dst
			return
		}
		e.Flows++
		if t.After(e.LastSeen) {
			e.LastSeen = t
		}
		for _, p := range policyNames(f) {
			if !slices.Contains(e.Policies, p) {
				e.Policies = append(e.Policies, p)
			}
		}
		if f.GetVerdict() == flowpb.Verdict_DROPPED {
			r := f.GetDropReasonDesc().String()
			if !slices.Contains(e.DropReasons, r) {
				e.DropReasons = append(e.DropReasons, r)
			}
			if len(policyNames(f)) == 0 && isPolicyDrop(f.GetDropReasonDesc()) && !slices.Contains(e.Policies, DefaultDenyName) {
				e.Policies = append(e.Policies, DefaultDenyName)
			}
		}
		nodes[src.ID], nodes[dst.ID] = src, dst
	}
	for _, f := range flows {
		if f.GetIsReply().GetValue() {
			continue
		}
		src, dst := peerOf(f.GetSource(), f.GetIP().GetSource()), peerOf(f.GetDestination(), f.GetIP().GetDestination())
		var svc *Peer
		if s := f.GetDestinationService(); s.GetName() != "" {
			svc = &Peer{ID: "svc:" + s.GetNamespace() + "/" + s.GetName(), Kind: KindService, Label: s.GetName(), Namespace: s.GetNamespace()}
		}
		if ns != "" && src.Namespace != ns && dst.Namespace != ns && (svc == nil || svc.Namespace != ns) {
			continue
		}
		t := f.GetTime().AsTime()
		if first.IsZero() || t.Before(first) {
			first = t
		}
		if t.After(last) {
			last = t
		}
		m.Flows++
		proto, _, port := protoPorts(f)
		verdict := f.GetVerdict().String()
		service := ""
		if svc != nil {
			service = svc.Namespace + "/" + svc.Label
			if dst.Kind == KindWorkload {
				add(*svc, dst, proto, port, verdictService, "", f, t)
			}
		}
		add(src, dst, proto, port, verdict, service, f, t)
	}
	// A map of one instant still has a rate: count it over a second.
	m.Window = max(last.Sub(first).Seconds(), 1)
	for _, e := range edges {
		e.Rate = float64(e.Flows) / m.Window
		slices.Sort(e.Policies)
		m.Edges = append(m.Edges, e)
	}
	for _, n := range nodes {
		m.Nodes = append(m.Nodes, n)
	}
	slices.SortFunc(m.Nodes, func(a, b Peer) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortFunc(m.Edges, func(a, b *Edge) int { return cmp.Compare(a.ID, b.ID) })
	return m
}

// isPolicyDrop reports whether a drop reason is policy's.
func isPolicyDrop(r flowpb.DropReason) bool {
	return r == flowpb.DropReason_POLICY_DENIED || r == flowpb.DropReason_POLICY_DENY
}
