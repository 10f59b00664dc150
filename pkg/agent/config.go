package agent

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/datapath/hostdev"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/hubble/agentflows"
	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/kvstore/agentkv"
	"github.com/tendril-net/tendril/pkg/labels"
	"github.com/tendril-net/tendril/pkg/loadbalancer/l2announcer"
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
	// MTU is the pods' device MTU announced to CNI plugins.
	MTU int
	// IPv4Range and IPv6Range are the pod CIDRs: a prefix, "auto" (derived
	// from the node name) or "none".
	IPv4Range string
	IPv6Range string
	// IPAM is "kubernetes" (pod CIDRs by the precedence above) or
	// "cluster-pool" (from this node's TendrilNode, written by
	// tendril-operator).
	IPAM string
	// InstallHostNetworking creates the host device and per-pod routes in the
	// agent's network namespace. Only tests that run the agent in the
	// machine's own namespace turn it off.
	InstallHostNetworking bool
	// EnableDatapath loads the eBPF datapath and attaches it to endpoints.
	// Only tests of the control plane in the machine's own namespace turn
	// it off.
	EnableDatapath bool
	// PolicyVerdictEvents reports allowed new flows as events too.
	PolicyVerdictEvents bool
	// DirectDelivery delivers packets between local pods from the sending
	// pod's program straight into the receiving pod's namespace
	// (bpf_redirect_peer), enforcing the receiver's ingress policy there,
	// instead of through the host stack (whose firewall and NAT rules it
	// then bypasses).
	DirectDelivery bool
	// DatapathAttachMode is how the eBPF programs attach to each pod's host
	// veth: tcx (BPF links, pinned) or tc (a clsact qdisc and cls_bpf
	// filters, which spare each attach the RCU grace period TCX waits
	// for under rtnl). See loader.AttachMode.
	DatapathAttachMode string
	// DatapathDeferTCX, in tcx mode, attaches a new pod with tc filters and
	// moves it to TCX links once no pod has been attached for 500 ms, so
	// that pod creation never waits for TCX's RCU grace period.
	DatapathDeferTCX bool
	// IPAMExpiration is how long an address allocated with expiration may
	// stay unclaimed by an endpoint.
	IPAMExpiration time.Duration

	// K8s says how to reach the API server; with none configured the agent
	// runs standalone.
	K8s k8s.Config
	// K8sCacheSyncTimeout bounds the wait for the API server and for the
	// watchers' initial lists; past it the agent exits naming what is
	// missing.
	K8sCacheSyncTimeout time.Duration
	// K8sInstallCRDs creates or updates the Tendril CRDs at start.
	K8sInstallCRDs bool
	// IdentityAllocationMode is crd (TendrilIdentity objects, with
	// Kubernetes), kvstore (etcd keys) or local (this node only).
	IdentityAllocationMode string
	// KVStore is "" (none), etcd (--kvstore-endpoints) or embedded (an etcd
	// inside the agent, data under the state directory).
	KVStore       string
	KVStoreConfig kvstore.Config
	// IdentityLabels decides which labels of a pod count for its identity.
	IdentityLabels labels.Config

	// Services are the services' options (socket LB, selection).
	Services ServicesConfig
	// Hubble are the flows' options (observer, Hubble API, trace events).
	Hubble agentflows.Config
	// Masquerade are the host device programs' options (masquerade of pod
	// traffic leaving the node).
	Masquerade hostdev.Config
	// L2Announcements are the ARP announcements of services' load-balancer
	// and external addresses (pkg/loadbalancer/l2announcer).
	L2Announcements l2announcer.Config

	API       server.Config
	Metrics   metrics.Config
	Profiling profiling.Config
}

// KVStore modes (--kvstore).
const (
	KVStoreNone     = agentkv.ModeNone
	KVStoreEtcd     = agentkv.ModeEtcd
	KVStoreEmbedded = agentkv.ModeEmbedded
)

// Identity allocation modes.
const (
	IdentityAllocationCRD     = "crd"
	IdentityAllocationLocal   = "local"
	IdentityAllocationKVStore = "kvstore"
)

// DefaultConfig returns the defaults of every option.
func DefaultConfig() Config {
	return Config{
		StateDir:               "/var/run/tendril/state",
		BPFRoot:                "/sys/fs/bpf/tendril",
		PolicyEnforcement:      option.EnforcementDefault,
		LogFormat:              "text",
		MTU:                    1500,
		IPv4Range:              "auto",
		IPv6Range:              "auto",
		IPAM:                   "kubernetes",
		InstallHostNetworking:  true,
		EnableDatapath:         true,
		PolicyVerdictEvents:    true,
		DirectDelivery:         true,
		DatapathAttachMode:     string(loader.AttachTCX),
		DatapathDeferTCX:       true,
		IPAMExpiration:         10 * time.Minute,
		K8s:                    k8s.DefaultConfig(),
		K8sCacheSyncTimeout:    3 * time.Minute,
		K8sInstallCRDs:         true,
		IdentityAllocationMode: IdentityAllocationCRD,
		KVStoreConfig:          kvstore.DefaultConfig(),
		IdentityLabels:         labels.DefaultConfig(),
		Services:               ServicesConfig{LBAlgorithm: "random", NodePortRange: "30000-32767", HealthCheckNodePorts: true},
		Hubble:                 agentflows.DefaultConfig(),
		Masquerade:             hostdev.DefaultConfig(),
		L2Announcements:        l2announcer.DefaultConfig(),
		API:                    server.DefaultConfig(),
		Metrics:                metrics.DefaultConfig(),
		Profiling:              profiling.DefaultConfig(),
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
	fs.IntVar(&c.MTU, "mtu", c.MTU, "MTU of pod devices")
	fs.StringVar(&c.IPv4Range, "ipv4-range", c.IPv4Range, "IPv4 pod CIDR of this node: a prefix, auto or none (Kubernetes: Node.spec.podCIDRs wins)")
	fs.StringVar(&c.IPv6Range, "ipv6-range", c.IPv6Range, "IPv6 pod CIDR of this node: a prefix, auto or none (Kubernetes: Node.spec.podCIDRs wins)")
	fs.BoolVar(&c.InstallHostNetworking, "install-host-networking", c.InstallHostNetworking, "Create the host device and per-pod routes in the agent's network namespace")
	fs.BoolVar(&c.EnableDatapath, "enable-datapath", c.EnableDatapath, "Load the eBPF datapath and attach it to endpoints")
	fs.BoolVar(&c.PolicyVerdictEvents, "policy-verdict-events", c.PolicyVerdictEvents, "Report allowed new flows as policy verdict events (drops are always reported)")
	fs.BoolVar(&c.DirectDelivery, "direct-delivery", c.DirectDelivery, "Deliver packets between local pods straight into the receiving pod (bpf_redirect_peer), bypassing the host stack")
	fs.StringVar(&c.DatapathAttachMode, "datapath-attach-mode", c.DatapathAttachMode, "How the eBPF programs attach to pod veths: tcx (BPF links) or tc (clsact qdisc + cls_bpf filters: no RCU grace period per attach, faster pod creation; the filters are not owned). Switching across restarts keeps every endpoint attached")
	fs.BoolVar(&c.DatapathDeferTCX, "datapath-defer-tcx", c.DatapathDeferTCX, "In tcx mode, attach a new pod with tc filters first and move it to TCX links once no pod has been attached for 500 ms: pod creation without TCX's RCU wait, policed from the first packet (the switch has no gap)")
	fs.StringVar(&c.IPAM, "ipam", c.IPAM, "Where the node's pod CIDRs come from: kubernetes (Node, annotations, --ipv4-range) or cluster-pool (the TendrilNode tendril-operator fills)")
	fs.DurationVar(&c.IPAMExpiration, "ipam-expiration", c.IPAMExpiration, "How long an address allocated with expiration may stay unclaimed")
	c.K8s.Flags(fs)
	fs.DurationVar(&c.K8sCacheSyncTimeout, "k8s-cache-sync-timeout", c.K8sCacheSyncTimeout, "How long to wait for the API server and the initial lists of watched resources")
	fs.BoolVar(&c.K8sInstallCRDs, "k8s-install-crds", c.K8sInstallCRDs, "Create or update the Tendril CRDs at start")
	fs.StringVar(&c.IdentityAllocationMode, "identity-allocation-mode", c.IdentityAllocationMode, "Where identities are allocated: crd (TendrilIdentity objects; needs Kubernetes), kvstore (etcd; needs --kvstore) or local (this node only). Without Kubernetes crd falls back to local")
	fs.StringVar(&c.KVStore, "kvstore", c.KVStore, "kvstore: empty (none), etcd (see --kvstore-endpoints) or embedded (etcd inside the agent, data under --state-dir)")
	c.KVStoreConfig.Flags(fs)
	c.IdentityLabels.Flags(fs)
	c.Services.Flags(fs)
	c.Hubble.Flags(fs)
	c.Masquerade.Flags(fs)
	c.L2Announcements.Flags(fs)
	c.API.Flags(fs)
	c.Metrics.Flags(fs)
	c.Profiling.Flags(fs)
}

// Validate checks the values; each error names its option.
func (c *Config) Validate() error {
	var errs []error
	if c.IPAM != "" && c.IPAM != "kubernetes" && c.IPAM != "cluster-pool" {
		errs = append(errs, fmt.Errorf("ipam %q: must be kubernetes or cluster-pool", c.IPAM))
	}
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("state-dir %q: must be an absolute path", c.StateDir))
	}
	if err := bpffs.CheckPath(c.BPFRoot); err != nil {
		errs = append(errs, fmt.Errorf("bpf-root %w", err))
	}
	if c.API.Socket == "" || !filepath.IsAbs(c.API.Socket) {
		errs = append(errs, fmt.Errorf("socket %q: must be an absolute path", c.API.Socket))
	}
	if err := option.ValidateEnforcement(c.PolicyEnforcement); err != nil {
		errs = append(errs, err)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("log-format %q: must be text or json", c.LogFormat))
	}
	if _, _, err := c.podCIDRs(); err != nil {
		errs = append(errs, err)
	}
	if _, err := loader.ParseAttachMode(c.DatapathAttachMode); err != nil {
		errs = append(errs, fmt.Errorf("datapath-attach-mode %q: must be %s or %s", c.DatapathAttachMode, loader.AttachTCX, loader.AttachTC))
	}
	if c.IPAMExpiration <= 0 {
		errs = append(errs, fmt.Errorf("ipam-expiration %s: must be positive", c.IPAMExpiration))
	}
	if err := c.K8s.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch c.IdentityAllocationMode {
	case IdentityAllocationCRD, IdentityAllocationLocal:
	case IdentityAllocationKVStore:
		if c.KVStore == KVStoreNone && len(c.KVStoreConfig.Endpoints) == 0 {
			errs = append(errs, fmt.Errorf("identity-allocation-mode kvstore: needs --kvstore (etcd with --kvstore-endpoints, or embedded)"))
		}
	default:
		errs = append(errs, fmt.Errorf("identity-allocation-mode %q: must be crd, kvstore or local", c.IdentityAllocationMode))
	}
	switch c.KVStore {
	case KVStoreNone, KVStoreEmbedded:
	case KVStoreEtcd:
		if len(c.KVStoreConfig.Endpoints) == 0 {
			errs = append(errs, fmt.Errorf("kvstore etcd: --kvstore-endpoints is empty"))
		}
	default:
		errs = append(errs, fmt.Errorf("kvstore %q: must be empty, etcd or embedded", c.KVStore))
	}

	if _, err := labels.NewFilter(c.IdentityLabels); err != nil {
		errs = append(errs, fmt.Errorf("identity-labels: %w", err))
	}
	if err := c.Services.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Hubble.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Masquerade.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.L2Announcements.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.K8sCacheSyncTimeout <= 0 {
		errs = append(errs, fmt.Errorf("k8s-cache-sync-timeout %s: must be positive", c.K8sCacheSyncTimeout))
	}
	if c.MTU < 1280 || c.MTU > 65535 {
		errs = append(errs, fmt.Errorf("mtu %d: must be between 1280 and 65535", c.MTU))
	}
	return errors.Join(errs...)
}
