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
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/version"
)

// registerDaemonAPI serves /v1/healthz, /v1/config and /v1/debuginfo.
func (a *Agent) registerDaemonAPI() {
	a.api.Handle(http.MethodGet, "/v1/healthz", func(w http.ResponseWriter, r *http.Request) error {
		brief, err := server.BoolHeader(r, "brief", false)
		if err != nil {
			return err
		}
		server.WriteJSON(w, http.StatusOK, a.Status(r.Context(), brief))
		return nil
	})
	a.api.Handle(http.MethodGet, "/v1/config", func(w http.ResponseWriter, r *http.Request) error {
		server.WriteJSON(w, http.StatusOK, a.DaemonConfig())
		return nil
	})
	a.api.Handle(http.MethodPatch, "/v1/config", func(w http.ResponseWriter, r *http.Request) error {
		var spec models.DaemonConfigurationSpec
		if err := server.DecodeJSON(r, &spec); err != nil {
			return err
		}
		err := a.runtime.Apply(spec.Options, spec.PolicyEnforcement, a.isKnownOption)
		if err != nil {
			if _, ok := err.(*option.ErrImmutable); ok {
				return server.Errorf(http.StatusForbidden, "%v", err)
			}
			return server.Errorf(http.StatusBadRequest, "%v", err)
		}
		server.WriteJSON(w, http.StatusOK, nil)
		return nil
	})
	a.api.Handle(http.MethodGet, "/v1/debuginfo", func(w http.ResponseWriter, r *http.Request) error {
		server.WriteJSON(w, http.StatusOK, a.DebugInfo(r.Context()))
		return nil
	})
}

func (a *Agent) isKnownOption(key string) bool {
	return a.flags != nil && a.flags.Lookup(key) != nil
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
func (a *Agent) Status(ctx context.Context, brief bool) *ext.StatusResponse {
	level, msg := a.health.Overall()
	resp := &ext.StatusResponse{}
	resp.Cilium = &models.Status{State: ciliumState(level), Msg: msg}
	if brief {
		return resp
	}
	resp.Kvstore = &models.Status{State: models.StatusStateDisabled, Msg: "no kvstore configured"}
	if a.kvstore != nil {
		resp.Kvstore = a.kvstore.model()
	}
	resp.Kubernetes = &models.K8sStatus{State: models.StatusStateDisabled, Msg: "standalone"}
	if a.k8s != nil {
		resp.Kubernetes = a.k8s.model()
	}
	resp.Ipam = a.endpoints.ipamStatus()
	resp.DatapathMode = models.DatapathModeVeth
	resp.AttachMode = models.AttachModeTcx
	if a.cfg.DatapathAttachMode == string(loader.AttachTC) {
		resp.AttachMode = models.AttachModeTc
	}
	steps, total := a.lc.Stats()
	a.mu.Lock()
	started := a.started
	sections := append(([]func() ext.Section)(nil), a.sections...)
	a.mu.Unlock()
	st := &ext.Status{
		Version:   version.String(),
		Started:   started,
		NodeName:  a.cfg.NodeName,
		Bootstrap: ext.Bootstrap{Total: total},
	}
	for _, s := range steps {
		st.Bootstrap.Steps = append(st.Bootstrap.Steps, ext.Step{Name: s.Name, Duration: s.Duration, Error: s.Error})
	}
	for _, m := range a.health.All() {
		st.Modules = append(st.Modules, ext.ModuleHealth{Module: m.Module, Level: string(m.Level), Message: m.Message, Since: m.Since})
	}
	for _, fn := range sections {
		st.Sections = append(st.Sections, fn())
	}
	resp.Tendril = st
	return resp
}

// DaemonConfig is the effective configuration as models.DaemonConfiguration.
func (a *Agent) DaemonConfig() *models.DaemonConfiguration {
	rt := a.runtime.Values()
	spec := &models.DaemonConfigurationSpec{Options: rt.OptionsMap(), PolicyEnforcement: rt.PolicyEnforcement}
	cfgMap := map[string]any{}
	immutable := models.ConfigurationMap{}
	if a.flags != nil {
		a.flags.VisitAll(func(f *pflag.Flag) {
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
			DeviceMTU:              int64(a.cfg.MTU),
			RouteMTU:               int64(a.cfg.MTU),
			IpamMode:               "cluster-pool",
			Addressing:             a.nodeAddressing(),
		},
	}
}

// nodeAddressing reports the node's address families; IPAM fills in the
// router addresses once it runs.
func (a *Agent) nodeAddressing() *models.NodeAddressing {
	return a.endpoints.nodeAddressing()
}

// DebugInfo gathers what a bug report needs.
func (a *Agent) DebugInfo(ctx context.Context) *models.DebugInfo {
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
	status := a.Status(ctx, false)
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
