package bpffs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/testutil"
)

func TestCheckPath(t *testing.T) {
	for _, tt := range []struct {
		path, wantErr string
	}{
		{"/sys/fs/bpf/tendril", ""},
		{"/sys/fs/bpf/tendril-lab/lab1/node1", ""},
		{"/sys/fs/bpf", ""},
		{"/sys/fs/bpf/tendril-test.1", `name "tendril-test.1" holds a dot`},
		{"/sys/fs/bpf/a/b.c/d", `name "b.c" holds a dot`},
		{"/elsewhere/with.dot", ""}, // not below /sys/fs/bpf: Prepare checks it
		{"relative", "must be an absolute path"},
		{"", "must be an absolute path"},
	} {
		err := CheckPath(tt.path)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("CheckPath(%q) = %v, want nil", tt.path, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("CheckPath(%q) = %v, want an error containing %q", tt.path, err, tt.wantErr)
		}
	}
}

// TestPrivilegedPrepare: a BPF root below /sys/fs/bpf is prepared (bpffs
// mounted if needed) and can be created; one outside any bpffs is refused
// with a message that says how to fix it.
func TestPrivilegedPrepare(t *testing.T) {
	testutil.Privileged(t)
	root := filepath.Join(DefaultMount, "tendril-bpffs-test")
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	if _, err := Prepare(root); err != nil {
		t.Fatal(err)
	}
	if ok, err := IsMounted(DefaultMount); err != nil || !ok {
		t.Fatalf("bpffs at %s: %v %v", DefaultMount, ok, err)
	}
	if err := os.MkdirAll(filepath.Join(root, "links"), 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := Prepare(filepath.Join(t.TempDir(), "root")); err == nil || !strings.Contains(err.Error(), "is not on a bpffs") {
		t.Errorf("Prepare outside bpffs = %v, want 'is not on a bpffs'", err)
	}
}
