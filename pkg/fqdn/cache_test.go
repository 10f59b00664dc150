package fqdn

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestCacheTTLMinimumAndExpiry(t *testing.T) {
	clk := &clock{time.Unix(1000, 0)}
	c := NewCache(30*time.Second, clk.now)
	if !c.Add(7, "World.Example.", addrs("192.0.2.10"), 5) {
		t.Fatal("first address not reported new")
	}
	if c.Add(7, "world.example", addrs("192.0.2.10"), 5) {
		t.Fatal("known address reported new")
	}
	c.Add(8, "other.example", addrs("192.0.2.10", "2001:db8::1"), 300)
	l := c.Lookups(7, "")
	if len(l) != 1 || l[0].Name != "world.example" || l[0].TTL != 30 || !l[0].Expires.Equal(clk.t.Add(30*time.Second)) {
		t.Fatalf("lookups: %+v", l)
	}
	names := c.Names()
	if got := names[netip.MustParseAddr("192.0.2.10")]; !slices.Equal(got, []string{"other.example", "world.example"}) {
		t.Fatalf("names of 192.0.2.10: %v", got)
	}
	// The TTL of 5 s is held to the 30 s minimum.
	clk.t = clk.t.Add(29 * time.Second)
	if c.Expire() || len(c.Lookups(0, "")) != 2 {
		t.Fatal("expired before the minimum TTL")
	}
	clk.t = clk.t.Add(time.Second)
	if !c.Expire() {
		t.Fatal("nothing expired at the minimum TTL")
	}
	if got := c.Names()[netip.MustParseAddr("192.0.2.10")]; !slices.Equal(got, []string{"other.example"}) {
		t.Fatalf("names after expiry: %v", got)
	}
	if n := c.Delete(0, "*.example"); n != 1 || len(c.Lookups(0, "")) != 0 {
		t.Fatalf("delete by pattern removed %d", n)
	}
}

func TestCacheSaveRestore(t *testing.T) {
	dir := t.TempDir()
	clk := &clock{time.Unix(1000, 0)}
	c := NewCache(time.Second, clk.now)
	c.Add(7, "world.example", addrs("192.0.2.10"), 60)
	c.Add(7, "short.example", addrs("192.0.2.11"), 5)
	if err := c.Save(dir); err != nil {
		t.Fatal(err)
	}
	clk.t = clk.t.Add(10 * time.Second) // short.example has expired meanwhile
	r := NewCache(time.Second, clk.now)
	n, err := r.Restore(dir)
	if err != nil || n != 1 {
		t.Fatalf("restore: %d, %v", n, err)
	}
	if got := r.Lookups(0, ""); len(got) != 1 || got[0].Name != "world.example" || !slices.Equal(got[0].IPs, addrs("192.0.2.10")) {
		t.Fatalf("restored: %+v", got)
	}
	// No file: an empty cache, no error.
	if n, err := NewCache(0, nil).Restore(t.TempDir()); n != 0 || err != nil {
		t.Fatalf("missing file: %d, %v", n, err)
	}
	// A corrupt file is an error and restores nothing.
	if err := os.WriteFile(filepath.Join(dir, stateFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := NewCache(0, clk.now)
	if _, err := e.Restore(dir); err == nil || len(e.Lookups(0, "")) != 0 {
		t.Fatalf("corrupt file: %v", err)
	}
	// Invalid entries (bad name, no endpoint, no address) are dropped.
	bad := `{"version":1,"lookups":[{"endpointID":7,"name":"a b","ips":["192.0.2.1"],"expires":"2100-01-01T00:00:00Z"},{"endpointID":0,"name":"a.example","ips":["192.0.2.1"],"expires":"2100-01-01T00:00:00Z"},{"endpointID":7,"name":"b.example","ips":[],"expires":"2100-01-01T00:00:00Z"},{"endpointID":7,"name":"c.example","ips":["192.0.2.3"],"expires":"2100-01-01T00:00:00Z"}]}`
	if err := os.WriteFile(filepath.Join(dir, stateFile), []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := NewCache(0, clk.now).Restore(dir); n != 1 || err != nil {
		t.Fatalf("invalid entries: restored %d, %v", n, err)
	}
}
