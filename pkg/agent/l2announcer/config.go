package l2announcer

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/pkg/option"
)

// Config is the L2 announcements' configuration (the names and defaults
// of Cilium's --enable-l2-announcements and --l2-announcements-lease-*).
type Config struct {
	// Enabled answers ARP for the IPv4 addresses of services that a
	// pool's L2 announcement policy admits on the node's devices, one
	// node per service, elected with a Lease.
	Enabled bool `mapstructure:"enable-l2-announcements"`
	// LeaseNamespace holds the per-service Leases.
	LeaseNamespace string `mapstructure:"l2-announcements-lease-namespace"`
	// LeaseDuration is how long a node that stopped renewing keeps a
	// service's lease (and its datapath keeps answering): the longest
	// time the address goes unanswered when its node dies.
	LeaseDuration time.Duration `mapstructure:"l2-announcements-lease-duration"`
	// RenewDeadline is how long the holder retries renewing before it
	// gives the service up.
	RenewDeadline time.Duration `mapstructure:"l2-announcements-renew-deadline"`
	// RetryPeriod is how often candidates try to take a lease and the
	// holder renews it.
	RetryPeriod time.Duration `mapstructure:"l2-announcements-retry-period"`
}

// DefaultConfig returns the defaults (Cilium's).
func DefaultConfig() Config {
	return Config{LeaseNamespace: "kube-system", LeaseDuration: 15 * time.Second, RenewDeadline: 5 * time.Second, RetryPeriod: 2 * time.Second}
}

// Flags registers the options, with c's values as defaults.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Bool("enable-l2-announcements", c.Enabled,
		"Answer ARP for services' IPv4 addresses that a TendrilLoadBalancerIPPool's spec.l2Announcements admits (load-balancer addresses; external IPs only if it says so) on the node's devices (the --devices of the host programs), one node per service elected with a Lease")
	fs.String("l2-announcements-lease-namespace", c.LeaseNamespace, "Namespace of the L2 announcements' per-service Leases")
	fs.Duration("l2-announcements-lease-duration", c.LeaseDuration, "How long a node keeps announcing a service after it last renewed its lease")
	fs.Duration("l2-announcements-renew-deadline", c.RenewDeadline, "How long the announcing node retries renewing its lease before giving the service up")
	fs.Duration("l2-announcements-retry-period", c.RetryPeriod, "How often candidates try to take a lease and the holder renews it")
}

// validate is Validate, marked as a configuration error.
func (c Config) validate() error { return option.Invalid(c.Validate()) }

// Validate checks the values; each error names its option. The timings
// obey client-go's leader election: duration > deadline > 1.2 × period.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if c.LeaseNamespace == "" {
		errs = append(errs, errors.New("l2-announcements-lease-namespace: must not be empty"))
	}
	if c.RetryPeriod <= 0 {
		errs = append(errs, fmt.Errorf("l2-announcements-retry-period %s: must be positive", c.RetryPeriod))
	}
	if c.RenewDeadline <= time.Duration(1.2*float64(c.RetryPeriod)) {
		errs = append(errs, fmt.Errorf("l2-announcements-renew-deadline %s: must be more than 1.2 × l2-announcements-retry-period (%s)", c.RenewDeadline, c.RetryPeriod))
	}
	if c.LeaseDuration <= c.RenewDeadline {
		errs = append(errs, fmt.Errorf("l2-announcements-lease-duration %s: must be more than l2-announcements-renew-deadline (%s)", c.LeaseDuration, c.RenewDeadline))
	}
	return errors.Join(errs...)
}
