// Package identityapi serves the identities over the agent's REST API, per
// the Cilium v1 spec: GET /v1/identity (optionally those with given
// labels), /v1/identity/{id}, /v1/identity/endpoints and /v1/ip (the
// ipcache's entries, optionally within a CIDR or of identities with given
// labels), read from the identities table; and the Identities section of
// `tendril status`.
package identityapi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/crdalloc"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/ipcache"
	"github.com/tendril-net/tendril/pkg/policy"
)

// Handlers serve the identities' part of the API.
type Handlers struct {
	// Identities is the identities table.
	Identities *identitytable.Table
	// Endpoints lists the local endpoints (an API error before the
	// endpoint manager exists).
	Endpoints func() ([]*endpoint.Endpoint, error)
	// IPCache is the ipcache; nil without the datapath.
	IPCache *ipcache.IPCache
}

// Register serves GET /v1/identity, /v1/identity/{id},
// /v1/identity/endpoints and /v1/ip per the Cilium v1 spec.
func (h *Handlers) Register(api *server.Server) {
	api.Handle(http.MethodGet, "/v1/identity", h.handleIdentityList)
	api.Handle(http.MethodGet, "/v1/identity/endpoints", h.handleIdentityEndpoints)
	api.Handle(http.MethodGet, "/v1/identity/{id}", h.handleIdentityGet)
	api.Handle(http.MethodGet, "/v1/ip", h.handleIPList)
}

func identityModel(id identity.NumericIdentity, labels []string) *models.Identity {
	sorted := append([]string(nil), labels...)
	sort.Strings(sorted)
	sum := sha256.Sum256([]byte(strings.Join(sorted, ";")))
	return &models.Identity{ID: int64(id), Labels: models.Labels(sorted), LabelsSHA256: hex.EncodeToString(sum[:])}
}

// allIdentities are the reserved identities and every allocated one.
func (h *Handlers) allIdentities() []*models.Identity {
	var out []*models.Identity
	for _, p := range policy.ReservedPeers() {
		out = append(out, identityModel(p.ID, p.Labels))
	}
	for _, id := range h.Identities.List() {
		out = append(out, identityModel(id.ID, id.Labels))
	}
	return out
}

// optionalLabels reads the spec's optional body of labels on a GET.
func optionalLabels(r *http.Request) ([]string, error) {
	if r.ContentLength == 0 {
		return nil, nil
	}
	var labels models.Labels
	if err := server.DecodeJSON(r, &labels); err != nil {
		return nil, err
	}
	return labels, nil
}

func hasLabels(have []string, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

func (h *Handlers) handleIdentityList(w http.ResponseWriter, r *http.Request) error {
	want, err := optionalLabels(r)
	if err != nil {
		return err
	}
	if len(want) == 0 {
		server.WriteJSON(w, http.StatusOK, h.allIdentities())
		return nil
	}
	// The table's label index finds the candidates of the first label.
	out := []*models.Identity{}
	for _, p := range policy.ReservedPeers() {
		if hasLabels(p.Labels, want) {
			out = append(out, identityModel(p.ID, p.Labels))
		}
	}
	for _, id := range h.Identities.WithLabel(want[0]) {
		if hasLabels(id.Labels, want) {
			out = append(out, identityModel(id.ID, id.Labels))
		}
	}
	if len(out) == 0 {
		return server.Errorf(http.StatusNotFound, "no identity has labels %v", want)
	}
	server.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handlers) handleIdentityGet(w http.ResponseWriter, r *http.Request) error {
	raw := r.PathValue("id")
	n, err := strconv.ParseUint(raw, 10, 32)
	if err != nil {
		return server.Errorf(http.StatusBadRequest, "identity %q: must be a number", raw)
	}
	for _, p := range policy.ReservedPeers() {
		if p.ID == identity.NumericIdentity(n) {
			server.WriteJSON(w, http.StatusOK, identityModel(p.ID, p.Labels))
			return nil
		}
	}
	if id, ok := h.Identities.Lookup(identity.NumericIdentity(n)); ok {
		server.WriteJSON(w, http.StatusOK, identityModel(id.ID, id.Labels))
		return nil
	}
	return server.Errorf(http.StatusNotFound, "identity %d not found", n)
}

func (h *Handlers) handleIdentityEndpoints(w http.ResponseWriter, r *http.Request) error {
	eps, err := h.Endpoints()
	if err != nil {
		return err
	}
	count := map[identity.NumericIdentity]int64{}
	for _, ep := range eps {
		if ep.Identity != 0 {
			count[identity.NumericIdentity(ep.Identity)]++
		}
	}
	out := []*models.IdentityEndpoints{}
	for id, n := range count {
		labels := []string{}
		if ident, ok := h.Identities.Lookup(id); ok {
			labels = ident.Labels
		} else if id.IsReserved() {
			labels = []string{id.String()} // "reserved:<name>"
		}
		out = append(out, &models.IdentityEndpoints{Identity: identityModel(id, labels), RefCount: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Identity.ID < out[j].Identity.ID })
	server.WriteJSON(w, http.StatusOK, out)
	return nil
}

// handleIPList lists the ipcache's effective entries, optionally those
// inside ?cidr=.
func (h *Handlers) handleIPList(w http.ResponseWriter, r *http.Request) error {
	if h.IPCache == nil {
		return server.Errorf(http.StatusNotFound, "the datapath is disabled: no ipcache")
	}
	var within netip.Prefix
	if s := r.URL.Query().Get("cidr"); s != "" {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return server.Errorf(http.StatusBadRequest, "cidr %q: %v", s, err)
		}
		within = p.Masked()
	}
	want, err := optionalLabels(r)
	if err != nil {
		return err
	}
	out := []*models.IPListEntry{}
	for _, it := range h.IPCache.List() {
		if within.IsValid() && (!within.Contains(it.Prefix.Addr()) || it.Prefix.Bits() < within.Bits()) {
			continue
		}
		if len(want) > 0 {
			ident, ok := h.Identities.Lookup(it.Entry.Identity)
			if !ok || !hasLabels(ident.Labels, want) {
				continue
			}
		}
		cidr := it.Prefix.String()
		id := int64(it.Entry.Identity)
		e := &models.IPListEntry{Cidr: &cidr, Identity: &id,
			Metadata: &models.IPListEntryMetadata{Source: it.Entry.Source.String(), Name: it.Entry.Name, Namespace: it.Entry.Namespace}}
		if it.Entry.HostIP.IsValid() {
			e.HostIP = it.Entry.HostIP.String()
		}
		out = append(out, e)
	}
	if (within.IsValid() || len(want) > 0) && len(out) == 0 {
		return server.Errorf(http.StatusNotFound, "no ipcache entry matches")
	}
	server.WriteJSON(w, http.StatusOK, out)
	return nil
}

// StatusSection is the identities part of `tendril status`: the
// allocator's mode and how many identities the table knows and this node
// uses.
func StatusSection(ids identity.Allocator, table *identitytable.Table) ext.Section {
	mode := "local"
	switch ids.(type) {
	case *crdalloc.Allocator:
		mode = "crd (TendrilIdentity objects)"
	case *kvalloc.Allocator:
		mode = "kvstore (etcd)"
	}
	known, held := 0, 0
	for _, id := range table.List() {
		known++
		if id.References > 0 {
			held++
		}
	}
	return ext.Section{Title: "Identities", Lines: []ext.Line{
		{Key: "Allocation", Value: mode},
		{Key: "Known", Value: fmt.Sprintf("%d cluster identities, %d used on this node", known, held)},
	}}
}
