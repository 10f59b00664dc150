package agentfqdn

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/fqdn"
)

// TestConfigValidate: --tofqdns-min-ttl within 0 to a week,
// --tofqdns-proxy-port a port or 0.
func TestConfigValidate(t *testing.T) {
	for ttl, ok := range map[int]bool{0: true, 3600: true, 7 * 24 * 3600: true, -1: false, 7*24*3600 + 1: false} {
		if err := (Config{MinTTL: ttl}).validate(); (err == nil) != ok {
			t.Errorf("min TTL %d: %v", ttl, err)
		}
	}
	for port, ok := range map[int]bool{0: true, 53: true, 65535: true, -1: false, 65536: false} {
		c := DefaultConfig()
		c.ProxyPort = port
		if err := c.validate(); (err == nil) != ok {
			t.Errorf("proxy port %d: %v", port, err)
		}
	}
	if err := DefaultConfig().validate(); err != nil {
		t.Errorf("the default: %v", err)
	}
}

// TestTickSavesAndRetries: the cache job writes a changed cache to the
// state dir, where a restart restores it; a save that fails (the state
// dir unwritable) keeps the cache marked changed, so the next tick
// writes it, and a tick with nothing changed writes nothing.
func TestTickSavesAndRetries(t *testing.T) {
	dir := t.TempDir()
	blocked := filepath.Join(dir, "not-a-dir")
	if err := os.WriteFile(blocked, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m := &Manager{log: slog.New(slog.DiscardHandler), cache: fqdn.NewCache(time.Hour, nil), stateDir: blocked}
	m.cache.Add(7, "world.example", []netip.Addr{netip.MustParseAddr("198.51.100.1")}, 300)
	m.dirty = true
	if err := m.tick(context.Background()); err == nil {
		t.Fatal("a save into a file, not a directory, succeeded")
	}
	if !m.dirty {
		t.Fatal("a failed save left the cache marked saved")
	}
	m.stateDir = dir
	if err := m.tick(context.Background()); err != nil || m.dirty {
		t.Fatalf("the retry: %v (still marked changed: %v)", err, m.dirty)
	}
	restored := fqdn.NewCache(time.Hour, nil)
	if n, err := restored.Restore(dir); err != nil || n != 1 {
		t.Fatalf("restored %d names: %v", n, err)
	}
	entries, _ := os.ReadDir(dir)
	var before []time.Time
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			before = append(before, info.ModTime())
		}
	}
	time.Sleep(10 * time.Millisecond)
	if err := m.tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	entries, _ = os.ReadDir(dir)
	for i, e := range entries {
		if info, err := e.Info(); err == nil && i < len(before) && !info.ModTime().Equal(before[i]) {
			t.Errorf("%s written again by a tick with nothing changed", e.Name())
		}
	}
}
