package namedns

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// NetnsCookie is the cookie of the network namespace at path: the number
// bpf_get_netns_cookie returns for sockets of that namespace, read with
// getsockopt(SO_NETNS_COOKIE) on a socket opened inside it (Linux 5.12+).
func NetnsCookie(path string) (uint64, error) {
	var cookie uint64
	err := InNetns(path, func() error {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("socket: %w", err)
		}
		defer unix.Close(fd)
		if cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE); err != nil {
			return fmt.Errorf("getsockopt SO_NETNS_COOKIE (Linux 5.12+): %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("network namespace cookie of %s: %w", path, err)
	}
	return cookie, nil
}
