package e2e_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/soak"
)

// soakInjectEnv names a leak TestPrivilegedLabSoak injects before it
// counts ("netns": a pod network namespace nobody removes), to see the
// soak fail.
const soakInjectEnv = "TENDRIL_E2E_SOAK_INJECT"

// TestPrivilegedLabSoak is bench/soak's short run: pods churned at 10 a
// second for 75 s (TENDRIL_E2E_SOAK_DURATION for another length) on a
// lab of its own with short identity GC timing, each connecting to a
// server on the other node under a policy; at the end nothing the churn
// made is left (addresses, endpoints, identities, BPF map entries, pins,
// namespaces, interfaces) and the agents' goroutines and descriptors are
// back within their allowance.
func TestPrivilegedLabSoak(t *testing.T) {
	labUp(t)
	dur := 75 * time.Second
	if v := os.Getenv("TENDRIL_E2E_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("TENDRIL_E2E_SOAK_DURATION: %v", err)
		}
		dur = d
	}
	name, st, cl := operatorLab(t, "s", "tendril-agents: 2 serving", "its agents")
	cfg := soak.DefaultConfig()
	cfg.Lab, cfg.Clients = st, cl
	cfg.Duration, cfg.SampleEvery, cfg.Settle = dur, 2*time.Second, 4*time.Minute
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	switch inject := os.Getenv(soakInjectEnv); inject {
	case "":
	case "netns":
		leaked := lab.NetnsPrefix(name) + "pod-0123456789ab"
		t.Cleanup(func() { _ = lab.DeleteNetns(leaked) })
		cfg.BeforeEnd = func(context.Context) error {
			t.Logf("soak: injecting a leaked network namespace %s", leaked)
			return lab.CreateNetns(leaked)
		}
	default:
		t.Fatalf("%s=%q: want netns", soakInjectEnv, inject)
	}
	res, err := soak.Run(context.Background(), cfg)
	if res != nil {
		var sb strings.Builder
		res.Markdown(&sb)
		t.Logf("soak:\n%s", sb.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	if !res.Passed() {
		var leaks []string
		for _, c := range res.Leaks {
			if c.Leaked() {
				leaks = append(leaks, fmt.Sprintf("%s %s: %d (%v)", c.Node, c.What, c.N, c.Examples))
			}
		}
		t.Fatalf("the soak failed: leaks %v; churn %+v", leaks, res.Churn)
	}
}
