package agent

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/datapath/agentdatapath"
	"github.com/tendril-net/tendril/pkg/datapath/hostdev"
	"github.com/tendril-net/tendril/pkg/endpointmanager/agentendpoints"
	"github.com/tendril-net/tendril/pkg/hubble/agentflows"
	"github.com/tendril-net/tendril/pkg/identity/agentidentity"
	"github.com/tendril-net/tendril/pkg/k8s/agentk8s"
	"github.com/tendril-net/tendril/pkg/kvstore/agentkv"
	"github.com/tendril-net/tendril/pkg/loadbalancer/agentservices"
	"github.com/tendril-net/tendril/pkg/loadbalancer/l2announcer"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/metrics"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/profiling"
)

// Config is the agent's whole configuration: its own options and each
// module's config struct.
type Config struct {
	// ConfigDir is a directory of one file per option (a mounted ConfigMap).
	ConfigDir string
	// StateDir holds endpoint state and allocator state across restarts.
	StateDir string
	// BPFRoot is the bpffs directory of this node's pinned maps and links.
	BPFRoot string
	// NodeName is this node's name (the Kubernetes Node name).
	NodeName string
	// PolicyEnforcement is default, always or never; changeable at run time.
	PolicyEnforcement string
	// Debug turns on debug logging; changeable at run time.
	Debug bool
	// LogFormat is text or json.
	LogFormat string

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
		StateDir:          "/var/run/tendril/state",
		BPFRoot:           "/sys/fs/bpf/tendril",
		PolicyEnforcement: option.EnforcementDefault,
		LogFormat:         "text",
		Kubernetes:        agentk8s.DefaultConfig(),
		KVStore:           agentkv.DefaultOptions(),
		Identity:          agentidentity.DefaultConfig(),
		Endpoints:         agentendpoints.DefaultConfig(),
		Datapath:          agentdatapath.DefaultConfig(),
		Services:          agentservices.DefaultConfig(),
		Hubble:            agentflows.DefaultConfig(),
		Masquerade:        hostdev.DefaultConfig(),
		L2Announcements:   l2announcer.DefaultConfig(),
		API:               server.DefaultConfig(),
		Metrics:           metrics.DefaultConfig(),
		Profiling:         profiling.DefaultConfig(),
	}
}

// Flags registers every option as a flag; the flag names are also the
// config-directory keys and, as TENDRIL_*, the environment variables.
func (c *Config) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.ConfigDir, "config-dir", c.ConfigDir, "Directory with one file per option (e.g. a mounted ConfigMap)")
	fs.StringVar(&c.StateDir, "state-dir", c.StateDir, "Directory for state kept across restarts")
	fs.StringVar(&c.BPFRoot, "bpf-root", c.BPFRoot, "bpffs directory for this node's pinned maps and links")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "Name of this node (default: the host name)")
	fs.StringVar(&c.PolicyEnforcement, "policy-enforcement", c.PolicyEnforcement, "Policy enforcement mode: default, always or never")
	fs.BoolVar(&c.Debug, "debug", c.Debug, "Log at debug level")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "Log format: text or json")
	for _, cellConfig := range []interface{ Flags(*pflag.FlagSet) }{&c.Kubernetes, &c.KVStore, &c.Identity, &c.Endpoints,
		&c.Datapath, &c.Services, &c.Hubble, &c.Masquerade, &c.L2Announcements, &c.API, &c.Metrics, &c.Profiling} {
		cellConfig.Flags(fs)
	}
}

// Validate checks the agent-wide values and each cell's config; each
// error names its option.
func (c *Config) Validate() error {
	var errs []error
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("state-dir %q: must be an absolute path", c.StateDir))
	}
	if err := bpffs.CheckPath(c.BPFRoot); err != nil {
		errs = append(errs, fmt.Errorf("bpf-root %w", err))
	}
	errs = append(errs, c.API.Validate(), option.ValidateEnforcement(c.PolicyEnforcement))
	errs = append(errs, logging.CheckFormat(c.LogFormat), c.Endpoints.Validate(), c.Datapath.Validate(), c.Kubernetes.Validate(), c.Identity.Validate())
	// The one check across two cells' options.
	if c.Identity.AllocationMode == agentidentity.AllocationKVStore && !c.KVStore.Enabled() {
		errs = append(errs, fmt.Errorf("identity-allocation-mode kvstore: needs --kvstore (etcd with --kvstore-endpoints, or embedded)"))
	}
	// errors.Join drops the nil errors of the valid ones.
	errs = append(errs, c.KVStore.Validate(), c.Services.Validate(), c.Hubble.Validate(), c.Masquerade.Validate(),
		c.L2Announcements.Validate())
	return errors.Join(errs...)
}
