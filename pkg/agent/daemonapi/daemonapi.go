// Package daemonapi serves the agent's own REST API: /v1/healthz (the
// status: overall health, bootstrap stats, module health and the
// subsystems' sections collected by pkg/status), /v1/config (the
// effective configuration and the runtime options) and /v1/debuginfo.
package daemonapi

import (
	"context"
	"net/http"
	"os"
	"sort"
	"strings"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/status"
	"github.com/tendril-net/tendril/pkg/version"
)

// Cell registers the daemon handlers on the API server.
var Cell = cell.Module("daemon-api", "The agent status configuration and debug info API",
	cell.Provide(register),
)

// settings are what the handlers read of the cells' options.
type settings struct {
	NodeName string
	// AttachModeTC: the datapath attaches with tc rather than tcx.
	AttachModeTC bool
	// AttachModeNote says why the attach mode is not the one asked for
	// (a kernel without TCX) and what the node cannot do then; "": none.
	AttachModeNote string
	// MTU is the pods' device MTU.
	MTU int
}

// Flags is the resolved flag set: the effective configuration (nil in
// tests that build the agent without a command). A type of its own
// because hive provides its own, empty, *pflag.FlagSet.
type Flags struct{ Set *pflag.FlagSet }

// Addressing is the node's addressing as the v1 API shows it (the
// endpoints' IPAM).
type Addressing interface {
	NodeAddressing() *models.NodeAddressing
}

type params struct {
	cell.In

	Node       option.LocalNode
	Attach     agentdatapath.AttachMode
	Endpoints  agentendpoints.Config
	Flags      Flags
	Addressing Addressing
	Runtime    *option.Runtime
	Health     *health.Registry
	Steps      *lifecycle.Steps
	API        *server.Server
	Status     status.In
}

// Handlers serve /v1/healthz, /v1/config and /v1/debuginfo.
type Handlers struct {
	settings      settings
	flags         *pflag.FlagSet
	addressing    Addressing
	runtime       *option.Runtime
	health        *health.Registry
	steps         *lifecycle.Steps
	contributions []status.Contribution
}

func register(p params) lifecycle.Invoked {
	set := settings{NodeName: p.Node.Name, AttachModeTC: p.Attach.Mode == loader.AttachTC, AttachModeNote: p.Attach.Note, MTU: p.Endpoints.MTU}
	h := &Handlers{settings: set, flags: p.Flags.Set, addressing: p.Addressing, runtime: p.Runtime, health: p.Health, steps: p.Steps, contributions: p.Status.Contributions}
	h.Register(p.API)
	return lifecycle.Invoked{}
}

// Register serves the handlers on api.
func (h *Handlers) Register(api *server.Server) {
	api.Handle(http.MethodGet, "/v1/healthz", func(w http.ResponseWriter, r *http.Request) error {
		brief, err := server.BoolHeader(r, "brief", false)
		if err != nil {
			return err
		}
		server.WriteJSON(w, http.StatusOK, h.Status(r.Context(), brief))
		return nil
	})
	api.Handle(http.MethodGet, "/v1/config", func(w http.ResponseWriter, r *http.Request) error {
		server.WriteJSON(w, http.StatusOK, h.DaemonConfig())
		return nil
	})
	api.Handle(http.MethodPatch, "/v1/config", func(w http.ResponseWriter, r *http.Request) error {
		var spec models.DaemonConfigurationSpec
		if err := server.DecodeJSON(r, &spec); err != nil {
			return err
		}
		err := h.runtime.Apply(spec.Options, spec.PolicyEnforcement, h.isKnownOption)
		if err != nil {
			if _, ok := err.(*option.ErrImmutable); ok {
				return server.Errorf(http.StatusForbidden, "%v", err)
			}
			return server.Errorf(http.StatusBadRequest, "%v", err)
		}
		server.WriteJSON(w, http.StatusOK, nil)
		return nil
	})
	api.Handle(http.MethodGet, "/v1/debuginfo", func(w http.ResponseWriter, r *http.Request) error {
		server.WriteJSON(w, http.StatusOK, h.DebugInfo(r.Context()))
		return nil
	})
}

func (h *Handlers) isKnownOption(key string) bool {
	return h.flags != nil && h.flags.Lookup(key) != nil
}

// ciliumState maps a health level to the state strings of the Cilium API
// (stock clients accept only Ok and Disabled as healthy).
func ciliumState(l health.Level) string {
	switch l {
	case health.LevelOK:
		return models.StatusStateOk
	case health.LevelDegraded:
		return models.StatusStateWarning
	default:
		return models.StatusStateFailure
	}
}

// Status aggregates module health, bootstrap stats and the status sections.
func (h *Handlers) Status(ctx context.Context, brief bool) *ext.StatusResponse {
	level, msg := h.health.Overall()
	resp := &ext.StatusResponse{}
	resp.Cilium = &models.Status{State: ciliumState(level), Msg: msg}
	if brief {
		return resp
	}
	// What no subsystem fills is off; the contributions overwrite these.
	resp.Kvstore = &models.Status{State: models.StatusStateDisabled, Msg: "no kvstore configured"}
	resp.Kubernetes = &models.K8sStatus{State: models.StatusStateDisabled, Msg: "standalone"}
	resp.Hubble = &models.HubbleStatus{State: models.HubbleStatusStateDisabled}
	status.FillModels(h.contributions, resp)
	resp.DatapathMode = models.DatapathModeVeth
	resp.AttachMode = models.AttachModeTcx
	if h.settings.AttachModeTC {
		resp.AttachMode = models.AttachModeTc
	}
	steps, total := h.steps.Stats()
	st := &ext.Status{
		Version:   version.String(),
		Started:   h.steps.Started(),
		NodeName:  h.settings.NodeName,
		Bootstrap: ext.Bootstrap{Total: total},
	}
	for _, s := range steps {
		st.Bootstrap.Steps = append(st.Bootstrap.Steps, ext.Step{Name: s.Name, Duration: s.Duration, Error: s.Error})
	}
	for _, m := range h.health.All() {
		st.Modules = append(st.Modules, ext.ModuleHealth{Module: m.Module, Level: string(m.Level), Message: m.Message, Since: m.Since})
	}
	st.Sections = status.Sections(h.contributions)
	if h.settings.AttachModeNote != "" {
		st.Sections = append(st.Sections, ext.Section{Title: "Datapath", Lines: []ext.Line{{Key: "attach mode", Value: "tc (fallback): " + h.settings.AttachModeNote}}})
	}
	resp.Tendril = st
	return resp
}

// DaemonConfig is the effective configuration as models.DaemonConfiguration.
func (h *Handlers) DaemonConfig() *models.DaemonConfiguration {
	rt := h.runtime.Values()
	spec := &models.DaemonConfigurationSpec{Options: rt.OptionsMap(), PolicyEnforcement: rt.PolicyEnforcement}
	cfgMap := map[string]any{}
	immutable := models.ConfigurationMap{}
	if h.flags != nil {
		h.flags.VisitAll(func(f *pflag.Flag) {
			cfgMap[f.Name] = f.Value.String()
			if f.Name != "debug" && f.Name != "policy-enforcement" {
				immutable[f.Name] = f.Value.String()
			}
		})
	}
	// The runtime values win over the start-up flags they came from.
	cfgMap["debug"] = rt.Debug
	cfgMap["policy-enforcement"] = rt.PolicyEnforcement
	var addressing *models.NodeAddressing
	if h.addressing != nil {
		addressing = h.addressing.NodeAddressing()
	}
	return &models.DaemonConfiguration{
		Spec: spec,
		Status: &models.DaemonConfigurationStatus{
			Realized:               spec,
			Immutable:              immutable,
			DaemonConfigurationMap: cfgMap,
			DatapathMode:           models.DatapathModeVeth,
			DeviceMTU:              int64(h.settings.MTU),
			RouteMTU:               int64(h.settings.MTU),
			IpamMode:               "cluster-pool",
			Addressing:             addressing,
		},
	}
}

// DebugInfo gathers what a bug report needs.
func (h *Handlers) DebugInfo(ctx context.Context) *models.DebugInfo {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TENDRIL_") {
			env = append(env, kv)
		}
	}
	sort.Strings(env)
	var uts unix.Utsname
	kernel := ""
	if unix.Uname(&uts) == nil {
		kernel = unix.ByteSliceToString(uts.Release[:])
	}
	st := h.Status(ctx, false)
	subsystems := map[string]string{}
	for _, m := range st.Tendril.Modules {
		subsystems[m.Module] = m.Level + ": " + m.Message
	}
	return &models.DebugInfo{
		CiliumVersion:        "tendril " + version.String(),
		KernelVersion:        kernel,
		CiliumStatus:         &st.StatusResponse,
		EnvironmentVariables: env,
		EndpointList:         []*models.Endpoint{},
		ServiceList:          []*models.Service{},
		Subsystem:            subsystems,
	}
}
