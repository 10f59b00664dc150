package kvstore

import (
	"testing"
	"time"
)

func TestGuardedWrites(t *testing.T) {
	srv := newEmbeddedServer(t)
	c := connect(t, srv.Endpoints())
	ctx := testContext(t, 30*time.Second)

	// No guard: nothing written.
	wrote, exists, err := c.UpdateIfMissingWhileHolds(ctx, "ref/a", []byte("1"), NoLease, "master", []byte("m"))
	if err != nil || wrote || exists {
		t.Fatalf("without guard: wrote=%v exists=%v err=%v", wrote, exists, err)
	}
	if _, found, _ := c.Get(ctx, "ref/a"); found {
		t.Fatal("written without its guard")
	}
	if err := c.Update(ctx, "master", []byte("m"), NoLease); err != nil {
		t.Fatal(err)
	}
	wrote, exists, err = c.UpdateIfMissingWhileHolds(ctx, "ref/a", []byte("1"), SessionLease, "master", []byte("m"))
	if err != nil || !wrote || !exists {
		t.Fatalf("with guard: wrote=%v exists=%v err=%v", wrote, exists, err)
	}
	// Identical: not rewritten.
	wrote, exists, err = c.UpdateIfMissingWhileHolds(ctx, "ref/a", []byte("1"), SessionLease, "master", []byte("m"))
	if err != nil || wrote || !exists {
		t.Fatalf("identical: wrote=%v exists=%v err=%v", wrote, exists, err)
	}

	m, _, _ := c.Get(ctx, "master")
	// A reference under the prefix blocks the delete.
	ok, err := c.DeleteIfUnchangedAndEmpty(ctx, map[string]int64{"master": m.ModRevision}, "ref/")
	if err != nil || ok {
		t.Fatalf("delete with a reference: ok=%v err=%v", ok, err)
	}
	if err := c.Delete(ctx, "ref/a"); err != nil {
		t.Fatal(err)
	}
	// A changed key blocks it.
	if ok, err := c.DeleteIfUnchangedAndEmpty(ctx, map[string]int64{"master": m.ModRevision - 1}, "ref/"); err != nil || ok {
		t.Fatalf("delete at a stale revision: ok=%v err=%v", ok, err)
	}
	// Unchanged and no reference: deleted.
	if ok, err := c.DeleteIfUnchangedAndEmpty(ctx, map[string]int64{"master": m.ModRevision}, "ref/"); err != nil || !ok {
		t.Fatalf("delete: ok=%v err=%v", ok, err)
	}
	if _, found, _ := c.Get(ctx, "master"); found {
		t.Fatal("master key left")
	}
	// A guard holding another value blocks the write, like a missing one.
	if err := c.Update(ctx, "master2", []byte("other"), NoLease); err != nil {
		t.Fatal(err)
	}
	wrote, holds, err := c.UpdateIfMissingWhileHolds(ctx, "ref/b", []byte("2"), NoLease, "master2", []byte("mine"))
	if err != nil || wrote || holds {
		t.Fatalf("guard with another value: wrote=%v holds=%v err=%v", wrote, holds, err)
	}
	if _, found, _ := c.Get(ctx, "ref/b"); found {
		t.Fatal("written while the guard held another value")
	}
}
