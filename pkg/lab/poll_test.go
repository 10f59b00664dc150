package lab

import (
	"context"
	"os"
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
