package nodehealth

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/pkg/option"
)

// Config is the node health checks' configuration (the names and
// defaults after Cilium's --enable-health-checking and its health port).
type Config struct {
	// EnableHealthChecking probes every other node and answers their
	// probes.
	EnableHealthChecking bool
	// HealthCheckInterval is how often every other node is probed; each
	// probe's timeout is below it (probeTimeout).
	HealthCheckInterval time.Duration
	// HealthPort is the TCP port of the health responder on every node
	// (GET /hello); the prober asks the other nodes' on the same port.
	HealthPort uint16
	// EnableEndpointHealthChecking makes this node's health endpoint (a
	// pod-like namespace with an address of the pod CIDR, answering the
	// probes) and probes the other nodes' (Cilium's flag of that name).
	// Only with health checking and the agent's host networking on.
	// On by default, as Cilium's. In the chart's unprivileged container
	// /var/run/netns is mounted host-to-container, so the namespace's
	// bind mount lives in the container's mount namespace: a container
	// restart loses it and the restarted agent makes the endpoint again.
	EnableEndpointHealthChecking bool
}

// DefaultConfig returns the defaults (Cilium's port).
func DefaultConfig() Config {
	return Config{EnableHealthChecking: true, HealthCheckInterval: 10 * time.Second, HealthPort: 4240, EnableEndpointHealthChecking: true}
}

// Flags registers the options, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-health-checking", c.EnableHealthChecking,
		"Probe every other node (ICMP echo and HTTP GET /hello on its health port) and answer their probes on the health port")
	fs.Duration("health-check-interval", c.HealthCheckInterval, "How often every other node is probed; a probe times out before the next round")
	fs.Uint16("health-port", c.HealthPort, "TCP port of the node health responder (HTTP GET /hello), on every address of the node")
	fs.Bool("enable-endpoint-health-checking", c.EnableEndpointHealthChecking,
		"Make this node's health endpoint (a namespace with an address of the pod CIDR answering the probes) and probe the other nodes' (needs --enable-health-checking and --install-host-networking)")
}

// minInterval keeps a round's timeout (half the interval) long enough
// for a probe to mean something.
const minInterval = 100 * time.Millisecond

// validate is Validate, marked as a configuration error.
func (c Config) validate() error { return option.Invalid(c.Validate()) }

// Validate checks the values; each error names its option. The values
// are checked even with health checking off, so that turning it on
// later does not meet an error first seen then.
func (c Config) Validate() error {
	var errs []error
	if c.HealthCheckInterval < minInterval {
		errs = append(errs, fmt.Errorf("health-check-interval %s: must be at least %s", c.HealthCheckInterval, minInterval))
	}
	if c.HealthPort == 0 {
		errs = append(errs, errors.New("health-port 0: must be a port number (1-65535)"))
	}
	return errors.Join(errs...)
}

// probeTimeout is how long one probe may take: half the interval, at
// most 5 s, so a round ends well before the next one starts.
func (c Config) probeTimeout() time.Duration {
	return min(c.HealthCheckInterval/2, 5*time.Second)
}
