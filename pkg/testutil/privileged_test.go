package testutil

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestPrivilegedHelperInChild is run by TestPrivilegedSkipsOrFails in a child
// process as an unprivileged user.
func TestPrivilegedHelperInChild(t *testing.T) {
	if os.Getenv("TENDRIL_TESTUTIL_CHILD") != "1" {
		// Not a test of its own: the body runs in the child only.
		return
	}
	Privileged(t)
	t.Log("PRIVILEGED-BODY-RAN")
}

func TestPrivilegedSkipsOrFails(t *testing.T) {
	if os.Geteuid() != 0 {
		// As non-root we can only check the non-CI branch in-process.
		if InCI() {
			t.Fatal("TestPrivilegedSkipsOrFails needs root under CI=true to drop privileges")
		}
		t.Skip("needs root to run a child as an unprivileged user")
	}
	// Copy the test binary where the unprivileged user can execute it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "tendril-testutil-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "testutil.test")
	copyFile(t, self, bin)

	tests := []struct {
		ci       string
		wantFail bool
		wantOut  string
	}{
		{"true", true, "CI=true forbids skipping"},
		{"", false, "needs root; skipping outside CI"},
	}
	for _, tt := range tests {
		cmd := exec.Command(bin, "-test.run", "^TestPrivilegedHelperInChild$", "-test.v")
		cmd.Env = []string{"TENDRIL_TESTUTIL_CHILD=1", "CI=" + tt.ci, "HOME=/"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		failed := err != nil
		if failed != tt.wantFail || !strings.Contains(string(out), tt.wantOut) || strings.Contains(string(out), "PRIVILEGED-BODY-RAN") {
			t.Errorf("CI=%q: failed=%v (want %v), output:\n%s", tt.ci, failed, tt.wantFail, out)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
