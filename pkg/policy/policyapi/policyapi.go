// Package policyapi serves the policy repository over the agent's REST
// API, per the Cilium v1 spec: PUT, GET and DELETE /v1/policy (rules
// imported, listed and deleted by labels), GET /v1/policy/selectors (each
// peer selector with the identities it selects now) and POST
// /v1/policy/trace.
package policyapi

import (
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Handlers serve the policy part of the API.
type Handlers struct {
	Repo *policy.Repository
	// Universe is every identity policy can select now.
	Universe func() policy.Universe
	// Source is the repository source of the rules imported here (the
	// policy file keeps those).
	Source string
}

// Register serves /v1/policy, /v1/policy/selectors and /v1/policy/trace.
func (h *Handlers) Register(api *server.Server) {
	api.Handle(http.MethodPut, "/v1/policy", h.handlePolicyPut)
	api.Handle(http.MethodGet, "/v1/policy", h.handlePolicyGet)
	api.Handle(http.MethodDelete, "/v1/policy", h.handlePolicyDelete)
	api.Handle(http.MethodGet, "/v1/policy/selectors", h.handlePolicySelectors)
	api.Handle(http.MethodPost, "/v1/policy/trace", h.handlePolicyTrace)
}

// readOptionalLabels reads the optional Labels body of GET/DELETE: label
// strings that select rules ("key=value" matches any source,
// "source:key=value" that source only).
func readOptionalLabels(r *http.Request) ([]labels.Label, error) {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, server.Errorf(http.StatusBadRequest, "read body: %v", err)
	}
	if strings.TrimSpace(string(data)) == "" {
		return nil, nil
	}
	var strs []string
	if err := json.Unmarshal(data, &strs); err != nil {
		return nil, server.Errorf(http.StatusBadRequest, "labels: want a JSON array of strings: %v", err)
	}
	sel, err := api.ParseSelectLabels(strs)
	if err != nil {
		return nil, server.Errorf(http.StatusBadRequest, "labels: %v", err)
	}
	return sel, nil
}

// labelStrings is sel for messages.
func labelStrings(sel []labels.Label) string { return strings.Join(api.LabelArray(sel).Strings(), " ") }

func (h *Handlers) policyModel(sel []labels.Label) (*models.Policy, int) {
	rules, rev := h.Repo.Rules(sel)
	out := make(api.Rules, 0, len(rules))
	for _, s := range rules {
		out = append(out, s.Rule)
	}
	data, _ := json.MarshalIndent(out, "", "  ")
	return &models.Policy{Policy: string(data), Revision: int64(rev)}, len(rules)
}

func (h *Handlers) handlePolicyPut(w http.ResponseWriter, r *http.Request) error {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return server.Errorf(http.StatusBadRequest, "read body: %v", err)
	}
	// The spec's body is a JSON string holding the rules (what cilium-dbg
	// sends); a bare rules document is accepted too.
	doc := strings.TrimSpace(string(data))
	if strings.HasPrefix(doc, `"`) {
		var s string
		if err := json.Unmarshal([]byte(doc), &s); err != nil {
			return server.Errorf(http.StatusBadRequest, "policy body: %v", err)
		}
		doc = s
	}
	rules, err := api.ParseRules([]byte(doc))
	if err != nil {
		return server.Errorf(http.StatusBadRequest, "%v", err)
	}
	q := r.URL.Query()
	replace := false
	if v := q.Get("replace"); v != "" {
		if replace, err = strconv.ParseBool(v); err != nil {
			return server.Errorf(http.StatusBadRequest, "replace %q: not a boolean", v)
		}
	}
	var replaceWith []labels.Label
	if with := q["replace-with-labels"]; len(with) > 0 {
		if replaceWith, err = api.ParseSelectLabels(with); err != nil {
			return server.Errorf(http.StatusBadRequest, "replace-with-labels: %v", err)
		}
	}
	// One revision for the removal and the addition: no resolution and no
	// write of the policy file sees the old rules gone and the new ones
	// missing.
	if _, err := h.Repo.Import(rules, "", h.Source, replace, replaceWith); err != nil {
		return server.Errorf(http.StatusBadRequest, "%v", err)
	}
	m, _ := h.policyModel(nil)
	server.WriteJSON(w, http.StatusOK, m)
	return nil
}

func (h *Handlers) handlePolicyGet(w http.ResponseWriter, r *http.Request) error {
	sel, err := readOptionalLabels(r)
	if err != nil {
		return err
	}
	m, n := h.policyModel(sel)
	if n == 0 && len(sel) > 0 {
		return server.Errorf(http.StatusNotFound, "no policy rule has labels %s", labelStrings(sel))
	}
	server.WriteJSON(w, http.StatusOK, m)
	return nil
}

func (h *Handlers) handlePolicyDelete(w http.ResponseWriter, r *http.Request) error {
	sel, err := readOptionalLabels(r)
	if err != nil {
		return err
	}
	rev, n := h.Repo.DeleteByLabels(sel)
	if n == 0 && len(sel) > 0 {
		return server.Errorf(http.StatusNotFound, "no policy rule has labels %s", labelStrings(sel))
	}
	server.WriteJSON(w, http.StatusOK, &models.Policy{Revision: int64(rev)})
	return nil
}

// handlePolicySelectors lists every peer selector of the rules with the
// identities it selects now.
func (h *Handlers) handlePolicySelectors(w http.ResponseWriter, r *http.Request) error {
	out := models.SelectorCache{}
	universe := h.Universe()
	rules, _ := h.Repo.Rules(nil)
	type entry struct {
		ids   map[int64]bool
		users int64
	}
	cache := map[string]*entry{}
	for _, s := range rules {
		for _, sel := range policy.PeerSelectors(s) {
			e, ok := cache[sel.String]
			if !ok {
				e = &entry{ids: map[int64]bool{}}
				cache[sel.String] = e
			}
			e.users++
			for _, id := range sel.Select(universe) {
				e.ids[int64(id)] = true
			}
		}
	}
	keys := make([]string, 0, len(cache))
	for k := range cache {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ids := []int64{}
		for id := range cache[k].ids {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		out = append(out, &models.SelectorIdentityMapping{Selector: k, Identities: ids, Users: cache[k].users})
	}
	server.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handlers) handlePolicyTrace(w http.ResponseWriter, r *http.Request) error {
	var req ext.TraceRequest
	if err := server.DecodeJSON(r, &req); err != nil {
		return err
	}
	if len(req.Src) == 0 || len(req.Dst) == 0 {
		return server.Errorf(http.StatusBadRequest, "src and dst labels are required")
	}
	protos := map[string]uint8{"": 6, "TCP": 6, "UDP": 17, "SCTP": 132, "ICMP": 1, "ICMPV6": 58}
	proto, ok := protos[strings.ToUpper(req.Proto)]
	if !ok {
		return server.Errorf(http.StatusBadRequest, "protocol %q: must be TCP, UDP, SCTP, ICMP or ICMPv6", req.Proto)
	}
	server.WriteJSON(w, http.StatusOK, h.Repo.Trace(req.Src, req.Dst, proto, req.Port, h.Universe()))
	return nil
}
