package kvstore

import (
	"crypto/tls"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// Config configures the etcd connection. The kvstore is off when no
// endpoint is given.
type Config struct {
	// Endpoints are etcd client URLs: http(s)://host:port or
	// unix:///path/to/socket.
	Endpoints []string `mapstructure:"kvstore-endpoints"`
	// TLS files; a CA alone verifies the server, a certificate and key
	// also authenticate the client.
	TLSCAFile   string `mapstructure:"kvstore-tls-ca-file"`
	TLSCertFile string `mapstructure:"kvstore-tls-cert-file"`
	TLSKeyFile  string `mapstructure:"kvstore-tls-key-file"`
	// Options are key=value tuning options (see the Opt* constants).
	Options map[string]string `mapstructure:"kvstore-opt"`
	// ConnectTimeout bounds how long Connect waits for the first
	// successful exchange with etcd (retrying with backoff meanwhile).
	ConnectTimeout time.Duration `mapstructure:"kvstore-connect-timeout"`
	// LeaseTTL is the TTL of the session lease that keys written with
	// SessionLease and locks are bound to. Long, so that keys survive an
	// etcd outage or restart; it is also how long a crashed agent's keys
	// linger.
	LeaseTTL time.Duration `mapstructure:"kvstore-lease-ttl"`
}

// Keys of Config.Options.
const (
	// OptUsername and OptPasswordFile authenticate with etcd's own users.
	OptUsername     = "etcd.username"
	OptPasswordFile = "etcd.passwordFile"
	// OptKeepaliveHeartbeat is the gRPC keepalive ping interval, and
	// OptKeepaliveTimeout how long a ping may go unanswered before the
	// connection counts as dead.
	OptKeepaliveHeartbeat = "etcd.keepaliveHeartbeat"
	OptKeepaliveTimeout   = "etcd.keepaliveTimeout"
	// OptListLimit is the page size of the list in ListAndWatch and
	// GetPrefix.
	OptListLimit = "etcd.listLimit"
	// OptHealthInterval is how often the connection is probed for Status.
	OptHealthInterval = "etcd.healthInterval"
	// OptLockStaleTimeout is how long a lock may be held before the lock
	// collector releases it.
	OptLockStaleTimeout = "etcd.lockStaleTimeout"
)

// DefaultConfig returns the defaults: no endpoints (kvstore off).
func DefaultConfig() Config {
	return Config{
		Options:        map[string]string{},
		ConnectTimeout: 2 * time.Minute,
		LeaseTTL:       15 * time.Minute,
	}
}

// Flags registers the kvstore flags.
func (c *Config) Flags(fs *pflag.FlagSet) {
	fs.StringSliceVar(&c.Endpoints, "kvstore-endpoints", c.Endpoints, "etcd client URLs (http(s)://host:port or unix:///path); none disables the kvstore")
	fs.StringVar(&c.TLSCAFile, "kvstore-tls-ca-file", c.TLSCAFile, "CA bundle verifying the etcd server")
	fs.StringVar(&c.TLSCertFile, "kvstore-tls-cert-file", c.TLSCertFile, "Client certificate for etcd")
	fs.StringVar(&c.TLSKeyFile, "kvstore-tls-key-file", c.TLSKeyFile, "Client key for etcd")
	fs.StringToStringVar(&c.Options, "kvstore-opt", c.Options, "etcd options as key=value ("+strings.Join(optionKeys(), ", ")+")")
	fs.DurationVar(&c.ConnectTimeout, "kvstore-connect-timeout", c.ConnectTimeout, "How long to wait for the first connection to etcd")
	fs.DurationVar(&c.LeaseTTL, "kvstore-lease-ttl", c.LeaseTTL, "TTL of the session lease of keys and locks")
}

// Enabled reports whether a kvstore is configured.
func (c Config) Enabled() bool { return len(c.Endpoints) > 0 }

// options are Config.Options parsed.
type options struct {
	username, password string
	keepaliveHeartbeat time.Duration
	keepaliveTimeout   time.Duration
	listLimit          int64
	healthInterval     time.Duration
	lockStaleTimeout   time.Duration
}

func defaultOptions() options {
	return options{
		// etcd refuses pings more frequent than every 5 s by default.
		keepaliveHeartbeat: 15 * time.Second,
		keepaliveTimeout:   25 * time.Second,
		listLimit:          1000,
		healthInterval:     10 * time.Second,
		lockStaleTimeout:   time.Minute,
	}
}

func optionKeys() []string {
	return []string{OptUsername, OptPasswordFile, OptKeepaliveHeartbeat, OptKeepaliveTimeout, OptListLimit, OptHealthInterval, OptLockStaleTimeout}
}

// parseOptions checks Config.Options. Unknown keys are errors, so that a
// misspelt option fails at start instead of being ignored.
func (c Config) parseOptions() (options, error) {
	o := defaultOptions()
	durations := map[string]*time.Duration{
		OptKeepaliveHeartbeat: &o.keepaliveHeartbeat,
		OptKeepaliveTimeout:   &o.keepaliveTimeout,
		OptHealthInterval:     &o.healthInterval,
		OptLockStaleTimeout:   &o.lockStaleTimeout,
	}
	for _, k := range slices.Sorted(maps.Keys(c.Options)) {
		v := c.Options[k]
		if d, ok := durations[k]; ok {
			parsed, err := time.ParseDuration(v)
			if err != nil || parsed <= 0 {
				return options{}, fmt.Errorf("kvstore option %s=%q: not a positive duration", k, v)
			}
			*d = parsed
			continue
		}
		switch k {
		case OptUsername:
			o.username = v
		case OptPasswordFile:
			b, err := os.ReadFile(v)
			if err != nil {
				return options{}, fmt.Errorf("kvstore option %s: %w", k, err)
			}
			o.password = strings.TrimRight(string(b), "\r\n")
		case OptListLimit:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return options{}, fmt.Errorf("kvstore option %s=%q: not a positive integer", k, v)
			}
			o.listLimit = n
		default:
			return options{}, fmt.Errorf("kvstore option %q unknown (known: %s)", k, strings.Join(optionKeys(), ", "))
		}
	}
	if (o.username == "") != (o.password == "") {
		return options{}, fmt.Errorf("kvstore options %s and %s go together", OptUsername, OptPasswordFile)
	}
	return o, nil
}

// validate checks the config and returns its parsed options.
func (c Config) validate() (options, error) {
	if !c.Enabled() {
		return options{}, fmt.Errorf("kvstore: no endpoints configured")
	}
	for _, ep := range c.Endpoints {
		if !strings.HasPrefix(ep, "http://") && !strings.HasPrefix(ep, "https://") && !strings.HasPrefix(ep, "unix://") && !strings.HasPrefix(ep, "unixs://") {
			return options{}, fmt.Errorf("kvstore endpoint %q: want http(s)://host:port or unix:///path", ep)
		}
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return options{}, fmt.Errorf("kvstore: the TLS certificate and key files go together")
	}
	if c.ConnectTimeout <= 0 {
		return options{}, fmt.Errorf("kvstore connect timeout %s: must be positive", c.ConnectTimeout)
	}
	if c.LeaseTTL < time.Second {
		return options{}, fmt.Errorf("kvstore lease TTL %s: must be at least 1s", c.LeaseTTL)
	}
	return c.parseOptions()
}

// leaseTTLSeconds is LeaseTTL in etcd's unit, rounded up.
func (c Config) leaseTTLSeconds() int64 {
	return int64((c.LeaseTTL + time.Second - 1) / time.Second)
}

// tlsConfig loads the TLS files; nil when none is set.
func (c Config) tlsConfig() (*tls.Config, error) {
	if c.TLSCAFile == "" && c.TLSCertFile == "" {
		return nil, nil
	}
	info := transport.TLSInfo{CertFile: c.TLSCertFile, KeyFile: c.TLSKeyFile, TrustedCAFile: c.TLSCAFile}
	tc, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kvstore TLS: %w", err)
	}
	return tc, nil
}
