// Package ipamapi serves the node's IPAM over the agent's REST API, per
// the Cilium v1 spec: POST /v1/ipam (the next free address of each
// enabled family, optionally expiring unless an endpoint claims it), POST
// /v1/ipam/{ip} and DELETE /v1/ipam/{ip}.
package ipamapi

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/ipam"
)

// Handlers serve the IPAM part of the API.
type Handlers struct {
	Log *slog.Logger
	// IPAM is the node's allocator; nil before the endpoints' start step
	// built it (the handlers answer 503 then).
	IPAM func() *ipam.IPAM
	// Endpoints lists the local endpoints: an address one of them uses is
	// released with the endpoint, not here.
	Endpoints func() []*endpoint.Endpoint
	// NodeAddressing is the node's addressing of the reply.
	NodeAddressing func() *models.NodeAddressing
}

// Register serves POST /v1/ipam, POST and DELETE /v1/ipam/{ip}.
func (h *Handlers) Register(api *server.Server) {
	api.Handle(http.MethodPost, "/v1/ipam", h.handleIPAMAllocateNext)
	api.Handle(http.MethodPost, "/v1/ipam/{ip}", h.handleIPAMAllocateIP)
	api.Handle(http.MethodDelete, "/v1/ipam/{ip}", h.handleIPAMRelease)
}

func (h *Handlers) ipamReady() (*ipam.IPAM, error) {
	alloc := h.IPAM()
	if alloc == nil {
		return nil, server.Errorf(http.StatusServiceUnavailable, "IPAM is not started yet")
	}
	return alloc, nil
}

func (h *Handlers) handleIPAMAllocateNext(w http.ResponseWriter, r *http.Request) error {
	alloc, err := h.ipamReady()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	owner := q.Get("owner")
	expiration, err := server.BoolHeader(r, "expiration", false)
	if err != nil {
		return err
	}
	var families []ipam.Family
	switch strings.ToLower(q.Get("family")) {
	case "":
		for _, f := range []ipam.Family{ipam.IPv4, ipam.IPv6} {
			if alloc.Enabled(f) {
				families = append(families, f)
			}
		}
	case "ipv4":
		families = []ipam.Family{ipam.IPv4}
	case "ipv6":
		families = []ipam.Family{ipam.IPv6}
	default:
		return server.Errorf(http.StatusBadRequest, "family %q: must be ipv4 or ipv6", q.Get("family"))
	}
	if pool := q.Get("pool"); pool != "" && pool != "default" {
		return server.Errorf(http.StatusBadRequest, "pool %q: only the default pool exists", pool)
	}
	resp := &models.IPAMResponse{Address: &models.AddressPair{}, HostAddressing: h.NodeAddressing()}
	var got []ipam.Allocation
	for _, f := range families {
		var al ipam.Allocation
		if expiration {
			al, err = alloc.AllocateNextWithExpiration(f, owner)
		} else {
			al, err = alloc.AllocateNext(f, owner)
		}
		if err != nil {
			// All or nothing: give back what this request took.
			for _, g := range got {
				_ = alloc.Release(g.IP)
			}
			if errors.Is(err, ipam.ErrFamilyDisabled) {
				return server.Errorf(http.StatusBadRequest, "%v", err)
			}
			return server.Errorf(http.StatusBadGateway, "%v", err)
		}
		got = append(got, al)
		addr := &models.IPAMAddressResponse{
			IP:             al.IP.String(),
			Gateway:        alloc.RouterIP(f).String(),
			Cidrs:          []string{alloc.CIDR(f).String()},
			ExpirationUUID: al.ExpirationUUID,
		}
		if f == ipam.IPv4 {
			resp.Address.IPV4, resp.IPV4 = al.IP.String(), addr
		} else {
			resp.Address.IPV6, resp.IPV6 = al.IP.String(), addr
		}
	}
	h.Log.Debug("Allocated addresses", "owner", owner, "ipv4", resp.Address.IPV4, "ipv6", resp.Address.IPV6, "expiration", expiration)
	server.WriteJSON(w, http.StatusCreated, resp)
	return nil
}

func parseIPParam(r *http.Request) (netip.Addr, error) {
	raw := r.PathValue("ip")
	ip, err := netip.ParseAddr(raw)
	if err != nil {
		return netip.Addr{}, server.Errorf(http.StatusBadRequest, "invalid IP address %q", raw)
	}
	return ip.Unmap(), nil
}

func (h *Handlers) handleIPAMAllocateIP(w http.ResponseWriter, r *http.Request) error {
	alloc, err := h.ipamReady()
	if err != nil {
		return err
	}
	ip, err := parseIPParam(r)
	if err != nil {
		return err
	}
	if _, err := alloc.Allocate(ip, r.URL.Query().Get("owner")); err != nil {
		switch {
		case errors.Is(err, ipam.ErrAlreadyAllocated):
			return server.Errorf(http.StatusConflict, "%v", err)
		case errors.Is(err, ipam.ErrFamilyDisabled):
			return server.Errorf(http.StatusNotImplemented, "%v", err)
		case errors.Is(err, ipam.ErrOutOfRange), errors.Is(err, ipam.ErrReserved):
			return server.Errorf(http.StatusBadRequest, "%v", err)
		}
		return fmt.Errorf("allocate %s: %w", ip, err)
	}
	server.WriteJSON(w, http.StatusOK, nil)
	return nil
}

func (h *Handlers) handleIPAMRelease(w http.ResponseWriter, r *http.Request) error {
	alloc, err := h.ipamReady()
	if err != nil {
		return err
	}
	ip, err := parseIPParam(r)
	if err != nil {
		return err
	}
	// An address an endpoint still uses is released with the endpoint.
	for _, ep := range h.Endpoints() {
		for _, epIP := range ep.Addresses() {
			if epIP == ip {
				return server.Errorf(http.StatusForbidden, "%s belongs to endpoint %d; delete the endpoint instead", ip, ep.ID)
			}
		}
	}
	if err := alloc.Release(ip); err != nil {
		switch {
		case errors.Is(err, ipam.ErrNotAllocated):
			return server.Errorf(http.StatusNotFound, "%v", err)
		case errors.Is(err, ipam.ErrFamilyDisabled):
			return server.Errorf(http.StatusNotImplemented, "%v", err)
		case errors.Is(err, ipam.ErrOutOfRange), errors.Is(err, ipam.ErrReserved):
			return server.Errorf(http.StatusBadRequest, "%v", err)
		}
		return err
	}
	server.WriteJSON(w, http.StatusOK, nil)
	return nil
}
