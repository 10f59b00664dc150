// Package lockfile holds a directory for one process: an exclusive flock
// on a lock file in it, with the holder's PID written inside, so that a
// second process refuses to start on the same directory and says who
// holds it. The kernel drops the lock when the holder exits, however it
// exits, so a killed process leaves no stale lock behind.
package lockfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Name is the lock file's name in the directory.
const Name = "agent.lock"

// ErrHeld means another process holds the lock.
var ErrHeld = errors.New("held by another process")

// Lock is a held lock; Release gives it up.
type Lock struct {
	f *os.File
}

// Acquire takes the lock of dir (creating dir when missing) without
// waiting. When another process holds it, the error wraps ErrHeld and
// names the lock file and the holder's PID as it wrote it.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	path := filepath.Join(dir, Name)
	// No O_TRUNC: the holder's PID must stay readable until this process
	// holds the lock itself.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (lock %s%s)", ErrHeld, path, holder(path))
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// The PID is only for the message of a process that is refused: the
	// lock is held whether or not it is written.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// holder is ", pid N" for the PID the lock file holds, or "" when it holds
// none (the holder has not written it yet).
func holder(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return ""
	}
	return ", pid " + strconv.Itoa(pid)
}

// Release gives the lock up. The lock file stays: removing it would let a
// process that opened it meanwhile lock an unlinked file while a third
// locks a new one.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
