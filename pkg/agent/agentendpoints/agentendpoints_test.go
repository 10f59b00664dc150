package agentendpoints

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/health"
	"github.com/tendril-net/tendril/pkg/ipam"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/option"
)

// newHive is the endpoints cell standalone (no Kubernetes), its state
// under a temp dir, host networking off (the machine's own namespace is
// left alone), and the flags' values set over the defaults. mod is where
// the module goes.
func newHive(t *testing.T, flags map[string]string, mod **Module) *hive.Hive {
	t.Helper()
	agent := option.DefaultAgent()
	agent.StateDir = filepath.Join(t.TempDir(), "state")
	h := hive.New(
		cell.Invoke(func(lifecycle.InvokedAll) {}),
		statedb.Cell,
		job.Cell,
		cell.Provide(
			func() option.Agent { return agent },
			func() server.Config { return server.Config{Socket: filepath.Join(agent.StateDir, "t.sock")} },
			func() option.LocalNode { return option.LocalNode{Name: "node-a"} },
			func() Kubernetes { return nil },
			health.NewRegistry,
			lifecycle.NewSteps,
		),
		Cell,
		cell.Invoke(func(m *Module) {
			if mod != nil {
				*mod = m
			}
		}),
	)
	h.Viper().Set("install-host-networking", "false")
	for k, v := range flags {
		h.Viper().Set(k, v)
	}
	return h
}

// TestIPAMFromRange: the cell starts (restore from an empty state dir,
// IPAM, the CNI server) and its IPAM hands out addresses of --ipv4-range,
// none twice; --ipv6-range=none turns IPv6 off.
func TestIPAMFromRange(t *testing.T) {
	var m *Module
	h := newHive(t, map[string]string{"ipv4-range": "10.77.3.0/24", "ipv6-range": "none"}, &m)
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Error(err)
		}
	})
	alloc := m.IPAM()
	if alloc == nil || m.Manager() == nil || m.cniServer() == nil {
		t.Fatalf("after the start step: IPAM %v, manager %v, CNI server %v", alloc, m.Manager(), m.cniServer())
	}
	want := netip.MustParsePrefix("10.77.3.0/24")
	if got := alloc.CIDR(ipam.IPv4); got != want {
		t.Fatalf("IPv4 CIDR %s, want %s", got, want)
	}
	if alloc.Enabled(ipam.IPv6) {
		t.Fatal("IPv6 enabled with --ipv6-range=none")
	}
	seen := map[netip.Addr]bool{}
	for i := range 3 {
		a, err := alloc.AllocateNext(ipam.IPv4, fmt.Sprintf("pod-%d", i))
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		if !want.Contains(a.IP) || seen[a.IP] {
			t.Fatalf("allocation %d: %s, want a new address of %s (had %v)", i, a.IP, want, seen)
		}
		seen[a.IP] = true
	}
	if _, err := m.ListForAPI(); err != nil {
		t.Fatalf("endpoints list after start: %v", err)
	}
}

// TestInvalidConfigRefused: an invalid option fails Populate, marked as a
// configuration error and naming the option.
func TestInvalidConfigRefused(t *testing.T) {
	for _, tc := range []struct{ flag, value string }{
		{"ipv4-range", "10.0.0.300/24"},
		{"ipv4-range", "fd00::/64"},
		{"mtu", "100"},
		{"mtu", "70000"},
		{"ipam", "dhcp"},
		{"ipam-expiration", "0s"},
	} {
		h := newHive(t, map[string]string{tc.flag: tc.value}, nil)
		err := h.Populate(hivetest.Logger(t))
		if err == nil {
			t.Errorf("--%s=%s accepted", tc.flag, tc.value)
			continue
		}
		if !option.IsInvalid(err) || !strings.Contains(err.Error(), tc.flag+" ") {
			t.Errorf("--%s=%s: %v (invalid %v); want a configuration error naming the option", tc.flag, tc.value, err, option.IsInvalid(err))
		}
	}
}
