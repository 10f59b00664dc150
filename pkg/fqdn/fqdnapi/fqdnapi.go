// Package fqdnapi serves the FQDN cache on the agent's API as the Cilium
// v1 API defines it: GET and DELETE /v1/fqdn/cache, GET
// /v1/fqdn/cache/{id} and GET /v1/fqdn/names (so `cilium-dbg fqdn cache
// list` works against the agent).
package fqdnapi

import (
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/go-openapi/strfmt"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/fqdn"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// SourceLookup is the source of every entry: a DNS lookup the proxy saw.
const SourceLookup = "lookup"

// Handlers serve the routes.
type Handlers struct {
	Cache *fqdn.Cache
	// Selectors lists the toFQDNs selectors of the policy in force.
	Selectors func() []api.FQDNSelector
	// Deleted is called after a DELETE removed entries (the policy then
	// forgets their addresses).
	Deleted func()
}

// Register serves the handlers on s.
func (h *Handlers) Register(s *server.Server) {
	s.Handle(http.MethodGet, "/v1/fqdn/cache", func(w http.ResponseWriter, r *http.Request) error { return h.list(w, r, 0) })
	s.Handle(http.MethodGet, "/v1/fqdn/cache/{id}", func(w http.ResponseWriter, r *http.Request) error {
		id, err := endpointID(r.PathValue("id"))
		if err != nil {
			return err
		}
		return h.list(w, r, id)
	})
	s.Handle(http.MethodDelete, "/v1/fqdn/cache", h.delete)
	s.Handle(http.MethodGet, "/v1/fqdn/names", h.names)
}

// endpointID parses "[cilium-local:]N"; the other prefixes of the API do
// not name endpoints of this node's cache.
func endpointID(s string) (uint16, error) {
	n, err := strconv.ParseUint(strings.TrimPrefix(s, "cilium-local:"), 10, 16)
	if err != nil || n == 0 {
		return 0, server.Errorf(http.StatusBadRequest, "endpoint ID %q: want [cilium-local:]N with N from 1 to 65535", s)
	}
	return uint16(n), nil
}

func pattern(r *http.Request) (string, error) {
	p := r.URL.Query().Get("matchpattern")
	if p == "" {
		return "", nil
	}
	if err := (api.FQDNSelector{MatchPattern: p}).Validate("matchpattern"); err != nil {
		return "", server.Errorf(http.StatusBadRequest, "%v", err)
	}
	return p, nil
}

func (h *Handlers) list(w http.ResponseWriter, r *http.Request, ep uint16) error {
	pat, err := pattern(r)
	if err != nil {
		return err
	}
	var cidr netip.Prefix
	if c := r.URL.Query().Get("cidr"); c != "" {
		if cidr, err = api.ParseCIDR(c); err != nil {
			return server.Errorf(http.StatusBadRequest, "cidr: %v", err)
		}
	}
	src := r.URL.Query().Get("source")
	if src != "" && src != SourceLookup && src != "connection" {
		return server.Errorf(http.StatusBadRequest, "source %q: want %s or connection", src, SourceLookup)
	}
	out := []*models.DNSLookup{}
	if src != "connection" { // no connection-tracked entries: names are kept by lookup only
		for _, l := range h.Cache.Lookups(ep, pat) {
			var ips []string
			for _, ip := range l.IPs {
				if !cidr.IsValid() || cidr.Contains(ip) {
					ips = append(ips, ip.String())
				}
			}
			if len(ips) == 0 {
				continue
			}
			out = append(out, &models.DNSLookup{
				EndpointID:     int64(l.EndpointID),
				Fqdn:           l.Name + ".",
				Ips:            ips,
				TTL:            int64(l.TTL),
				LookupTime:     strfmt.DateTime(l.LookupTime),
				ExpirationTime: strfmt.DateTime(l.Expires),
				Source:         SourceLookup,
			})
		}
	}
	if len(out) == 0 {
		return server.Errorf(http.StatusNotFound, "no DNS data with the given parameters")
	}
	server.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handlers) delete(w http.ResponseWriter, r *http.Request) error {
	pat, err := pattern(r)
	if err != nil {
		return err
	}
	if n := h.Cache.Delete(0, pat); n > 0 && h.Deleted != nil {
		h.Deleted()
	}
	server.WriteJSON(w, http.StatusOK, struct{}{})
	return nil
}

func (h *Handlers) names(w http.ResponseWriter, r *http.Request) error {
	out := &models.NameManager{DNSPollNames: []string{}, FQDNPolicySelectors: []*models.SelectorEntry{}}
	seen := map[string]bool{}
	if h.Selectors != nil {
		for _, s := range h.Selectors() {
			str := s.String()
			if seen[str] {
				continue
			}
			seen[str] = true
			out.FQDNPolicySelectors = append(out.FQDNPolicySelectors, &models.SelectorEntry{SelectorString: str, RegexString: s.Regexp()})
		}
	}
	server.WriteJSON(w, http.StatusOK, out)
	return nil
}
