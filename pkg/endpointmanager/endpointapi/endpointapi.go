// Package endpointapi serves the local endpoints over the agent's REST
// API: the /v1/endpoint paths of the Cilium v1 spec (list, create with
// PUT as the stock cilium-cni does, get, patch, delete one or by
// container, config, labels, log, healthz).
package endpointapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
)

// Handlers serve the endpoint part of the API.
type Handlers struct {
	Log *slog.Logger
	// Manager is the endpoint manager; an API error before the endpoints'
	// start step built it.
	Manager func() (*endpointmanager.Manager, error)
	// NodeAddressing is the node's addressing in the endpoint models.
	NodeAddressing func() *models.NodeAddressing
	// ApplyPodLabels adds the pod's labels from Kubernetes to an endpoint
	// being created (nothing in standalone mode).
	ApplyPodLabels func(ctx context.Context, ep *endpoint.Endpoint)
	// PolicyModel is an endpoint's policy status in its model.
	PolicyModel func(ep *endpoint.Endpoint) *models.EndpointPolicyStatus
	// Holding wraps the handlers that create and delete endpoints (the
	// datapath holds TCX promotions back meanwhile); nil: not wrapped.
	Holding func(h server.HandlerFunc) server.HandlerFunc
}

func (h *Handlers) holding(f server.HandlerFunc) server.HandlerFunc {
	if h.Holding == nil {
		return f
	}
	return h.Holding(f)
}

// Register serves the /v1/endpoint paths of the Cilium v1 spec.
func (h *Handlers) Register(api *server.Server) {
	api.Handle(http.MethodGet, "/v1/endpoint", h.handleEndpointList)
	api.Handle(http.MethodDelete, "/v1/endpoint", h.holding(h.handleEndpointBatchDelete))
	api.Handle(http.MethodPut, "/v1/endpoint/{id}", h.holding(h.handleEndpointPut))
	api.Handle(http.MethodGet, "/v1/endpoint/{id}", h.handleEndpointGet)
	api.Handle(http.MethodPatch, "/v1/endpoint/{id}", h.handleEndpointPatch)
	api.Handle(http.MethodDelete, "/v1/endpoint/{id}", h.holding(h.handleEndpointDelete))
	api.Handle(http.MethodGet, "/v1/endpoint/{id}/config", h.handleEndpointConfigGet)
	api.Handle(http.MethodPatch, "/v1/endpoint/{id}/config", h.handleEndpointConfigPatch)
	api.Handle(http.MethodGet, "/v1/endpoint/{id}/labels", h.handleEndpointLabelsGet)
	api.Handle(http.MethodPatch, "/v1/endpoint/{id}/labels", h.handleEndpointLabelsPatch)
	api.Handle(http.MethodGet, "/v1/endpoint/{id}/log", h.handleEndpointLog)
	api.Handle(http.MethodGet, "/v1/endpoint/{id}/healthz", h.handleEndpointHealthz)
}

// endpointError maps manager errors to the spec's codes.
func endpointError(err error) error {
	switch {
	case errors.Is(err, endpointmanager.ErrNotFound):
		return server.Errorf(http.StatusNotFound, "%v", err)
	case errors.Is(err, endpointmanager.ErrInvalidID):
		return server.Errorf(http.StatusBadRequest, "%v", err)
	case errors.Is(err, endpointmanager.ErrExists):
		return server.Errorf(http.StatusConflict, "%v", err)
	}
	return err
}

func (h *Handlers) lookupEndpoint(r *http.Request) (*endpoint.Endpoint, error) {
	mgr, err := h.Manager()
	if err != nil {
		return nil, err
	}
	ep, err := mgr.Lookup(r.PathValue("id"))
	if err != nil {
		return nil, endpointError(err)
	}
	return ep, nil
}

func (h *Handlers) handleEndpointList(w http.ResponseWriter, r *http.Request) error {
	mgr, err := h.Manager()
	if err != nil {
		return err
	}
	// The spec's optional label filter comes as a JSON array body.
	var filter []string
	if r.ContentLength > 0 {
		if err := server.DecodeJSON(r, &filter); err != nil {
			return err
		}
	}
	out := []*models.Endpoint{}
	for _, ep := range mgr.List() {
		if hasAllLabels(ep.Labels, filter) {
			out = append(out, ep.Model(h.NodeAddressing()))
		}
	}
	server.WriteJSON(w, http.StatusOK, out)
	return nil
}

func hasAllLabels(have, want []string) bool {
	set := map[string]bool{}
	for _, l := range have {
		set[l] = true
	}
	for _, l := range want {
		if !set[l] {
			return false
		}
	}
	return true
}

func (h *Handlers) handleEndpointPut(w http.ResponseWriter, r *http.Request) error {
	mgr, err := h.Manager()
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	var requested uint16
	if !endpointmanager.IsNewID(id) {
		n, err := strconv.ParseUint(strings.TrimPrefix(id, "cilium-local:"), 10, 16)
		if err != nil || n > endpointmanager.MaxID {
			return server.Errorf(http.StatusBadRequest, "endpoint ID %q: PUT takes a numeric ID (0 to let the agent choose) up to %d", id, endpointmanager.MaxID)
		}
		requested = uint16(n)
	}
	var req models.EndpointChangeRequest
	if err := server.DecodeJSON(r, &req); err != nil {
		return err
	}
	// The body's ID is an int64: it is range-checked before it becomes an
	// endpoint ID, or 65537 would wrap to endpoint 1.
	if req.ID < 0 || req.ID > endpointmanager.MaxID {
		return server.Errorf(http.StatusBadRequest, "endpoint ID %d in the body: want 0 (the agent chooses) to %d", req.ID, endpointmanager.MaxID)
	}
	switch {
	case req.ID != 0 && requested == 0:
		requested = uint16(req.ID)
	case req.ID != 0 && int64(requested) != req.ID:
		return server.Errorf(http.StatusBadRequest, "endpoint ID %d in the body differs from %d in the path", req.ID, requested)
	}
	ep, err := endpoint.FromChangeRequest(&req)
	if err != nil {
		return server.Errorf(http.StatusBadRequest, "%v", err)
	}
	h.ApplyPodLabels(r.Context(), ep)
	uuids := map[netip.Addr]string{}
	if req.Addressing != nil {
		if ep.IPv4.IsValid() && req.Addressing.IPV4ExpirationUUID != "" {
			uuids[ep.IPv4] = req.Addressing.IPV4ExpirationUUID
		}
		if ep.IPv6.IsValid() && req.Addressing.IPV6ExpirationUUID != "" {
			uuids[ep.IPv6] = req.Addressing.IPV6ExpirationUUID
		}
	}
	created, err := mgr.Create(r.Context(), ep, endpointmanager.CreateOptions{
		SyncBuild: req.SyncBuildEndpoint, ExpirationUUIDs: uuids, RequestedID: requested,
	})
	if err != nil {
		if e := endpointError(err); e != err {
			return e
		}
		return server.Errorf(http.StatusInternalServerError, "%v", err)
	}
	if r.Context().Err() != nil {
		// The client gave up before the answer (a CNI plugin whose PUT timed
		// out during the synchronous build): it rolls its side back and
		// never learns this endpoint's ID, so the endpoint must not stay
		// behind holding the addresses.
		h.deleteUnanswered(r, mgr, created, r.Context().Err())
		return server.Errorf(http.StatusServiceUnavailable, "the client went away before endpoint %d was built; it was deleted", created.ID)
	}
	server.WriteJSON(w, http.StatusCreated, created.Model(h.NodeAddressing()))
	// The server may not have noticed yet that the client closed its
	// connection (its context is cancelled by a read that has not run):
	// the answer's flush fails on a connection the client closed, and
	// then nobody learned the ID either.
	if err := http.NewResponseController(w).Flush(); err != nil {
		h.deleteUnanswered(r, mgr, created, err)
	}
	return nil
}

// deleteUnanswered deletes an endpoint whose creator never got its answer.
func (h *Handlers) deleteUnanswered(r *http.Request, mgr *endpointmanager.Manager, created *endpoint.Endpoint, why error) {
	h.Log.Warn("Endpoint created after its client went away; deleting it", "endpoint", created.ID,
		"container", created.ContainerID, "error", why)
	if err := mgr.Delete(context.WithoutCancel(r.Context()), created.ID); err != nil && !errors.Is(err, endpointmanager.ErrNotFound) {
		h.Log.Error("Delete the endpoint of a client that went away", "endpoint", created.ID, "error", err)
	}
}

func (h *Handlers) handleEndpointGet(w http.ResponseWriter, r *http.Request) error {
	ep, err := h.lookupEndpoint(r)
	if err != nil {
		return err
	}
	m := ep.Model(h.NodeAddressing())
	m.Status.Policy = h.PolicyModel(ep)
	server.WriteJSON(w, http.StatusOK, m)
	return nil
}

// handleEndpointPatch updates the mutable parts of an endpoint: labels,
// the host interface (a plugin that learned its index late) and pod names.
func (h *Handlers) handleEndpointPatch(w http.ResponseWriter, r *http.Request) error {
	mgr, err := h.Manager()
	if err != nil {
		return err
	}
	var req models.EndpointChangeRequest
	if err := server.DecodeJSON(r, &req); err != nil {
		return err
	}
	if err := endpoint.CheckLabels(req.Labels); err != nil {
		return server.Errorf(http.StatusBadRequest, "%v", err)
	}
	_, err = mgr.Update(r.Context(), r.PathValue("id"), "Endpoint patched", func(ep *endpoint.Endpoint) error {
		if req.Addressing != nil && ((req.Addressing.IPV4 != "" && req.Addressing.IPV4 != addrString(ep.IPv4)) ||
			(req.Addressing.IPV6 != "" && req.Addressing.IPV6 != addrString(ep.IPv6))) {
			return server.Errorf(http.StatusBadRequest, "an endpoint's addresses cannot change; delete and re-create it")
		}
		if req.Labels != nil {
			ep.Labels = endpoint.SortedLabels(req.Labels)
		}
		if req.InterfaceName != "" {
			ep.HostIfName = req.InterfaceName
		}
		if req.InterfaceIndex != 0 {
			ep.HostIfIndex = int(req.InterfaceIndex)
		}
		if req.K8sNamespace != "" || req.K8sPodName != "" {
			if req.K8sNamespace == "" || req.K8sPodName == "" {
				return server.Errorf(http.StatusBadRequest, "k8s-namespace and k8s-pod-name must be given together")
			}
			ep.PodNamespace, ep.PodName = req.K8sNamespace, req.K8sPodName
		}
		return nil
	})
	if err != nil {
		var apiErr *server.Error
		if errors.As(err, &apiErr) {
			return apiErr
		}
		if e := endpointError(err); e != err {
			return e
		}
		return server.Errorf(http.StatusInternalServerError, "%v", err)
	}
	server.WriteJSON(w, http.StatusOK, nil)
	return nil
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

func (h *Handlers) handleEndpointDelete(w http.ResponseWriter, r *http.Request) error {
	mgr, err := h.Manager()
	if err != nil {
		return err
	}
	ep, err := mgr.Lookup(r.PathValue("id"))
	if err != nil {
		return endpointError(err)
	}
	if err := mgr.Delete(r.Context(), ep.ID); err != nil {
		if errors.Is(err, endpointmanager.ErrNotFound) {
			return endpointError(err)
		}
		// Deleted, but some teardown step failed: 206 with the error count.
		h.Log.Error("Endpoint deleted with errors", "endpoint", ep.ID, "error", err)
		server.WriteJSON(w, http.StatusPartialContent, 1)
		return nil
	}
	server.WriteJSON(w, http.StatusOK, nil)
	return nil
}

func (h *Handlers) handleEndpointBatchDelete(w http.ResponseWriter, r *http.Request) error {
	mgr, err := h.Manager()
	if err != nil {
		return err
	}
	var req models.EndpointBatchDeleteRequest
	if err := server.DecodeJSON(r, &req); err != nil {
		return err
	}
	if req.ContainerID == "" {
		return server.Errorf(http.StatusBadRequest, "container-id is required")
	}
	n, err := mgr.DeleteByContainerID(r.Context(), req.ContainerID)
	if n == 0 {
		return server.Errorf(http.StatusNotFound, "no endpoint of container %s", req.ContainerID)
	}
	if err != nil {
		h.Log.Error("Endpoints deleted with errors", "container-id", req.ContainerID, "error", err)
		server.WriteJSON(w, http.StatusPartialContent, 1)
		return nil
	}
	server.WriteJSON(w, http.StatusOK, nil)
	return nil
}

func (h *Handlers) handleEndpointConfigGet(w http.ResponseWriter, r *http.Request) error {
	ep, err := h.lookupEndpoint(r)
	if err != nil {
		return err
	}
	server.WriteJSON(w, http.StatusOK, &models.EndpointConfigurationStatus{
		Realized:  &models.EndpointConfigurationSpec{Options: ep.Options()},
		Immutable: models.ConfigurationMap{},
	})
	return nil
}

// handleEndpointConfigPatch accepts no per-endpoint option yet: enforcement
// follows the agent's policy-enforcement mode. Unknown options are 400.
func (h *Handlers) handleEndpointConfigPatch(w http.ResponseWriter, r *http.Request) error {
	if _, err := h.lookupEndpoint(r); err != nil {
		return err
	}
	var spec models.EndpointConfigurationSpec
	if err := server.DecodeJSON(r, &spec); err != nil {
		return err
	}
	for k := range spec.Options {
		return server.Errorf(http.StatusBadRequest, "endpoint option %s cannot be set per endpoint; use `tendril config set policy-enforcement=...`", k)
	}
	server.WriteJSON(w, http.StatusOK, nil)
	return nil
}

func (h *Handlers) handleEndpointLabelsGet(w http.ResponseWriter, r *http.Request) error {
	ep, err := h.lookupEndpoint(r)
	if err != nil {
		return err
	}
	m := ep.Model(nil)
	server.WriteJSON(w, http.StatusOK, &models.LabelConfiguration{Spec: m.Spec.LabelConfiguration, Status: m.Status.Labels})
	return nil
}

func (h *Handlers) handleEndpointLabelsPatch(w http.ResponseWriter, r *http.Request) error {
	mgr, err := h.Manager()
	if err != nil {
		return err
	}
	var spec models.LabelConfigurationSpec
	if err := server.DecodeJSON(r, &spec); err != nil {
		return err
	}
	for _, l := range spec.User {
		if !strings.Contains(l, "=") && !strings.Contains(l, ":") {
			return server.Errorf(http.StatusBadRequest, "label %q: want [source:]key[=value]", l)
		}
	}
	if err := endpoint.CheckLabels(spec.User); err != nil {
		return server.Errorf(http.StatusBadRequest, "%v", err)
	}
	if _, err := mgr.Update(r.Context(), r.PathValue("id"), "Labels changed", func(ep *endpoint.Endpoint) error {
		ep.Labels = endpoint.SortedLabels(spec.User)
		return nil
	}); err != nil {
		if e := endpointError(err); e != err {
			return e
		}
		return server.Errorf(http.StatusInternalServerError, "%v", err)
	}
	server.WriteJSON(w, http.StatusOK, nil)
	return nil
}

func (h *Handlers) handleEndpointLog(w http.ResponseWriter, r *http.Request) error {
	ep, err := h.lookupEndpoint(r)
	if err != nil {
		return err
	}
	log := ep.Model(nil).Status.Log
	if log == nil {
		log = models.EndpointStatusLog{}
	}
	server.WriteJSON(w, http.StatusOK, log)
	return nil
}

func (h *Handlers) handleEndpointHealthz(w http.ResponseWriter, r *http.Request) error {
	ep, err := h.lookupEndpoint(r)
	if err != nil {
		return err
	}
	server.WriteJSON(w, http.StatusOK, ep.Health())
	return nil
}
