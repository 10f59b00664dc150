package agentendpoints

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/endpointmanager"
)

// CNIAPI serves POST /v1/cni/{command}, the Tendril extension that
// tendril-cni forwards every CNI command to (the work is in
// pkg/cni/cniserver; see docs/cni.md).
type CNIAPI struct {
	Endpoints *Module
	// HoldPromotions keeps endpoints from moving to TCX links until the
	// function it returns is called; nil without the datapath.
	HoldPromotions func() func()
}

// Register adds the CNI API's handler to the API server.
func (h *CNIAPI) Register(api *server.Server) {
	api.Handle(http.MethodPost, cni.APIPrefix+"{command}", h.handleCNI)
}

func (h *CNIAPI) handleCNI(w http.ResponseWriter, r *http.Request) error {
	command := strings.ToUpper(r.PathValue("command"))
	switch command {
	case cni.CommandAdd, cni.CommandDel, cni.CommandCheck, cni.CommandStatus, cni.CommandGC:
	default:
		return server.Errorf(http.StatusNotFound, "unknown CNI command %q: want add, del, check, status or gc", r.PathValue("command"))
	}
	srv := h.Endpoints.cniServer()
	if srv == nil {
		return server.Errorf(http.StatusServiceUnavailable, "endpoints and IPAM are not started yet")
	}
	if h.HoldPromotions != nil && (command == cni.CommandAdd || command == cni.CommandDel) {
		// No endpoint moves to TCX links while pods come and go.
		defer h.HoldPromotions()()
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

// Holding wraps a handler that creates or removes endpoints (the stock
// cilium-cni's calls): no endpoint moves to TCX links meanwhile (hold nil:
// the handler as it is).
func Holding(hold func() func(), h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if hold != nil {
			defer hold()()
		}
		return h(w, r)
	}
}

func writeCNIError(w http.ResponseWriter, e *cni.Error) {
	server.WriteJSON(w, cni.StatusForCode(e.Code), e)
}

// cniEndpoints gives the CNI server the endpoint manager, with what PUT
// /v1/endpoint adds: labels from Kubernetes, and the synchronous build.
type cniEndpoints struct{ m *Module }

func (c cniEndpoints) Create(ctx context.Context, ep *endpoint.Endpoint) (*endpoint.Endpoint, error) {
	if health, _ := ctx.Value(healthKey{}).(bool); health {
		ep.Labels = []string{HealthLabel}
	}
	return c.m.CreateEndpoint(ctx, ep)
}

// CreateEndpoint creates an endpoint as CNI ADD does: with its pod's
// labels from Kubernetes, built before it returns.
func (m *Module) CreateEndpoint(ctx context.Context, ep *endpoint.Endpoint) (*endpoint.Endpoint, error) {
	m.ApplyPodLabels(ctx, ep)
	return m.mgr.Create(ctx, ep, endpointmanager.CreateOptions{SyncBuild: true})
}

func (c cniEndpoints) Lookup(id string) (*endpoint.Endpoint, error) {
	return c.m.mgr.Lookup(id)
}

func (c cniEndpoints) Delete(ctx context.Context, id uint16) error {
	return c.m.mgr.Delete(ctx, id)
}

func (c cniEndpoints) List() []*endpoint.Endpoint { return c.m.mgr.List() }

func (c cniEndpoints) IsNotFound(err error) bool { return errors.Is(err, endpointmanager.ErrNotFound) }

// HealthLabel is the label of the node's health endpoint: the reserved
// health identity (4), as Cilium's cilium-health endpoint has.
const HealthLabel = "reserved:health"

// healthKey marks the context of the health endpoint's ADD: only the
// agent's own call (CreateHealthEndpoint) gets the reserved label, never a
// CNI request.
type healthKey struct{}

// CreateHealthEndpoint wires the network namespace at netnsPath as a pod
// through the CNI server's ADD (an address from this node's IPAM, the veth,
// the routes, the endpoint built before it returns) under the attachment
// containerID/ifname, labelled HealthLabel. An earlier endpoint of the same
// attachment is replaced, its addresses released. It fails until the
// endpoints' start step has run.
func (m *Module) CreateHealthEndpoint(ctx context.Context, containerID, ifname, netnsPath string) (*endpoint.Endpoint, error) {
	srv := m.cniServer()
	if srv == nil {
		return nil, ErrNotStarted
	}
	req := &cni.Request{ContainerID: containerID, IfName: ifname, Netns: netnsPath,
		Config: []byte(`{"cniVersion":"1.0.0","name":"tendril-health","type":"tendril-cni"}`)}
	if _, cerr := srv.Serve(context.WithValue(ctx, healthKey{}, true), cni.CommandAdd, req); cerr != nil {
		return nil, fmt.Errorf("health endpoint ADD: %w", cerr)
	}
	return m.mgr.Lookup("cni-attachment-id:" + cni.AttachmentID(containerID, ifname))
}

// DeleteHealthEndpoint removes the endpoint CreateHealthEndpoint made
// through the CNI server's DEL (its addresses released, its veth and
// routes removed); nothing to remove is no error. It fails until the
// endpoints' start step has run.
func (m *Module) DeleteHealthEndpoint(ctx context.Context, containerID, ifname, netnsPath string) error {
	srv := m.cniServer()
	if srv == nil {
		return ErrNotStarted
	}
	req := &cni.Request{ContainerID: containerID, IfName: ifname, Netns: netnsPath,
		Config: []byte(`{"cniVersion":"1.0.0","name":"tendril-health","type":"tendril-cni"}`)}
	if _, cerr := srv.Serve(context.WithValue(ctx, healthKey{}, true), cni.CommandDel, req); cerr != nil {
		return fmt.Errorf("health endpoint DEL: %w", cerr)
	}
	return nil
}

// ErrNotStarted is the error of the calls that need the endpoints' start
// step (the restore, IPAM, the CNI server) before it has run.
var ErrNotStarted = errors.New("endpoints and IPAM are not started yet")

// LookupEndpoint finds an endpoint by an ID of the Cilium API;
// ErrNotStarted before the start step has restored the endpoints and
// serves the CNI server (read under its lock, which orders it after the
// manager was built: a job may call this while the step runs).
func (m *Module) LookupEndpoint(id string) (*endpoint.Endpoint, error) {
	if m.cniServer() == nil {
		return nil, ErrNotStarted
	}
	return m.mgr.Lookup(id)
}

// InstallsHostNetworking is --install-host-networking: the agent wires
// pods (host device, routes) in its namespace.
func (m *Module) InstallsHostNetworking() bool { return m.cfg.InstallHostNetworking }
