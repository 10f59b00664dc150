package agent

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/datapath/agentdatapath"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
)

// registerCNIAPI serves POST /v1/cni/{command}, the Tendril extension that
// tendril-cni forwards every CNI command to (the work is in
// pkg/cni/cniserver; see docs/cni.md).
func (h *cniAPI) register(api *server.Server) {
	api.Handle(http.MethodPost, cni.APIPrefix+"{command}", h.handleCNI)
}

func (h *cniAPI) handleCNI(w http.ResponseWriter, r *http.Request) error {
	command := strings.ToUpper(r.PathValue("command"))
	switch command {
	case cni.CommandAdd, cni.CommandDel, cni.CommandCheck, cni.CommandStatus, cni.CommandGC:
	default:
		return server.Errorf(http.StatusNotFound, "unknown CNI command %q: want add, del, check, status or gc", r.PathValue("command"))
	}
	srv := h.eps.cniServer()
	if srv == nil {
		return server.Errorf(http.StatusServiceUnavailable, "endpoints and IPAM are not started yet")
	}
	if h.dp != nil && (command == cni.CommandAdd || command == cni.CommandDel) {
		// No endpoint moves to TCX links while pods come and go.
		defer h.dp.Loader().HoldPromotions()()
	}
	var req cni.Request
	if err := server.DecodeJSON(r, &req); err != nil {
		return err
	}
	if c := bytes.TrimSpace(req.Config); len(c) == 0 || bytes.Equal(c, []byte("null")) {
		writeCNIError(w, cni.Errorf(cni.ErrDecodingFailure, "the request holds no network configuration"))
		return nil
	}
	result, cerr := srv.Serve(r.Context(), command, &req)
	if cerr != nil {
		writeCNIError(w, cerr)
		return nil
	}
	if result == nil {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	// The result goes out as one write with its length, so the plugin
	// reads exactly the result it prints.
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(result)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(result)
	return nil
}

// holdingPromotions wraps a handler that creates or removes endpoints (the
// stock cilium-cni's calls): no endpoint moves to TCX links meanwhile.
func holdingPromotions(dp *agentdatapath.Module, h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if dp != nil {
			defer dp.Loader().HoldPromotions()()
		}
		return h(w, r)
	}
}

func writeCNIError(w http.ResponseWriter, e *cni.Error) {
	server.WriteJSON(w, cni.StatusForCode(e.Code), e)
}

// cniEndpoints gives the CNI server the endpoint manager, with what PUT
// /v1/endpoint adds: labels from Kubernetes, and the synchronous build.
type cniEndpoints struct{ m *endpointsModule }

func (c cniEndpoints) Create(ctx context.Context, ep *endpoint.Endpoint) (*endpoint.Endpoint, error) {
	c.m.applyPodLabels(ctx, ep)
	return c.m.mgr.Create(ctx, ep, endpointmanager.CreateOptions{SyncBuild: true})
}

func (c cniEndpoints) Lookup(id string) (*endpoint.Endpoint, error) {
	return c.m.mgr.Lookup(id)
}

func (c cniEndpoints) Delete(ctx context.Context, id uint16) error {
	return c.m.mgr.Delete(ctx, id)
}

func (c cniEndpoints) List() []*endpoint.Endpoint { return c.m.mgr.List() }

func (c cniEndpoints) IsNotFound(err error) bool { return errors.Is(err, endpointmanager.ErrNotFound) }
