package option

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/logging"
)

// Agent is tendril-agent's own options, beside each cell's config struct:
// where it keeps state and pins, the node's name, the runtime options'
// values at start and the log options. Cells read the parts they need
// through their Settings.
type Agent struct {
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
	// PolicyRevokeEstablished is which established flows a policy change
	// ends: deny, all or none (RevokeDeny, RevokeAll, RevokeNone).
	PolicyRevokeEstablished string
	// Debug turns on debug logging; changeable at run time.
	Debug bool
	// LogFormat is text or json.
	LogFormat string
}

// DefaultAgent returns the agent's own defaults.
func DefaultAgent() Agent {
	return Agent{
		StateDir:                "/var/run/tendril/state",
		BPFRoot:                 "/sys/fs/bpf/tendril",
		PolicyEnforcement:       EnforcementDefault,
		PolicyRevokeEstablished: RevokeDeny,
		LogFormat:               "text",
	}
}

// Flags registers the agent's own options.
func (c *Agent) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.ConfigDir, "config-dir", c.ConfigDir, "Directory with one file per option (e.g. a mounted ConfigMap)")
	fs.StringVar(&c.StateDir, "state-dir", c.StateDir, "Directory for state kept across restarts")
	fs.StringVar(&c.BPFRoot, "bpf-root", c.BPFRoot, "bpffs directory for this node's pinned maps and links")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "Name of this node (default: the host name)")
	fs.StringVar(&c.PolicyEnforcement, "policy-enforcement", c.PolicyEnforcement, "Policy enforcement mode: default, always or never")
	fs.StringVar(&c.PolicyRevokeEstablished, "policy-revoke-established", c.PolicyRevokeEstablished,
		"Established flows a policy change ends: deny (those a deny rule covers), all (also those no allow admits any more) or none (they outlive it, as in Cilium)")
	fs.BoolVar(&c.Debug, "debug", c.Debug, "Log at debug level")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "Log format: text or json")
}

// Validate checks the agent's own options; each error names its option.
func (c *Agent) Validate() error {
	var errs []error
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("state-dir %q: must be an absolute path", c.StateDir))
	}
	if err := bpffs.CheckPath(c.BPFRoot); err != nil {
		errs = append(errs, fmt.Errorf("bpf-root %w", err))
	}
	errs = append(errs, ValidateEnforcement(c.PolicyEnforcement), ValidateRevokeMode(c.PolicyRevokeEstablished), logging.CheckFormat(c.LogFormat))
	return errors.Join(errs...)
}

// DefaultNodeName sets NodeName to the host name when it is not set.
func (c *Agent) DefaultNodeName() error {
	if c.NodeName != "" {
		return nil
	}
	host, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("node-name not set and host name unknown: %w", err)
	}
	c.NodeName = host
	return nil
}
