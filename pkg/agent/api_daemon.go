package agent

import (
	"context"
	"net/http"
	"os"
	"sort"
	"strings"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/identity/identityapi"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/version"
)

// registerDaemonAPI serves /v1/healthz, /v1/config and /v1/debuginfo.
func (h *daemonAPI) register(api *server.Server) {
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

func (h *daemonAPI) isKnownOption(key string) bool {
	return h.flags.set != nil && h.flags.set.Lookup(key) != nil
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
func (h *daemonAPI) Status(ctx context.Context, brief bool) *ext.StatusResponse {
	level, msg := h.health.Overall()
	resp := &ext.StatusResponse{}
	resp.Cilium = &models.Status{State: ciliumState(level), Msg: msg}
	if brief {
		return resp
	}
	resp.Kvstore = &models.Status{State: models.StatusStateDisabled, Msg: "no kvstore configured"}
	if h.kvstore != nil {
		resp.Kvstore = h.kvstore.Model()
	}
	resp.Kubernetes = &models.K8sStatus{State: models.StatusStateDisabled, Msg: "standalone"}
	if h.k8s != nil {
		resp.Kubernetes = h.k8s.Model()
	}
	resp.Ipam = h.eps.IPAMStatus()
	resp.Hubble = &models.HubbleStatus{State: models.HubbleStatusStateDisabled}
	if h.flows != nil {
		resp.Hubble = h.flows.HubbleModel()
	}
	resp.DatapathMode = models.DatapathModeVeth
	resp.AttachMode = models.AttachModeTcx
	if h.cfg.Datapath.AttachMode == string(loader.AttachTC) {
		resp.AttachMode = models.AttachModeTc
	}
	steps, total := h.steps.Stats()
	started := h.steps.Started()
	st := &ext.Status{
		Version:   version.String(),
		Started:   started,
		NodeName:  h.cfg.NodeName,
		Bootstrap: ext.Bootstrap{Total: total},
	}
	for _, s := range steps {
		st.Bootstrap.Steps = append(st.Bootstrap.Steps, ext.Step{Name: s.Name, Duration: s.Duration, Error: s.Error})
	}
	for _, m := range h.health.All() {
		st.Modules = append(st.Modules, ext.ModuleHealth{Module: m.Module, Level: string(m.Level), Message: m.Message, Since: m.Since})
	}
	st.Sections = h.sections()

	resp.Tendril = st
	return resp
}

// DaemonConfig is the effective configuration as models.DaemonConfiguration.
func (h *daemonAPI) DaemonConfig() *models.DaemonConfiguration {
	rt := h.runtime.Values()
	spec := &models.DaemonConfigurationSpec{Options: rt.OptionsMap(), PolicyEnforcement: rt.PolicyEnforcement}
	cfgMap := map[string]any{}
	immutable := models.ConfigurationMap{}
	if h.flags.set != nil {
		h.flags.set.VisitAll(func(f *pflag.Flag) {
			cfgMap[f.Name] = f.Value.String()
			if f.Name != "debug" && f.Name != "policy-enforcement" {
				immutable[f.Name] = f.Value.String()
			}
		})
	}
	// The runtime values win over the start-up flags they came from.
	cfgMap["debug"] = rt.Debug
	cfgMap["policy-enforcement"] = rt.PolicyEnforcement
	return &models.DaemonConfiguration{
		Spec: spec,
		Status: &models.DaemonConfigurationStatus{
			Realized:               spec,
			Immutable:              immutable,
			DaemonConfigurationMap: cfgMap,
			DatapathMode:           models.DatapathModeVeth,
			DeviceMTU:              int64(h.cfg.Endpoints.MTU),
			RouteMTU:               int64(h.cfg.Endpoints.MTU),
			IpamMode:               "cluster-pool",
			Addressing:             h.eps.NodeAddressing(),
		},
	}
}

// sections are the modules' parts of `tendril status`, in a fixed order.
func (h *daemonAPI) sections() []ext.Section {
	var out []ext.Section
	if h.kvstore != nil {
		out = append(out, h.kvstore.StatusSection())
	}
	if h.k8s != nil {
		out = append(out, h.k8s.StatusSection())
	}
	if h.dp != nil {
		out = append(out, h.dp.StatusSection())
	}
	if h.masq != nil {
		out = append(out, h.masq.StatusSection())
	}
	if h.services != nil {
		out = append(out, h.services.StatusSection())
	}
	if h.l2 != nil {
		out = append(out, h.l2.StatusSection())
	}
	if h.flows != nil {
		out = append(out, h.flows.StatusSection())
	}
	if h.tables != nil {
		if sec := h.tables.StatusSection(); len(sec.Lines) > 0 {
			out = append(out, sec)
		}
	}
	return append(out, h.eps.StatusSection(), identityapi.StatusSection(h.identities, h.idTable))
}

// DebugInfo gathers what a bug report needs.
func (h *daemonAPI) DebugInfo(ctx context.Context) *models.DebugInfo {
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
	status := h.Status(ctx, false)
	subsystems := map[string]string{}
	for _, m := range status.Tendril.Modules {
		subsystems[m.Module] = m.Level + ": " + m.Message
	}
	return &models.DebugInfo{
		CiliumVersion:        "tendril " + version.String(),
		KernelVersion:        kernel,
		CiliumStatus:         &status.StatusResponse,
		EnvironmentVariables: env,
		EndpointList:         []*models.Endpoint{},
		ServiceList:          []*models.Service{},
		Subsystem:            subsystems,
	}
}
