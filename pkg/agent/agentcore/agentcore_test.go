package agentcore

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/lockfile"
	"github.com/tendril-net/tendril/pkg/option"
)

// newHive is the core cell in a hive with what the command gives it (the
// log level) and the flags' values set over the defaults: no metrics
// listener, the API socket under dir. node is where the resolved node's
// name goes.
func newHive(t *testing.T, flags map[string]string, node *option.LocalNode) *hive.Hive {
	t.Helper()
	dir := t.TempDir()
	h := hive.New(
		cell.Invoke(func(lifecycle.InvokedAll) {}),
		statedb.Cell,
		job.Cell,
		cell.Provide(func() *slog.LevelVar { return new(slog.LevelVar) }),
		Cell,
		cell.Invoke(func(n option.LocalNode) {
			if node != nil {
				*node = n
			}
		}),
	)
	h.Viper().Set("socket", filepath.Join(dir, "tendril.sock"))
	h.Viper().Set("prometheus-serve-addr", "")
	h.Viper().Set("state-dir", filepath.Join(dir, "state"))
	for k, v := range flags {
		h.Viper().Set(k, v)
	}
	return h
}

func stopAtEnd(t *testing.T, h *hive.Hive) {
	t.Cleanup(func() {
		if err := h.Stop(hivetest.Logger(t), context.Background()); err != nil {
			t.Error(err)
		}
	})
}

// TestConfigStepLocksStateDir: the "config" step creates the state dir
// and locks it; a second agent on the same dir fails its start with the
// lock's error, naming the dir and the flag, and the first keeps its
// lock; once the first stops, the dir is free again.
func TestConfigStepLocksStateDir(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "a", "state")
	flags := map[string]string{"state-dir": stateDir}
	log := hivetest.Logger(t)

	first := newHive(t, flags, nil)
	if err := first.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(stateDir); err != nil || !fi.IsDir() {
		t.Fatalf("state dir after the config step: %v", err)
	}

	second := newHive(t, flags, nil)
	err := second.Start(log, context.Background())
	if err == nil {
		_ = second.Stop(log, context.Background())
		t.Fatal("a second agent started on a locked state dir")
	}
	if !errors.Is(err, lockfile.ErrHeld) || !strings.Contains(err.Error(), "held by another process") ||
		!strings.Contains(err.Error(), stateDir) || !strings.Contains(err.Error(), "--state-dir") {
		t.Fatalf("second start: %v; want the lock's error naming %s and --state-dir", err, stateDir)
	}
	_ = second.Stop(log, context.Background())

	// The first still holds it: the failed second released nothing of it.
	if l, err := lockfile.Acquire(stateDir); !errors.Is(err, lockfile.ErrHeld) {
		if l != nil {
			_ = l.Release()
		}
		t.Fatalf("state dir not held by the running agent after the second's failure: %v", err)
	}

	if err := first.Stop(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	third := newHive(t, flags, nil)
	if err := third.Start(log, context.Background()); err != nil {
		t.Fatalf("state dir still locked after the first agent stopped: %v", err)
	}
	stopAtEnd(t, third)
}

// TestLocalNode: the node's name is the host name by default, and
// --node-name when given.
func TestLocalNode(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		flags map[string]string
		want  string
	}{
		{nil, host},
		{map[string]string{"node-name": "node-x"}, "node-x"},
	} {
		var n option.LocalNode
		h := newHive(t, tc.flags, &n)
		if err := h.Populate(hivetest.Logger(t)); err != nil {
			t.Fatal(err)
		}
		if n.Name != tc.want {
			t.Errorf("flags %v: local node %q, want %q", tc.flags, n.Name, tc.want)
		}
	}
}

// TestInvalidOptionsRefused: an invalid option fails Populate, marked as
// a configuration error and naming the option.
func TestInvalidOptionsRefused(t *testing.T) {
	for flag, value := range map[string]string{
		"policy-enforcement": "bogus",
		"state-dir":          "relative/state",
		"log-format":         "xml",
		"socket":             "tendril.sock",
		"api-max-body-bytes": "0",
	} {
		t.Run(flag, func(t *testing.T) {
			h := newHive(t, map[string]string{flag: value}, nil)
			err := h.Populate(hivetest.Logger(t))
			if err == nil {
				t.Fatalf("--%s=%s accepted", flag, value)
			}
			if !option.IsInvalid(err) || !strings.Contains(err.Error(), flag+" ") {
				t.Fatalf("--%s=%s: %v (invalid %v); want a configuration error naming the option", flag, value, err, option.IsInvalid(err))
			}
		})
	}
}
