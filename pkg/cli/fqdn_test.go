package cli

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/fqdn"
	"github.com/tendril-net/tendril/pkg/fqdn/fqdnapi"
)

// TestFQDNCacheCommand: `tendril fqdn cache list` prints the learned
// names from the agent's real /v1/fqdn handlers, an empty cache prints
// only the header (the API's 404), and `clean -p` forgets the matching
// names.
func TestFQDNCacheCommand(t *testing.T) {
	c := fqdn.NewCache(time.Minute, nil)
	c.Add(7, "world.example", []netip.Addr{netip.MustParseAddr("192.0.2.10")}, 300)
	c.Add(9, "api-1.example", []netip.Addr{netip.MustParseAddr("192.0.2.11")}, 300)
	sock := filepath.Join(t.TempDir(), "tendril.sock")
	srv, err := server.New(server.Config{Socket: sock}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	(&fqdnapi.Handlers{Cache: c}).Register(srv)
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		cmd := NewRootCommand()
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"-H", "unix://" + sock, "fqdn", "cache"}, args...))
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	lines := strings.Split(strings.TrimSpace(run("list")), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ENDPOINT") || !strings.Contains(lines[1], "world.example.") || !strings.Contains(lines[1], "192.0.2.10") || !strings.HasPrefix(lines[2], "9 ") {
		t.Fatalf("list:\n%s", strings.Join(lines, "\n"))
	}
	if out := run("list", "--endpoint", "9"); strings.Contains(out, "world.example") || !strings.Contains(out, "api-1.example") {
		t.Fatalf("list --endpoint 9:\n%s", out)
	}
	run("clean", "-p", "api-*.example")
	if l := c.Lookups(0, ""); len(l) != 1 || l[0].Name != "world.example" {
		t.Fatalf("after clean: %+v", l)
	}
	run("clean")
	if out := strings.TrimSpace(run("list")); strings.Count(out, "\n") != 0 {
		t.Fatalf("list of an empty cache:\n%s", out)
	}
}
