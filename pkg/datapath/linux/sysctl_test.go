package linux

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// With ProcFS set, sysctls are read and written under <ProcFS>/sys, not
// /proc/sys: an agent in an unprivileged container has /proc/sys
// read-only and the node's /proc/sys/net mounted elsewhere.
func TestSysctlProcFS(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "sys", "net", "ipv6", "conf", "eth0.100")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "accept_dad")
	if err := os.WriteFile(f, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := Sysctl{NetNS: netns.None(), ProcFS: root}
	if v, err := s.Get("net", "ipv6", "conf", "eth0.100", "accept_dad"); err != nil || v != "1" {
		t.Fatalf("Get = %q, %v; want 1", v, err)
	}
	if err := s.Set("0", "net", "ipv6", "conf", "eth0.100", "accept_dad"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f); strings.TrimSpace(string(got)) != "0" {
		t.Errorf("%s = %q after Set, want 0", f, got)
	}
	// The zero value is the machine's /proc.
	if p := (Sysctl{}).path("net", "ipv4", "ip_forward"); p != "/proc/sys/net/ipv4/ip_forward" {
		t.Errorf("default path %s", p)
	}
}
