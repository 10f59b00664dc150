package lockfile

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSecondAcquireIsRefusedWithThePID: while one holder has the lock, a
// second Acquire (a new open file description, as another process has)
// fails with ErrHeld and the holder's PID; after Release it succeeds.
func TestSecondAcquireIsRefusedWithThePID(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(dir)
	if !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second Acquire: %v, want ErrHeld naming pid %d", err, os.Getpid())
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	_ = l2.Release()
}

// TestLockIsDroppedWhenTheHolderDies: a process killed while holding the
// lock leaves none behind (flock, not a PID file).
func TestLockIsDroppedWhenTheHolderDies(t *testing.T) {
	dir := t.TempDir()
	// flock(1) from util-linux holds the lock in a child process.
	if _, err := exec.LookPath("flock"); err != nil {
		t.Fatalf("flock(1) is needed: %v", err)
	}
	// -o: flock itself holds the lock, not the sleep it starts.
	cmd := exec.Command("flock", "-o", "--exclusive", dir+"/"+Name, "sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Its own process group, so that the sleep goes with it.
	kill := func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }
	defer kill()
	// Wait until the child holds it (polling; no wall-clock bound).
	for {
		l, err := Acquire(dir)
		if err == nil {
			_ = l.Release()
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !errors.Is(err, ErrHeld) {
			t.Fatal(err)
		}
		break
	}
	kill()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after the holder died: %v", err)
	}
	_ = l.Release()
}
