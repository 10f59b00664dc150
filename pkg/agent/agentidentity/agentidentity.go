// Package agentidentity is the agent's identity cell: the identity
// allocator of the configured mode (local, TendrilIdentity objects, or
// etcd keys), the identities table that follows it
// (pkg/identity/identitytable), and the filter that decides which of a
// pod's labels count for its identity. It has no start step: the
// Kubernetes client and kvstore steps hand the allocators their clients.
package agentidentity

import (
	"fmt"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/pkg/agent/agentk8s"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/identity/crdalloc"
	"github.com/tendril-net/tendril/pkg/identity/identitytable"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/logging"
	"github.com/tendril-net/tendril/pkg/option"
)

// Cell provides the identity allocator, the identities table and the
// identity label filter.
var Cell = cell.Module("identity", "Identity allocator identities table and label filter",
	cell.Provide(lifecycle.Check(Config.validate)),
	cell.Config(DefaultConfig()),
	cell.Provide(NewAllocator, NewTable, NewLabelFilter, statusContribution, apiHandlers),
)

// Allocation modes (--identity-allocation-mode).
const (
	AllocationCRD     = "crd"
	AllocationLocal   = "local"
	AllocationKVStore = "kvstore"
)

// Config are the identity options.
type Config struct {
	// AllocationMode is crd (TendrilIdentity objects, with Kubernetes),
	// kvstore (etcd keys) or local (this node only).
	AllocationMode string `mapstructure:"identity-allocation-mode"`
	// Labels decides which labels of a pod count for its identity.
	Labels labels.Config `mapstructure:",squash"`
}

// DefaultConfig are the identity defaults.
func DefaultConfig() Config {
	return Config{AllocationMode: AllocationCRD, Labels: labels.DefaultConfig()}
}

// Flags registers the identity options, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("identity-allocation-mode", c.AllocationMode, "Where identities are allocated: crd (TendrilIdentity objects; needs Kubernetes), kvstore (etcd; needs --kvstore) or local (this node only). Without Kubernetes crd falls back to local")
	// The label filter's flags bind to this copy of c, which only gives
	// them their defaults: the hive decodes the values into Config.
	c.Labels.Flags(fs)
}

// validate is Validate, marked as a configuration error.
func (c Config) validate() error { return option.Invalid(c.Validate()) }

// Validate checks the values; each error names its option. (That kvstore
// mode has a kvstore is the kvstore cell's check: it sees both options.)
func (c Config) Validate() error {
	switch c.AllocationMode {
	case AllocationCRD, AllocationLocal, AllocationKVStore:
	default:
		return fmt.Errorf("identity-allocation-mode %q: must be crd, kvstore or local", c.AllocationMode)
	}
	if _, err := labels.NewFilter(c.Labels); err != nil {
		return fmt.Errorf("identity-labels: %w", err)
	}
	return nil
}

// NewAllocator is local in standalone mode, TendrilIdentity objects
// (crdalloc) with Kubernetes, or etcd keys (kvalloc); the Kubernetes
// client and kvstore steps hand the latter two their clients.
// crd mode needs an API server configured (k8s).
func NewAllocator(cfg Config, node option.LocalNode, k8s agentk8s.Config, root cell.RootLogger) identity.Allocator {
	log := logging.For(root, "identity-allocator")
	switch {
	case k8s.Client.Enabled() && cfg.AllocationMode == AllocationCRD:
		return crdalloc.New(log)
	case cfg.AllocationMode == AllocationKVStore:
		return kvalloc.New(nil, node.Name, log)
	}
	return identity.NewLocalAllocator()
}

// NewTable is the identities table following the allocator
// (pkg/identity/identitytable). It is built right after the allocator, so
// it subscribes before the policy: a policy pass triggered by an identity
// change reads a table that has it.
func NewTable(db *statedb.DB, alloc identity.Allocator, root cell.RootLogger) (*identitytable.Table, error) {
	return identitytable.New(db, alloc, logging.For(root, "identities"))
}

// NewLabelFilter is the identity label filter of the configuration.
func NewLabelFilter(cfg Config) (*labels.Filter, error) {
	f, err := labels.NewFilter(cfg.Labels)
	if err != nil {
		return nil, fmt.Errorf("identity-labels: %w", err)
	}
	return f, nil
}
