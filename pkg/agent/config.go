package agent

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentflows"
	"github.com/tendril-net/tendril/pkg/agent/agentidentity"
	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/agent/agentkv"
	"github.com/tendril-net/tendril/pkg/agent/agentservices"
	"github.com/tendril-net/tendril/pkg/agent/hostdev"
	"github.com/tendril-net/tendril/pkg/agent/l2announcer"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/profiling"
)

// Config is the agent's whole configuration: its own options and each
// module's config struct.
type Config struct {
	// attachModeNote is set by New when the kernel made it fall back from
	// tcx to tc: why, and what the node cannot do then.
	attachModeNote string

	// The agent's own options: state and pin directories, node name,
	// policy enforcement, log options.
	option.Agent

	// Each cell's options, documented with their flags in its package:
	// the Kubernetes client (none: standalone), the kvstore (none, etcd or
	// embedded), identity allocation, endpoints and IPAM, the eBPF
	// datapath, services, flows (Hubble), the host devices' masquerade,
	// L2 announcements, the API socket, metrics and pprof.
	Kubernetes      agentk8s.Config
	KVStore         agentkv.Options
	Identity        agentidentity.Config
	Endpoints       agentendpoints.Config
	Datapath        agentdatapath.Config
	Services        agentservices.Config
	Hubble          agentflows.Config
	Masquerade      hostdev.Config
	L2Announcements l2announcer.Config
	API             server.Config
	Metrics         metrics.Config
	Profiling       profiling.Config
}

// DefaultConfig returns the defaults of every option.
func DefaultConfig() Config {
	return Config{
		Agent:           option.DefaultAgent(),
		Kubernetes:      agentk8s.DefaultConfig(),
		KVStore:         agentkv.DefaultOptions(),
		Identity:        agentidentity.DefaultConfig(),
		Endpoints:       agentendpoints.DefaultConfig(),
		Datapath:        agentdatapath.DefaultConfig(),
		Services:        agentservices.DefaultConfig(),
		Hubble:          agentflows.DefaultConfig(),
		Masquerade:      hostdev.DefaultConfig(),
		L2Announcements: l2announcer.DefaultConfig(),
		API:             server.DefaultConfig(),
		Metrics:         metrics.DefaultConfig(),
		Profiling:       profiling.DefaultConfig(),
	}
}

// Flags registers every option as a flag; the flag names are also the
// config-directory keys and, as TENDRIL_*, the environment variables.
func (c *Config) Flags(fs *pflag.FlagSet) {
	for _, options := range []interface{ Flags(*pflag.FlagSet) }{&c.Agent, &c.Kubernetes, &c.KVStore, &c.Identity, &c.Endpoints,
		&c.Datapath, &c.Services, &c.Hubble, &c.Masquerade, &c.L2Announcements, &c.API, &c.Metrics, &c.Profiling} {
		options.Flags(fs)
	}
}

// Validate checks the agent's own options and each cell's config; each
// error names its option.
func (c *Config) Validate() error {
	errs := []error{c.Agent.Validate(), c.API.Validate(), c.Endpoints.Validate(), c.Datapath.Validate(), c.Kubernetes.Validate(), c.Identity.Validate()}
	// The one check across two cells' options.
	if c.Identity.AllocationMode == agentidentity.AllocationKVStore && !c.KVStore.Enabled() {
		errs = append(errs, fmt.Errorf("identity-allocation-mode kvstore: needs --kvstore (etcd with --kvstore-endpoints, or embedded)"))
	}
	// errors.Join drops the nil errors of the valid ones.
	errs = append(errs, c.KVStore.Validate(), c.Services.Validate(), c.Hubble.Validate(), c.Masquerade.Validate(),
		c.L2Announcements.Validate())
	return errors.Join(errs...)
}
