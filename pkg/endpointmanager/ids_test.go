package endpointmanager

import (
	"context"
	"testing"

	"github.com/tendril-net/tendril/pkg/endpoint"
)

// TestIDCursorAcrossRestart: the persisted cursor runs ahead of the IDs
// handed out, so after a restart a freed ID is not handed out again at
// once; and it is written once per block of creates, not on every create.
func TestIDCursorAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, dir)
	var last *endpoint.Endpoint
	for i := 1; i <= 3; i++ {
		last = f.createPod(t, i)
	}
	cursor := func() string {
		data, err := f.store.ReadFile("next-id")
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	first := cursor()
	if err := f.mgr.Delete(context.Background(), last.ID); err != nil {
		t.Fatal(err)
	}
	f.createPod(t, 4)
	if got := cursor(); got != first {
		t.Errorf("cursor rewritten within its block: %s then %s", first, got)
	}

	// A new manager on the same state, as after a restart.
	g := &fixture{dir: dir, ipam: f.ipam, store: f.store, mgr: New(f.store, f.ipam, nil)}
	next := g.createPod(t, 5)
	if next.ID <= 4 || next.ID == last.ID {
		t.Errorf("first ID after the restart is %d; IDs up to 4 were handed out (%d freed)", next.ID, last.ID)
	}
	// Crossing the block moves the cursor on disk before the ID is used.
	for i := 6; i < 6+cursorBlock; i++ {
		g.createPod(t, i)
	}
	if got := cursor(); got == first {
		t.Errorf("cursor still %s after %d more creates", got, cursorBlock)
	}
}
