package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPollEndsWhenAWatchedProcessExits: a wait on something a process
// should do (kube-controller-manager assigning pod CIDRs) ends as soon as
// that process exits, naming it and quoting its log, instead of running
// out its timeout with only "not done".
func TestPollEndsWhenAWatchedProcessExits(t *testing.T) {
	st := &State{Dir: t.TempDir()}
	for _, d := range []string{st.LogDir(), st.PidDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd, _, err := StartDetached(st.PidDir(), "kube-controller-manager", filepath.Join(st.LogDir(), "kube-controller-manager.log"),
		[]string{"sh", "-c", "echo 'failed to listen on 127.0.0.1:4242: address already in use'; exit 1"})
	if err != nil {
		t.Fatal(err)
	}
	exited := map[string]<-chan error{"kube-controller-manager": watchExit(cmd)}
	err = poll(context.Background(), "wait for the pod CIDRs", time.Minute, st, exited, func() (bool, error) { return false, nil })
	if err == nil {
		t.Fatal("poll returned no error")
	}
	for _, want := range []string{"kube-controller-manager", "exit status 1", "address already in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestStartTimeOfAChildThatExitedAtOnce: a child that exits before
// StartDetached reads its start time is a zombie until it is waited for;
// its PID is still its own, so the start time is read all the same and
// the caller's Wait says how it ended (not "exited at once"). The child
// here has exited before the read, every time.
func TestStartTimeOfAChildThatExitedAtOnce(t *testing.T) {
	cmd := exec.Command("sh", "-c", "exit 3")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stat := fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)
	for { // until it is a zombie; the test's deadline ends a hang
		data, err := os.ReadFile(stat)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.LastIndexByte(data, ')'); i > 0 && strings.HasPrefix(string(data[i+1:]), " Z") {
			break
		}
		time.Sleep(time.Millisecond)
	}
	start, err := childStart(cmd.Process.Pid)
	if err != nil || start == 0 {
		t.Fatalf("start time of an exited child: %d, %v", start, err)
	}
	if (Process{PID: cmd.Process.Pid, Start: start}).Alive() {
		t.Fatal("an exited child counts as alive")
	}
	var exit *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("wait: %v, want exit status 3", err)
	}
}
