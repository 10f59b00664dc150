package lab

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// MachineResolvConf is the file a pod's resolv.conf is mounted over.
const MachineResolvConf = "/etc/resolv.conf"

// MountPodResolvConf gives the calling thread a mount namespace of its own
// in which podResolvConf is bind-mounted over target (/etc/resolv.conf),
// so what the thread execs next resolves as the pod does while the
// machine's file, and every other process' view of it, stay untouched.
// The caller must hold the thread (runtime.LockOSThread) and never give
// it back to other goroutines: exec from it, or let it exit with the
// goroutine still locked.
//
// Mounts made after the unshare are private to the new namespace: the
// root is remounted recursively private first, or the bind mount would
// propagate back into the machine's namespace through a shared mount.
func MountPodResolvConf(podResolvConf, target string) error {
	if _, err := os.Stat(podResolvConf); err != nil {
		return fmt.Errorf("pod resolv.conf: %w", err)
	}
	fi, err := os.Stat(target)
	if err != nil {
		// Creating it would change the machine's file system.
		return fmt.Errorf("%s: %w (nothing to mount the pod's resolv.conf over)", target, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", target)
	}
	// CLONE_NEWNS implies CLONE_FS, which unshare allows per thread.
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("new mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the new mount namespace private: %w", err)
	}
	if err := unix.Mount(podResolvConf, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s over %s: %w", podResolvConf, target, err)
	}
	// Read-only, as the kubelet mounts it into containers.
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("remount %s read-only: %w", target, err)
	}
	return nil
}
