package hostdev

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tendril-net/tendril/pkg/datapath/linux"
)

// TestReservePortsUnderProcFS: the masquerade range is added to
// ip_local_reserved_ports under --procfs (an agent in a container writes
// the node's sysctls through a mount of its own; the container's
// /proc/sys is read-only), after what was there, once.
func TestReservePortsUnderProcFS(t *testing.T) {
	procfs := t.TempDir()
	dir := filepath.Join(procfs, "sys", "net", "ipv4")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "ip_local_reserved_ports")
	if err := os.WriteFile(file, []byte("8080\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sc := linux.Sysctl{ProcFS: procfs}
	for range 2 {
		if err := reservePorts(sc, 61000, 65000); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != "8080,61000-65000" {
			t.Fatalf("ip_local_reserved_ports = %q, want %q", got, "8080,61000-65000")
		}
	}
	if err := reservePorts(linux.Sysctl{ProcFS: filepath.Join(procfs, "missing")}, 1, 2); err == nil {
		t.Fatal("no error for a procfs without the sysctl")
	}
}
