package nodeids

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func node(name string, ips ...string) Node {
	n := Node{Name: name}
	for _, ip := range ips {
		n.IPs = append(n.IPs, netip.MustParseAddr(ip))
	}
	return n
}

func mustSync(t *testing.T, a *Allocator, complete bool, nodes ...Node) bool {
	t.Helper()
	changed, err := a.Sync(nodes, complete)
	if err != nil {
		t.Fatal(err)
	}
	return changed
}

func wantID(t *testing.T, a *Allocator, name string, want uint16) {
	t.Helper()
	if id, ok := a.ID(name); !ok || id != want {
		t.Fatalf("node %s: ID %d (%v), want %d", name, id, ok, want)
	}
}

// TestAllocatorStable: each node gets the lowest free ID from 1; a node
// keeps its ID when others come and go and when its addresses change; a
// freed ID goes to the next new node.
func TestAllocatorStable(t *testing.T) {
	a := NewAllocator()
	if !mustSync(t, a, true, node("b", "172.31.0.3"), node("a", "172.31.0.2")) {
		t.Fatal("first sync: no change reported")
	}
	ida, _ := a.ID("a")
	idb, _ := a.ID("b")
	if ida == idb || ida < 1 || idb < 1 || ida > 2 || idb > 2 {
		t.Fatalf("IDs a=%d b=%d, want 1 and 2", ida, idb)
	}
	if mustSync(t, a, true, node("a", "172.31.0.2"), node("b", "172.31.9.9", "fd00::3")) {
		t.Fatal("an address change reported as a change of allocation")
	}
	wantID(t, a, "b", idb)
	mustSync(t, a, true, node("b", "172.31.9.9"), node("c", "172.31.0.4"))
	wantID(t, a, "b", idb)
	wantID(t, a, "c", ida) // a's freed ID is the lowest free
	if _, ok := a.ID("a"); ok {
		t.Fatal("a removed node keeps its ID")
	}
	d := a.Dump()
	if len(d) != 2 || *d[0].ID != 1 || *d[1].ID != 2 {
		t.Fatalf("dump %+v", d)
	}
	for _, n := range d {
		if *n.ID == int64(idb) && (len(n.Ips) != 1 || n.Ips[0] != "172.31.9.9") {
			t.Fatalf("b's addresses %v", n.Ips)
		}
	}
}

// TestAllocatorIncompleteKeepsRestored: before the nodes table is
// complete, a restored node not listed yet keeps its ID (a new node does
// not take it) and is not in the dump; once complete, it is freed.
func TestAllocatorIncompleteKeepsRestored(t *testing.T) {
	dir := t.TempDir()
	a := NewAllocator()
	mustSync(t, a, true, node("a", "10.0.0.1"), node("b", "10.0.0.2"))
	if err := a.Save(dir); err != nil {
		t.Fatal(err)
	}
	ida, _ := a.ID("a")
	idb, _ := a.ID("b")

	r := NewAllocator()
	if n, err := r.Restore(dir); err != nil || n != 2 {
		t.Fatalf("restore: %d, %v", n, err)
	}
	mustSync(t, r, false, node("c", "10.0.0.3"), node("b", "10.0.0.2"))
	wantID(t, r, "a", ida)
	wantID(t, r, "b", idb)
	wantID(t, r, "c", 3)
	if d := r.Dump(); len(d) != 2 {
		t.Fatalf("dump lists a node the table does not have: %+v", d)
	}
	if !mustSync(t, r, true, node("c", "10.0.0.3"), node("b", "10.0.0.2")) {
		t.Fatal("freeing a's ID not reported")
	}
	if _, ok := r.ID("a"); ok {
		t.Fatal("a kept its ID once the table was complete without it")
	}
}

// TestAllocatorRestoreRefusesBadFiles: a malformed file, an ID out of
// range, an ID held twice or without a name restore nothing; a missing
// file restores nothing without an error.
func TestAllocatorRestoreRefusesBadFiles(t *testing.T) {
	if n, err := NewAllocator().Restore(t.TempDir()); n != 0 || err != nil {
		t.Fatalf("missing file: %d, %v", n, err)
	}
	for _, tc := range []struct{ content, want string }{
		{`{"nodes":`, "parse"},
		{`{"nodes":{"a":0}}`, "out of range"},
		{`{"nodes":{"a":65536}}`, "parse"},
		{`{"nodes":{"a":-1}}`, "parse"},
		{`{"nodes":{"a":4,"b":4}}`, "held by both"},
		{`{"nodes":{"":4}}`, "without a node name"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, StateFile), []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		a := NewAllocator()
		n, err := a.Restore(dir)
		if err == nil || !strings.Contains(err.Error(), tc.want) || n != 0 || len(a.ids) != 0 {
			t.Errorf("%s: restored %d (%v), want an error with %q and nothing restored", tc.content, n, err, tc.want)
		}
	}
}

// TestAllocatorExhausted: with every ID taken a new node gets none and
// the error names it; the others keep theirs.
func TestAllocatorExhausted(t *testing.T) {
	a := NewAllocator()
	for id := minID; id <= maxID; id++ {
		a.ids["node-"+strconv.Itoa(id)] = uint16(id)
	}
	var nodes []Node
	for name := range a.ids {
		nodes = append(nodes, Node{Name: name})
	}
	_, err := a.Sync(append(nodes, node("late", "10.0.0.9")), true)
	if err == nil || !strings.Contains(err.Error(), `"late"`) {
		t.Fatalf("sync with no free ID: %v", err)
	}
	if _, ok := a.ID("late"); ok {
		t.Fatal("a node got an ID with none free")
	}
	if len(a.ids) != maxID {
		t.Fatalf("%d allocations, want %d", len(a.ids), maxID)
	}
}
