package ui

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/pkg/policy/api"
	"github.com/tendril-net/tendril/pkg/policy/observed"
)

// PolicyView is /api/policy's answer for one workload: the policies its
// flows name with the verdicts they gave (AUDIT: what an audit-mode policy
// would have denied), and the policy suggested from its observed flows.
type PolicyView struct {
	Workload    string            `json:"workload"`
	Namespace   string            `json:"namespace"`
	Labels      map[string]string `json:"labels"`
	Flows       int               `json:"flows"`
	Policies    []PolicyVerdicts  `json:"policies"`
	Suggested   string            `json:"suggested"`
	Connections int               `json:"connections"`
}

// PolicyVerdicts counts a policy's verdicts on a workload's flows.
type PolicyVerdicts struct {
	Name     string         `json:"name"`
	Verdicts map[string]int `json:"verdicts"`
}

// maxWhatIfBody caps a pasted what-if policy.
const maxWhatIfBody = 1 << 20

// BuildPolicyView answers for workload (a map node ID, "namespace/name")
// from flows.
func BuildPolicyView(flows []*flowpb.Flow, workload string) (*PolicyView, error) {
	ns, _, ok := strings.Cut(workload, "/")
	if !ok || ns == "" {
		return nil, fmt.Errorf("workload %q: want namespace/name as the map names it", workload)
	}
	v := &PolicyView{Workload: workload, Namespace: ns, Policies: []PolicyVerdicts{}}
	counts := map[string]map[string]int{}
	for _, f := range flows {
		src, dst := peerOf(f.GetSource(), ""), peerOf(f.GetDestination(), "")
		var ep *flowpb.Endpoint
		switch workload {
		case src.ID:
			ep = f.GetSource()
		case dst.ID:
			ep = f.GetDestination()
		default:
			continue
		}
		v.Flows++
		if v.Labels == nil {
			v.Labels = observed.Peer{Labels: ep.GetLabels()}.WorkloadLabels()
		}
		for _, p := range policyNames(f) {
			if counts[p] == nil {
				counts[p] = map[string]int{}
			}
			counts[p][f.GetVerdict().String()]++
		}
	}
	if v.Flows == 0 {
		return nil, fmt.Errorf("no flow of workload %q among the flows held", workload)
	}
	for name, c := range counts {
		v.Policies = append(v.Policies, PolicyVerdicts{Name: name, Verdicts: c})
	}
	slices.SortFunc(v.Policies, func(a, b PolicyVerdicts) int { return strings.Compare(a.Name, b.Name) })
	sel := v.Labels
	if len(sel) == 0 {
		// No labels to select by: the suggestion would select the whole
		// namespace, which is not this workload's.
		v.Suggested = "# " + workload + " has no labels to select it by: no policy to suggest\n"
		return v, nil
	}
	conns := observed.Connections(flows)
	sugg, err := observed.Suggest(conns, observed.SuggestOptions{Namespace: ns, Selector: sel})
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Suggested from %d flows by tendril ui (as tendril policy suggest).\n", len(flows))
	for _, s := range sugg {
		data, err := yaml.Marshal(s.Policy)
		if err != nil {
			return nil, err
		}
		v.Connections += s.Connections
		fmt.Fprintf(&b, "---\n# %d observed connections\n", s.Connections)
		for _, l := range strings.SplitAfter(string(data), "\n") {
			// The API types marshal an empty status and timestamp.
			if t := strings.TrimSpace(l); t == "status: {}" || t == "creationTimestamp: null" {
				continue
			}
			b.WriteString(l)
		}
	}
	if len(sugg) == 0 {
		b.WriteString("# no forwarded connection of this workload: nothing to suggest\n")
	}
	v.Suggested = b.String()
	return v, nil
}

func (s *Server) policy(w http.ResponseWriter, r *http.Request) {
	v, err := BuildPolicyView(s.store.Flows(nil), r.URL.Query().Get("workload"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// WhatIfAnswer is /api/whatif's answer: the observed connections whose
// verdict the pasted policies would change, grouped by workloads.
type WhatIfAnswer struct {
	RulesSource string        `json:"rulesSource"`
	Flows       int           `json:"flows"`
	Connections int           `json:"connections"`
	Changes     []WhatIfGroup `json:"changes"`
}

// WhatIfGroup is one source and destination workload's change.
type WhatIfGroup struct {
	Source      string   `json:"source"`
	Destination string   `json:"destination"`
	Ports       []string `json:"ports"`
	Connections int      `json:"connections"`
	Now         string   `json:"now"`
	With        string   `json:"withCandidates"`
}

func verdictWord(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

func (s *Server) whatif(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWhatIfBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("read the policy: %w", err))
		return
	}
	cands, err := observed.ParseCandidates(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("the pasted policy: %w", err))
		return
	}
	ans := WhatIfAnswer{RulesSource: s.cfg.RulesSource, Changes: []WhatIfGroup{}}
	if ans.RulesSource == "" {
		ans.RulesSource = "none"
	}
	var current api.Rules
	if s.cfg.Rules != nil {
		if current, err = s.cfg.Rules(r.Context()); err != nil {
			writeError(w, http.StatusBadGateway, fmt.Errorf("read the rules in force from %s: %w", ans.RulesSource, err))
			return
		}
	}
	flows := s.store.Flows(nil)
	conns := observed.Connections(flows)
	ans.Flows, ans.Connections = len(flows), len(conns)
	changes, err := observed.WhatIf(current, cands, conns)
	if err != nil {
		if errors.Is(err, r.Context().Err()) {
			return
		}
		writeError(w, http.StatusBadRequest, err)
		return
	}
	for _, g := range observed.GroupChanges(changes) {
		ans.Changes = append(ans.Changes, WhatIfGroup{Source: g.Src, Destination: g.Dst, Ports: g.Ports, Connections: g.Connections,
			Now: verdictWord(g.Before), With: verdictWord(g.After)})
	}
	writeJSON(w, http.StatusOK, ans)
}
