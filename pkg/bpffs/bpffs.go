// Package bpffs makes sure a BPF root directory can live where it is asked
// to: bpffs mounted at /sys/fs/bpf when it is missing (a fresh machine
// has none mounted), and paths checked against bpffs's naming rules before
// anything is created, so a bad --bpf-root fails with its cause.
package bpffs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultMount is where bpffs is mounted on a standard system.
const DefaultMount = "/sys/fs/bpf"

// IsMounted reports whether path is on a bpffs.
func IsMounted(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("check bpffs at %s: %w", path, err)
	}
	return st.Type == unix.BPF_FS_MAGIC, nil
}

// EnsureMounted mounts bpffs at /sys/fs/bpf when nothing is mounted there
// yet; mounted says whether it did, so that callers can tell the user.
func EnsureMounted() (mounted bool, err error) {
	if err := os.MkdirAll(DefaultMount, 0o755); err != nil {
		return false, fmt.Errorf("create %s: %w", DefaultMount, err)
	}
	ok, err := IsMounted(DefaultMount)
	if err != nil {
		return false, err
	}
	if ok {
		return false, nil
	}
	if err := unix.Mount("bpffs", DefaultMount, "bpf", 0, "mode=0700"); err != nil {
		return false, fmt.Errorf("mount bpffs at %s: %w (the kernel needs CONFIG_BPF_SYSCALL; mounting needs CAP_SYS_ADMIN)", DefaultMount, err)
	}
	return true, nil
}

// CheckPath checks a BPF root without touching the filesystem: it must be
// absolute, and no name below /sys/fs/bpf may hold a dot, which bpffs
// refuses (mkdir answers EPERM, which reads like a permission problem).
func CheckPath(path string) error {
	if path == "" || !filepath.IsAbs(path) {
		return fmt.Errorf("%q: must be an absolute path", path)
	}
	clean := filepath.Clean(path)
	if rel, ok := strings.CutPrefix(clean, DefaultMount+"/"); ok {
		if err := checkNames(rel); err != nil {
			return fmt.Errorf("%q: %w", path, err)
		}
	}
	return nil
}

func checkNames(rel string) error {
	for _, name := range strings.Split(rel, "/") {
		if strings.Contains(name, ".") {
			return fmt.Errorf("name %q holds a dot, which bpffs does not allow in file or directory names (pick a name without dots)", name)
		}
	}
	return nil
}

// Prepare makes path usable as a BPF root: below /sys/fs/bpf, bpffs is
// mounted there first if missing (mounted says so); elsewhere, the nearest
// existing parent must already be on a bpffs, and the names to create below
// it must be ones bpffs accepts.
func Prepare(path string) (mounted bool, err error) {
	if err := CheckPath(path); err != nil {
		return false, err
	}
	clean := filepath.Clean(path)
	if clean == DefaultMount || strings.HasPrefix(clean, DefaultMount+"/") {
		return EnsureMounted()
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
	ok, err := IsMounted(dir)
	if err != nil {
		return false, err
	}
	if !ok {
		return false, fmt.Errorf("BPF root %s is not on a bpffs: mount one (mount -t bpf bpf DIR) or use a path below %s", path, DefaultMount)
	}
	if rel, err := filepath.Rel(dir, clean); err == nil && rel != "." {
		if err := checkNames(rel); err != nil {
			return false, fmt.Errorf("BPF root %q: %w", path, err)
		}
	}
	return false, nil
}
