package kvstore

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/kvstore/kvembed"
)

// TestEmbeddedUnixSocket serves clients on a unix socket only.
func TestEmbeddedUnixSocket(t *testing.T) {
	dir := t.TempDir()
	socket := "unix://" + filepath.Join(dir, "etcd.sock")
	ctx := testContext(t, 60*time.Second)
	e, err := kvembed.Start(ctx, kvembed.Config{Dir: filepath.Join(dir, "data"), ClientURL: socket, UnsafeNoFsync: true}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	// Registered before connect, so it runs after the client's Close: a
	// server stopping under open client streams waits for them.
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	if got := e.Endpoints(); len(got) != 1 || got[0] != socket {
		t.Fatalf("Endpoints() = %q, want [%s]", got, socket)
	}
	c := connect(t, e.Endpoints())
	put(t, ctx, c, testPrefix+"over-socket", "yes")
	if kv, found, err := c.Get(ctx, testPrefix+"over-socket"); err != nil || !found || string(kv.Value) != "yes" {
		t.Fatalf("Get = %+v, %v, %v", kv, found, err)
	}
	if st := c.Status(); st.State != StateConnected || st.Endpoint != socket {
		t.Fatalf("Status = %+v", st)
	}
}

// TestEmbeddedKeepsDataAcrossRestart: a restart on the same directory
// resumes the data and revisions.
func TestEmbeddedKeepsDataAcrossRestart(t *testing.T) {
	srv := newEmbeddedServer(t)
	ctx := testContext(t, 60*time.Second)
	c := connect(t, srv.Endpoints())
	put(t, ctx, c, testPrefix+"durable", "v1")
	kv, _, err := c.Get(ctx, testPrefix+"durable")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	srv.Start(t)
	c2 := connect(t, srv.Endpoints())
	again, found, err := c2.Get(ctx, testPrefix+"durable")
	if err != nil || !found || string(again.Value) != "v1" || again.ModRevision != kv.ModRevision {
		t.Fatalf("after restart Get = %+v, %v, %v; want %+v", again, found, err, kv)
	}
}

func TestEmbeddedConfigErrors(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	for _, tt := range []struct {
		cfg  kvembed.Config
		want string
	}{
		{kvembed.Config{}, "no data directory"},
		{kvembed.Config{Dir: t.TempDir(), ClientURL: "https://127.0.0.1:0"}, "want http://host:port or unix"},
		{kvembed.Config{Dir: t.TempDir(), ClientURL: "unix://relative.sock"}, "must be absolute"},
	} {
		_, err := kvembed.Start(ctx, tt.cfg, testLog(t))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("kvembed.Start(%+v) = %v, want %q", tt.cfg, err, tt.want)
		}
	}
}
