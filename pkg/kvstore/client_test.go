package kvstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestConfigFlags(t *testing.T) {
	cfg := DefaultConfig()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	cfg.Flags(fs)
	err := fs.Parse([]string{
		"--kvstore-endpoints", "http://10.0.0.1:2379,http://10.0.0.2:2379",
		"--kvstore-opt", "etcd.listLimit=50", "--kvstore-opt", "etcd.lockStaleTimeout=30s",
		"--kvstore-connect-timeout", "10s", "--kvstore-lease-ttl", "90s",
		"--kvstore-tls-ca-file", "/ca.pem",
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Endpoints) != 2 || cfg.ConnectTimeout != 10*time.Second || cfg.LeaseTTL != 90*time.Second || cfg.TLSCAFile != "/ca.pem" {
		t.Fatalf("flags parsed into %+v", cfg)
	}
	opts, err := cfg.validate()
	if err != nil {
		t.Fatal(err)
	}
	if opts.listLimit != 50 || opts.lockStaleTimeout != 30*time.Second || opts.healthInterval != defaultOptions().healthInterval {
		t.Fatalf("options = %+v", opts)
	}
	if !cfg.Enabled() || DefaultConfig().Enabled() {
		t.Fatal("Enabled is wrong")
	}
}

func TestConfigValidation(t *testing.T) {
	passwordFile := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(passwordFile, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		mod     func(*Config)
		wantErr string
	}{
		{name: "valid", mod: func(*Config) {}},
		{name: "unix endpoint", mod: func(c *Config) { c.Endpoints = []string{"unix:///run/etcd.sock"} }},
		{name: "no endpoints", mod: func(c *Config) { c.Endpoints = nil }, wantErr: "no endpoints"},
		{name: "endpoint without scheme", mod: func(c *Config) { c.Endpoints = []string{"10.0.0.1:2379"} }, wantErr: "want http(s)"},
		{name: "cert without key", mod: func(c *Config) { c.TLSCertFile = "/c.pem" }, wantErr: "go together"},
		{name: "short lease", mod: func(c *Config) { c.LeaseTTL = 100 * time.Millisecond }, wantErr: "at least 1s"},
		{name: "zero connect timeout", mod: func(c *Config) { c.ConnectTimeout = 0 }, wantErr: "must be positive"},
		{name: "unknown option", mod: func(c *Config) { c.Options["etcd.listlimit"] = "5" }, wantErr: `"etcd.listlimit" unknown`},
		{name: "bad duration", mod: func(c *Config) { c.Options[OptHealthInterval] = "soon" }, wantErr: "not a positive duration"},
		{name: "bad limit", mod: func(c *Config) { c.Options[OptListLimit] = "-1" }, wantErr: "not a positive integer"},
		{name: "user without password", mod: func(c *Config) { c.Options[OptUsername] = "agent" }, wantErr: "go together"},
		{name: "missing password file", mod: func(c *Config) {
			c.Options[OptUsername], c.Options[OptPasswordFile] = "agent", "/nonexistent"
		}, wantErr: "no such file"},
		{name: "user and password", mod: func(c *Config) {
			c.Options[OptUsername], c.Options[OptPasswordFile] = "agent", passwordFile
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Endpoints = []string{"http://127.0.0.1:2379"}
			tt.mod(&cfg)
			opts, err := cfg.validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if cfg.Options[OptPasswordFile] != "" && opts.password != "secret" {
					t.Fatalf("password = %q", opts.password)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("validate() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
	if got := (Config{LeaseTTL: 1500 * time.Millisecond}).leaseTTLSeconds(); got != 2 {
		t.Fatalf("1.5s lease = %d s, want 2 (rounded up)", got)
	}
}

// TestConnectGivesUp: nothing listens, so Connect fails once its connect
// timeout ends, saying why.
func TestConnectGivesUp(t *testing.T) {
	cfg := testConfig([]string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))})
	cfg.ConnectTimeout = 500 * time.Millisecond
	_, err := Connect(testContext(t, 30*time.Second), cfg, testLog(t))
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Connect = %v, want a deadline error", err)
	}
}

func TestKeyOperations(t *testing.T) {
	srv := newEmbeddedServer(t)
	c := connect(t, srv.Endpoints(), withOption(OptListLimit, "2"))
	ctx := testContext(t, 60*time.Second)

	if _, found, err := c.Get(ctx, testPrefix+"missing"); err != nil || found {
		t.Fatalf("Get(missing) = %v, %v", found, err)
	}
	for i := range 5 {
		put(t, ctx, c, fmt.Sprintf("%sk%d", testPrefix, i), fmt.Sprintf("v%d", i))
	}
	kv, found, err := c.Get(ctx, testPrefix+"k3")
	if err != nil || !found || string(kv.Value) != "v3" || kv.Lease != 0 || kv.CreateRevision == 0 {
		t.Fatalf("Get(k3) = %+v, %v, %v", kv, found, err)
	}

	// Five keys over pages of two, all at one revision.
	all, rev, err := c.GetPrefix(ctx, testPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 5 || all[0].Key != testPrefix+"k0" || all[4].Key != testPrefix+"k4" || rev < all[4].ModRevision {
		t.Fatalf("GetPrefix = %d keys at revision %d: %+v", len(all), rev, all)
	}

	// CreateOnly: only the first write of a key.
	if created, err := c.CreateOnly(ctx, testPrefix+"new", []byte("first"), NoLease); err != nil || !created {
		t.Fatalf("CreateOnly(new) = %v, %v", created, err)
	}
	if created, err := c.CreateOnly(ctx, testPrefix+"new", []byte("second"), NoLease); err != nil || created {
		t.Fatalf("second CreateOnly(new) = %v, %v", created, err)
	}
	if kv, _, _ := c.Get(ctx, testPrefix+"new"); string(kv.Value) != "first" {
		t.Fatalf("value after a losing CreateOnly = %q", kv.Value)
	}

	// UpdateIfMissing writes only what differs.
	lease, err := c.SessionLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name      string
		value     string
		lease     LeaseMode
		wantWrite bool
	}{
		{"missing key", "a", NoLease, true},
		{"same value and lease", "a", NoLease, false},
		{"other value", "b", NoLease, true},
		{"other lease", "b", SessionLease, true},
		{"same value, same session lease", "b", SessionLease, false},
	}
	for _, s := range steps {
		wrote, err := c.UpdateIfMissing(ctx, testPrefix+"ensure", []byte(s.value), s.lease)
		if err != nil || wrote != s.wantWrite {
			t.Fatalf("%s: UpdateIfMissing = %v, %v; want %v", s.name, wrote, err, s.wantWrite)
		}
	}
	if kv, _, _ := c.Get(ctx, testPrefix+"ensure"); kv.Lease != lease || string(kv.Value) != "b" {
		t.Fatalf("ensured key = %+v, want value b bound to lease %x", kv, lease)
	}

	del(t, ctx, c, testPrefix+"k0")
	del(t, ctx, c, testPrefix+"k0") // deleting a missing key is fine
	if _, found, _ := c.Get(ctx, testPrefix+"k0"); found {
		t.Fatal("k0 still there after Delete")
	}
	n, err := c.DeletePrefix(ctx, testPrefix)
	if err != nil || n != 6 {
		t.Fatalf("DeletePrefix = %d, %v; want 6 (k1..k4, new, ensure)", n, err)
	}
	if _, err := c.DeletePrefix(ctx, ""); err == nil {
		t.Fatal("DeletePrefix(\"\") would delete everything and must fail")
	}
}

// TestCreateOnlyConflict: two clients race to create the same keys; each
// key has exactly one winner, whose value is the one stored.
func TestCreateOnlyConflict(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv testServer) {
		clients := []*Client{connect(t, srv.Endpoints()), connect(t, srv.Endpoints())}
		ctx := testContext(t, 60*time.Second)
		const keys = 30
		wins := make([][keys]bool, len(clients))
		var wg sync.WaitGroup
		errs := make(chan error, keys*len(clients))
		for ci, c := range clients {
			for k := range keys {
				wg.Go(func() {
					created, err := c.CreateOnly(ctx, fmt.Sprintf("%sid/%d", testPrefix, k), []byte(fmt.Sprintf("client-%d", ci)), SessionLease)
					if err != nil {
						errs <- err
						return
					}
					wins[ci][k] = created
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for k := range keys {
			winners := 0
			winner := -1
			for ci := range clients {
				if wins[ci][k] {
					winners++
					winner = ci
				}
			}
			if winners != 1 {
				t.Fatalf("key %d: %d winners", k, winners)
			}
			kv, _, err := clients[0].Get(ctx, fmt.Sprintf("%sid/%d", testPrefix, k))
			if err != nil || string(kv.Value) != fmt.Sprintf("client-%d", winner) {
				t.Fatalf("key %d = %q (%v), winner client-%d", k, kv.Value, err, winner)
			}
		}
	})
}

func TestStatus(t *testing.T) {
	srv := newEmbeddedServer(t)
	c := connect(t, srv.Endpoints())
	st := c.Status()
	if st.State != StateConnected || st.Endpoint != srv.Endpoints()[0] || st.Since.IsZero() {
		t.Fatalf("Status = %+v", st)
	}
	if !strings.Contains(st.Message, "etcd 3.6.16") || !strings.Contains(st.Message, "(leader)") {
		t.Fatalf("Status message = %q, want the version and role", st.Message)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); st.State != StateClosed {
		t.Fatalf("Status after Close = %+v", st)
	}
}

// TestCloseRevokesSession: keys bound to the session go when the client
// closes, without waiting for the lease to expire.
func TestCloseRevokesSession(t *testing.T) {
	srv := newEmbeddedServer(t)
	owner, err := Connect(testContext(t, 30*time.Second), testConfig(srv.Endpoints(), withLeaseTTL(time.Hour)), testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	other := connect(t, srv.Endpoints())
	ctx := testContext(t, 30*time.Second)
	if err := owner.Update(ctx, testPrefix+"bound", []byte("x"), SessionLease); err != nil {
		t.Fatal(err)
	}
	if err := owner.Update(ctx, testPrefix+"unbound", []byte("x"), NoLease); err != nil {
		t.Fatal(err)
	}
	if err := owner.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := other.Get(ctx, testPrefix+"bound"); found {
		t.Fatal("a session-bound key survived Close")
	}
	if _, found, _ := other.Get(ctx, testPrefix+"unbound"); !found {
		t.Fatal("an unbound key went with the session")
	}
}
