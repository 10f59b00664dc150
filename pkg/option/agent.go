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
// values at start and the log options. The agent's core cell
// (pkg/agent/agentcore) owns them (cell.Config); other cells take Agent,
// or the resolved LocalNode, by type.
type Agent struct {
	// ConfigDir is a directory of one file per option (a mounted ConfigMap).
	ConfigDir string
	// StateDir holds endpoint state and allocator state across restarts.
	StateDir string
	// BPFRoot is the bpffs directory of this node's pinned maps and links.
	BPFRoot string
	// NodeName is this node's name (the Kubernetes Node name).
	NodeName string
	// ProcFS is where the node's procfs is seen: the agent writes its
	// network sysctls under <ProcFS>/sys/net. In an unprivileged
	// container /proc/sys is read-only, and the chart mounts the node's
	// /proc/sys/net at /host/proc/sys/net (Cilium's --procfs).
	ProcFS string
	// PolicyEnforcement is default, always or never; changeable at run time.
	PolicyEnforcement string
	// Debug turns on debug logging; changeable at run time.
	Debug bool
	// LogFormat is text or json.
	LogFormat string
}

// DefaultAgent returns the agent's own defaults.
func DefaultAgent() Agent {
	return Agent{
		StateDir:          "/var/run/tendril/state",
		BPFRoot:           "/sys/fs/bpf/tendril",
		ProcFS:            "/proc",
		PolicyEnforcement: EnforcementDefault,
		LogFormat:         "text",
	}
}

// Flags registers the agent's own options, with c's values as defaults.
func (c Agent) Flags(fs *pflag.FlagSet) {
	fs.String("config-dir", c.ConfigDir, "Directory with one file per option (e.g. a mounted ConfigMap)")
	fs.String("state-dir", c.StateDir, "Directory for state kept across restarts")
	fs.String("bpf-root", c.BPFRoot, "bpffs directory for this node's pinned maps and links")
	fs.String("node-name", c.NodeName, "Name of this node (default: the host name)")
	fs.String("procfs", c.ProcFS, "Where the node's procfs is mounted: network sysctls are written under <procfs>/sys/net (an unprivileged container mounts the node's /proc/sys/net elsewhere)")
	fs.String("policy-enforcement", c.PolicyEnforcement, "Policy enforcement mode: default, always or never")
	fs.Bool("debug", c.Debug, "Log at debug level")
	fs.String("log-format", c.LogFormat, "Log format: text or json")
}

// Validate checks the agent's own options; each error names its option.
func (c Agent) Validate() error {
	var errs []error
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("state-dir %q: must be an absolute path", c.StateDir))
	}
	if c.ProcFS == "" || !filepath.IsAbs(c.ProcFS) {
		errs = append(errs, fmt.Errorf("procfs %q: must be an absolute path", c.ProcFS))
	}
	if err := bpffs.CheckPath(c.BPFRoot); err != nil {
		errs = append(errs, fmt.Errorf("bpf-root %w", err))
	}
	errs = append(errs, ValidateEnforcement(c.PolicyEnforcement), logging.CheckFormat(c.LogFormat))
	return errors.Join(errs...)
}

// LocalNode is this node's name resolved: --node-name, else the host
// name. The cells that name the node take it rather than Agent.NodeName.
type LocalNode struct{ Name string }

// ResolveLocalNode is the node's name: NodeName, else the host name.
func (c Agent) ResolveLocalNode() (LocalNode, error) {
	if c.NodeName != "" {
		return LocalNode{Name: c.NodeName}, nil
	}
	host, err := os.Hostname()
	if err != nil {
		return LocalNode{}, fmt.Errorf("node-name not set and host name unknown: %w", err)
	}
	return LocalNode{Name: host}, nil
}

// Invalid marks err (nil stays nil) as an invalid configuration: the
// agent reports it as it is, without the hive's wrapping of a failed
// constructor (IsInvalid). Each cell validates its config with it.
func Invalid(err error) error {
	if err == nil {
		return nil
	}
	return invalidError{err}
}

type invalidError struct{ err error }

func (e invalidError) Error() string { return e.err.Error() }
func (e invalidError) Unwrap() error { return e.err }

// IsInvalid reports whether err was marked by Invalid.
func IsInvalid(err error) bool {
	var inv invalidError
	return errors.As(err, &inv)
}
