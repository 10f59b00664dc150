package linux

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netns"
)

// Sysctl writes /proc/sys/net values of one network namespace. The files
// under /proc/sys/net belong to the namespace of the thread that opens them,
// hence the namespace handle.
type Sysctl struct {
	NetNS netns.NsHandle
	// ProcFS is where procfs is mounted ("": /proc). An agent in an
	// unprivileged container has /proc/sys read-only (the runtime's
	// readonlyPaths) and reaches the node's /proc/sys/net through a
	// hostPath mount elsewhere (the chart: /host/proc/sys/net, with
	// ProcFS /host/proc), as Cilium's --procfs; what is under it still
	// belongs to the opening thread's namespace.
	ProcFS string
}

// path is the file of a sysctl given as segments below <procfs>/sys.
func (s Sysctl) path(segments ...string) string {
	root := s.ProcFS
	if root == "" {
		root = "/proc"
	}
	return filepath.Join(append([]string{root, "sys"}, segments...)...)
}

// Set writes value to the sysctl given as path segments below /proc/sys,
// e.g. Set("1", "net", "ipv4", "conf", "veth0", "rp_filter"). Segments keep
// interface names intact (a dot in "eth0.100" is not a separator).
func (s Sysctl) Set(value string, segments ...string) error {
	p := s.path(segments...)
	return InNetNS(s.NetNS, func() error {
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", p, value, err)
		}
		return nil
	})
}

// Get reads the sysctl given as path segments below /proc/sys.
func (s Sysctl) Get(segments ...string) (string, error) {
	p := s.path(segments...)
	var v string
	err := InNetNS(s.NetNS, func() error {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("read sysctl %s: %w", p, err)
		}
		v = strings.TrimSpace(string(b))
		return nil
	})
	return v, err
}
