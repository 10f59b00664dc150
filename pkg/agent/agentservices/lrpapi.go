package agentservices

import (
	"net/http"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// Frontend types and policy types of an LRP, as Cilium's agent names them
// in models.LRPSpec (FrontendType, LRPType).
const (
	lrpTypeAddr           = "addr"
	lrpTypeSvc            = "svc"
	lrpAddrSinglePort     = "IP + port"
	lrpAddrNamedPorts     = "IP + named ports"
	lrpSvcAllPorts        = "clusterIP + all svc ports"
	lrpSvcSinglePort      = "clusterIP + port"
	lrpSvcNamedPorts      = "clusterIP + named ports"
	lrpFrontendTypeUnkown = "unknown"
)

// LRPAPI serves GET /v1/lrp: the local redirect policies this node
// applies (those its source accepted), each with the frontends it
// redirects now and their local backends, as Cilium's models.LRPSpec.
type LRPAPI struct{ Services *Module }

// Register adds the handler to the API server.
func (h *LRPAPI) Register(api *server.Server) {
	api.Handle(http.MethodGet, "/v1/lrp", h.handleList)
}

// LRPModels are the policies in the table's order (by namespace/name).
func (m *Module) LRPModels() []*models.LRPSpec {
	out := []*models.LRPSpec{}
	txn := m.tables.DB.ReadTxn()
	for r := range m.tables.Redirects.All(txn) {
		spec := &models.LRPSpec{UID: r.UID, Name: r.Name.Name, Namespace: r.Name.Namespace, FrontendType: lrpFrontendTypeUnkown,
			FrontendMappings: []*models.FrontendMapping{}}
		owner := r.Service
		if r.AddressMatcher() {
			spec.LrpType = lrpTypeAddr
			owner = r.ServiceName()
			spec.FrontendType = lrpAddrSinglePort
			if len(r.Ports) > 1 {
				spec.FrontendType = lrpAddrNamedPorts
			}
		} else {
			spec.LrpType = lrpTypeSvc
			spec.ServiceID = r.Service.String()
			switch {
			case len(r.Ports) == 0:
				spec.FrontendType = lrpSvcAllPorts
			case len(r.Ports) == 1:
				spec.FrontendType = lrpSvcSinglePort
			default:
				spec.FrontendType = lrpSvcNamedPorts
			}
		}
		pods := map[loadbalancer.FrontendKey]string{}
		for _, b := range r.Backends {
			pods[loadbalancer.FrontendKey{Addr: b.Addr, Proto: b.Proto}] = b.Pod
		}
		for f := range m.tables.Frontends.List(txn, loadbalancer.FrontendByService.Query(owner)) {
			if f.Redirect != r.Name {
				continue
			}
			proto := loadbalancer.ProtoName(f.Key.Proto)
			fm := &models.FrontendMapping{
				FrontendAddress: &models.FrontendAddress{IP: f.Key.Addr.Addr().String(), Port: f.Key.Addr.Port(), Protocol: proto,
					Scope: models.FrontendAddressScopeExternal},
				Backends: []*models.LRPBackend{},
			}
			for _, b := range f.Backends {
				ip := b.Addr.Addr().String()
				fm.Backends = append(fm.Backends, &models.LRPBackend{PodID: pods[loadbalancer.FrontendKey{Addr: b.Addr, Proto: f.Key.Proto}],
					BackendAddress: &models.BackendAddress{IP: &ip, Port: b.Addr.Port(), Protocol: proto, State: models.BackendAddressStateActive,
						Preferred: b.Active}})
			}
			spec.FrontendMappings = append(spec.FrontendMappings, fm)
		}
		out = append(out, spec)
	}
	return out
}

func (h *LRPAPI) handleList(w http.ResponseWriter, _ *http.Request) error {
	server.WriteJSON(w, http.StatusOK, h.Services.LRPModels())
	return nil
}
