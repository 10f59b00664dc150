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
}

// Set writes value to the sysctl given as path segments below /proc/sys,
// e.g. Set("1", "net", "ipv4", "conf", "veth0", "rp_filter"). Segments keep
// interface names intact (a dot in "eth0.100" is not a separator).
func (s Sysctl) Set(value string, segments ...string) error {
	p := filepath.Join(append([]string{"/proc/sys"}, segments...)...)
	return InNetNS(s.NetNS, func() error {
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", p, value, err)
		}
		return nil
	})
}

// Get reads the sysctl given as path segments below /proc/sys.
func (s Sysctl) Get(segments ...string) (string, error) {
	p := filepath.Join(append([]string{"/proc/sys"}, segments...)...)
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
