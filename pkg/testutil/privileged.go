// Package testutil holds helpers shared by the tests of many packages.
package testutil

import (
	"os"
	"testing"
)

// InCI reports whether the tests run under continuous integration (CI=true),
// where a check that cannot run must fail instead of skipping.
func InCI() bool {
	return os.Getenv("CI") == "true"
}

// Privileged marks a test that needs root. Outside CI it skips when not root;
// under CI=true it fails, so that a privileged check never passes silently.
func Privileged(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if InCI() {
		t.Fatalf("%s needs root, and CI=true forbids skipping it", t.Name())
	}
	t.Skipf("%s needs root; skipping outside CI", t.Name())
}

// Require fails under CI and skips otherwise when ok is false; reason says
// what is missing (a binary, a kernel feature).
func Require(t testing.TB, ok bool, reason string) {
	t.Helper()
	if ok {
		return
	}
	if InCI() {
		t.Fatalf("%s cannot run under CI=true: %s", t.Name(), reason)
	}
	t.Skipf("%s skipped: %s", t.Name(), reason)
}
