package delqueue

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAddListRemove(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "q")
	if entries, errs := List(dir); len(entries) != 0 || len(errs) != 0 {
		t.Fatalf("a queue that does not exist lists %v %v", entries, errs)
	}
	if err := Add(dir, "c1", "eth0", []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	// The same attachment again replaces its record; another adds one.
	if err := Add(dir, "c1", "eth0", []byte(`{"a":2}`)); err != nil {
		t.Fatal(err)
	}
	if err := Add(dir, "c1", "eth1", []byte(`{"b":1}`)); err != nil {
		t.Fatal(err)
	}
	// A write in progress and a file of another kind are not entries.
	os.WriteFile(filepath.Join(dir, ".tmp-123"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(dir, "README"), []byte("x"), 0o600)
	entries, errs := List(dir)
	if len(errs) != 0 || len(entries) != 2 {
		t.Fatalf("entries %v errs %v, want 2 and none", entries, errs)
	}
	bodies := string(entries[0].Body) + string(entries[1].Body)
	if !strings.Contains(bodies, `{"a":2}`) || !strings.Contains(bodies, `{"b":1}`) || strings.Contains(bodies, `{"a":1}`) {
		t.Errorf("bodies %s", bodies)
	}
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("queue dir mode %v (%v), want 0700", st.Mode().Perm(), err)
	}
	for _, e := range entries {
		if err := Remove(e); err != nil {
			t.Fatal(err)
		}
		if err := Remove(e); err != nil {
			t.Errorf("removing twice: %v", err)
		}
	}
	if entries, _ := List(dir); len(entries) != 0 {
		t.Errorf("after Remove: %v", entries)
	}
}

func TestOversizedEntryIsReportedNotRead(t *testing.T) {
	dir := t.TempDir()
	big := make([]byte, MaxEntryBytes+1)
	if err := os.WriteFile(filepath.Join(dir, "big.json"), big, 0o600); err != nil {
		t.Fatal(err)
	}
	entries, errs := List(dir)
	if len(entries) != 1 || entries[0].Body != nil || len(errs) != 1 {
		t.Fatalf("entries %d (body %d bytes), errs %v", len(entries), len(entries[0].Body), errs)
	}
}
