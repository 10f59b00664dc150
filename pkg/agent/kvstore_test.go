package agent

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/spf13/pflag"

	"github.com/tendril-net/tendril/api/v1/ext"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/kvstore"
)

// TestEmbeddedKVStoreIdentities runs the agent with an embedded etcd and
// kvstore identity allocation: an identity another node writes into etcd
// shows in the agent's /v1/identity, and status reports the kvstore.
func TestEmbeddedKVStoreIdentities(t *testing.T) {
	a, c := startAgent(t, func(cfg *Config) {
		cfg.KVStore = KVStoreEmbedded
		cfg.IdentityAllocationMode = IdentityAllocationKVStore
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kcfg := kvstore.DefaultConfig()
	kcfg.Endpoints = []string{"unix://" + filepath.Join(a.cfg.StateDir, "etcd.sock")}
	kc, err := kvstore.Connect(ctx, kcfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close(ctx)
	if err := kc.Update(ctx, kvalloc.IDPrefix+"5000", []byte("k8s:app=from-another-node"), kvstore.NoLease); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var id models.Identity
		err := c.Do(ctx, http.MethodGet, "/identity/5000", nil, nil, nil, &id)
		if err == nil && len(id.Labels) == 1 && id.Labels[0] == "k8s:app=from-another-node" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("identity 5000 not visible: %+v %v", id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var st ext.StatusResponse
	if err := c.Do(ctx, http.MethodGet, "/healthz", nil, nil, nil, &st); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range st.Tendril.Sections {
		if s.Title == "KVStore" && strings.HasPrefix(s.Lines[0].Value, "connected") {
			found = true
		}
	}
	if !found {
		t.Fatalf("status has no connected KVStore section: %+v", st.Tendril.Sections)
	}
}

// TestUnreachableKVStoreFailsStartClearly: the agent retries for the
// connect timeout, then stops with an error naming the kvstore.
func TestUnreachableKVStoreFailsStartClearly(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.API.Socket = filepath.Join(dir, "run", "tendril.sock")
	cfg.BPFRoot = "/sys/fs/bpf/tendril-test-unused"
	cfg.Metrics.ServeAddr = ""
	cfg.NodeName = "node-a"
	cfg.InstallHostNetworking = false
	cfg.EnableDatapath = false
	cfg.KVStore = KVStoreEtcd
	cfg.KVStoreConfig.Endpoints = []string{"http://127.0.0.1:1"}
	cfg.KVStoreConfig.ConnectTimeout = 2 * time.Second
	cfg.IdentityAllocationMode = IdentityAllocationKVStore
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	cfg.Flags(fs)
	a, err := New(cfg, Deps{Flags: fs, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	err = a.Start(context.Background())
	if err == nil {
		_ = a.Stop(context.Background())
		t.Fatal("agent started without its kvstore")
	}
	if !strings.Contains(err.Error(), "kvstore") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("error %q does not name the kvstore", err)
	}
}

func TestKVStoreConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"kvstore allocation without kvstore", func(c *Config) { c.IdentityAllocationMode = IdentityAllocationKVStore }, "needs --kvstore"},
		{"etcd without endpoints", func(c *Config) { c.KVStore = KVStoreEtcd }, "kvstore-endpoints"},
		{"unknown kvstore", func(c *Config) { c.KVStore = "consul" }, "must be empty, etcd or embedded"},
		{"unknown allocation mode", func(c *Config) { c.IdentityAllocationMode = "random" }, "must be crd, kvstore or local"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.mutate(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
