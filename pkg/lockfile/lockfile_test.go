package lockfile

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
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

// holdEnv names the directory a re-executed test binary locks (TestMain)
// before it reports on stdout and waits to be killed.
const holdEnv = "TENDRIL_LOCKFILE_TEST_HOLD"

// TestMain runs the holder process of TestLockIsDroppedWhenTheHolderDies
// when the test binary is started with holdEnv set.
func TestMain(m *testing.M) {
	if dir := os.Getenv(holdEnv); dir != "" {
		if _, err := Acquire(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Println("held")
		select {} // until killed
	}
	os.Exit(m.Run())
}

// TestLockIsDroppedWhenTheHolderDies: a process killed while holding the
// lock leaves none behind (flock, not a PID file). The holder is this
// test binary run again, one process: once Wait has reaped it, its files
// are closed (a holder that forks, as flock(1) does, can leave a child
// with the lock open after its parent is reaped).
func TestLockIsDroppedWhenTheHolderDies(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "held\n" {
		t.Fatalf("holder process: %q %v", line, err)
	}
	_, err = Acquire(dir)
	if !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", cmd.Process.Pid)) {
		t.Fatalf("Acquire while the holder lives: %v, want ErrHeld naming pid %d", err, cmd.Process.Pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // killed: the error is the signal
	l, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after the holder died: %v", err)
	}
	_ = l.Release()
}
