package agentservices

import (
	"net/http"
	"strconv"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
	"github.com/tendril-net/tendril/pkg/loadbalancer/lbmap"
)

// ServiceAPI serves /v1/service: the frontends as Cilium's models.Service.
type ServiceAPI struct{ Services *Module }

// Register adds the service API's handlers to the API server.
func (h *ServiceAPI) Register(api *server.Server) {
	api.Handle(http.MethodGet, "/v1/service", h.handleList)
	api.Handle(http.MethodGet, "/v1/service/{id}", h.handleGet)
}

// serviceModels returns every frontend, in the table's order (by
// address). The ID is the service ID in the LB maps (0 while not written,
// or without the datapath).
func (h *ServiceAPI) serviceModels() []*models.Service {
	out := []*models.Service{}
	m := h.Services
	for f := range m.tables.Frontends.All(m.tables.DB.ReadTxn()) {
		out = append(out, m.serviceModel(f))
	}
	return out
}

func (m *Module) serviceModel(f *loadbalancer.Frontend) *models.Service {
	var ids lbmap.IDs
	if m.ops != nil {
		ids, _ = m.ops.FrontendIDs(f.Key)
	}
	extPolicy := f.ExternalTrafficPolicy
	if extPolicy == "" {
		extPolicy = loadbalancer.TrafficPolicyCluster
	}
	spec := &models.ServiceSpec{
		ID: int64(ids.Service),
		FrontendAddress: &models.FrontendAddress{IP: f.Key.Addr.Addr().String(), Port: f.Key.Addr.Port(),
			Protocol: loadbalancer.ProtoName(f.Key.Proto), Scope: models.FrontendAddressScopeExternal},
		BackendAddresses: []*models.BackendAddress{},
		Flags: &models.ServiceSpecFlags{Type: f.Type, Name: f.Service.Name, Namespace: f.Service.Namespace,
			IntTrafficPolicy: f.InternalTrafficPolicy, ExtTrafficPolicy: extPolicy},
	}
	for _, b := range f.Backends {
		ip := b.Addr.Addr().String()
		state := models.BackendAddressStateActive
		if b.Terminating {
			state = models.BackendAddressStateTerminating
		}
		spec.BackendAddresses = append(spec.BackendAddresses, &models.BackendAddress{IP: &ip, Port: b.Addr.Port(),
			Protocol: loadbalancer.ProtoName(f.Key.Proto), State: state, NodeName: b.NodeName, Zone: b.Zone, Preferred: b.Active})
	}
	svc := &models.Service{Spec: spec, Status: &models.ServiceStatus{}}
	if f.Status.Kind == reconciler.StatusKindDone {
		svc.Status.Realized = spec
	}
	return svc
}

func (h *ServiceAPI) handleList(w http.ResponseWriter, _ *http.Request) error {
	server.WriteJSON(w, http.StatusOK, h.serviceModels())
	return nil
}

func (h *ServiceAPI) handleGet(w http.ResponseWriter, r *http.Request) error {
	raw := r.PathValue("id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 {
		return server.Errorf(http.StatusBadRequest, "service %q: must be a positive number", raw)
	}
	for _, s := range h.serviceModels() {
		if s.Spec.ID == id {
			server.WriteJSON(w, http.StatusOK, s)
			return nil
		}
	}
	return server.Errorf(http.StatusNotFound, "service %d not found", id)
}

// apiHandlers serves the services' API and the local redirect policies'.
func apiHandlers(m *Module) server.HandlersOut {
	return server.Handlers((&ServiceAPI{Services: m}).Register, (&LRPAPI{Services: m}).Register)
}
