package loader

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// bpffsMount is where bpffs is mounted on a standard system.
const bpffsMount = "/sys/fs/bpf"

// EnsureBPFFS makes sure path lives on a bpffs: when path is below
// /sys/fs/bpf and nothing is mounted there yet (a fresh machine, as the
// Cilium agent also handles), it mounts bpffs on /sys/fs/bpf. A path
// elsewhere must already be on a bpffs.
func EnsureBPFFS(path string) error {
	isBPFFS := func(p string) (bool, error) {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err != nil {
			return false, err
		}
		return st.Type == unix.BPF_FS_MAGIC, nil
	}
	clean := filepath.Clean(path)
	if clean == bpffsMount || strings.HasPrefix(clean, bpffsMount+"/") {
		ok, err := isBPFFS(bpffsMount)
		if err != nil {
			return fmt.Errorf("check bpffs at %s: %w", bpffsMount, err)
		}
		if !ok {
			if err := os.MkdirAll(bpffsMount, 0o755); err != nil {
				return fmt.Errorf("create %s: %w", bpffsMount, err)
			}
			if err := unix.Mount("bpffs", bpffsMount, "bpf", 0, "mode=0700"); err != nil {
				return fmt.Errorf("mount bpffs at %s: %w (the kernel needs CONFIG_BPF_SYSCALL; the agent needs CAP_SYS_ADMIN)", bpffsMount, err)
			}
		}
		return nil
	}
	dir := clean
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	ok, err := isBPFFS(dir)
	if err != nil {
		return fmt.Errorf("check bpffs at %s: %w", dir, err)
	}
	if !ok {
		return fmt.Errorf("BPF root %s is not on a bpffs: mount one (mount -t bpf bpf DIR) or use a path below %s", path, bpffsMount)
	}
	return nil
}
