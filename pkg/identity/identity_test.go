package identity

import (
	"fmt"
	"testing"
)

func TestLocalAllocator(t *testing.T) {
	a := NewLocalAllocator()
	var added, deleted int
	a.Subscribe(func(ad, del []Identity) { added += len(ad); deleted += len(del) })
	x, isNew, err := a.Allocate([]string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=default"})
	if err != nil || !isNew || !x.ID.IsCluster() {
		t.Fatalf("first = %+v %v %v", x, isNew, err)
	}
	// Order of labels does not matter.
	y, isNew, _ := a.Allocate([]string{"k8s:io.kubernetes.pod.namespace=default", "k8s:app=web"})
	if y.ID != x.ID || isNew {
		t.Fatalf("same labels got %d then %d", x.ID, y.ID)
	}
	seen := map[NumericIdentity]bool{x.ID: true}
	for i := 0; i < 1000; i++ {
		id, _, err := a.Allocate([]string{fmt.Sprintf("k8s:n=%d", i)})
		if err != nil || seen[id.ID] {
			t.Fatalf("allocation %d: %v dup=%v", i, err, seen[id.ID])
		}
		seen[id.ID] = true
	}
	_ = a.Release(x.ID)
	if _, ok := a.Lookup(x.ID); !ok {
		t.Fatal("released with a reference left")
	}
	_ = a.Release(x.ID)
	if _, ok := a.Lookup(x.ID); ok {
		t.Fatal("not released after the last reference")
	}
	if added != 1001 || deleted != 1 {
		t.Fatalf("listener saw %d added, %d deleted", added, deleted)
	}
	if err := a.Release(x.ID); err == nil {
		t.Fatal("double release accepted")
	}
	if _, _, err := a.Allocate(nil); err == nil {
		t.Fatal("empty labels accepted")
	}
}

func TestReservedNames(t *testing.T) {
	for name, want := range map[string]NumericIdentity{"host": 1, "world": 2, "remote-node": 6, "kube-apiserver": 7, "world-ipv6": 10} {
		if got, ok := ReservedByName(name); !ok || got != want {
			t.Errorf("%s = %d", name, got)
		}
	}
	if (LocalScope|5).IsLocal() != true || NumericIdentity(300).IsLocal() {
		t.Fatal("scope bit")
	}
	if Host.String() != "reserved:host" {
		t.Fatal(Host.String())
	}
}

// ReservedByName (a switch) and the names String uses must agree.
func TestReservedByNameMatchesNames(t *testing.T) {
	names := reservedNames()
	for id, name := range names {
		got, ok := ReservedByName(name)
		if !ok || got != id {
			t.Errorf("ReservedByName(%q) = %d, %v; want %d", name, got, ok, id)
		}
	}
	if _, ok := ReservedByName("everyone"); ok {
		t.Error("unknown name resolved")
	}
}

// TestSeparatorInLabelIsRefused: a label holding ';' (or ',') is refused,
// not allocated: the label set's key joins labels with ';', so
// "k8s:app=a;k8s:role=admin" would share the identity of the two labels
// app=a and role=admin, and a node reading the kvstore's master key
// would see those two.
func TestSeparatorInLabelIsRefused(t *testing.T) {
	a := NewLocalAllocator()
	admin, _, err := a.Allocate([]string{"k8s:app=a", "k8s:role=admin"})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]string{{"k8s:app=a;k8s:role=admin"}, {"k8s:app=a,k8s:role=admin"}, {"k8s:app=a", ""}} {
		got, _, err := a.Allocate(bad)
		if err == nil {
			t.Errorf("Allocate(%q) = identity %d (admin's is %d), want an error", bad, got.ID, admin.ID)
		}
	}
	if err := CheckLabels([]string{"k8s:app=a", "k8s:role=admin", "cidr:2001:db8::/32", "k8s:url=a=b"}); err != nil {
		t.Errorf("valid labels refused: %v", err)
	}
}

// TestClusterCacheRevoke: a number the store gives to other labels no
// longer maps the old labels to it; a reference for the new labels
// revokes the references held for the old ones, tells the revocation
// subscribers once, and leaves one binding.
func TestClusterCacheRevoke(t *testing.T) {
	c := NewClusterCache()
	old := []string{"k8s:app=old"}
	c.Learn(300, old)
	c.RefAs(300, old)
	c.RefAs(300, old)
	var revoked []string
	c.SubscribeRevoked(func(id NumericIdentity, labels []string) { revoked = append(revoked, fmt.Sprint(id, labels)) })
	// The store now says 300 is other labels.
	other := []string{"k8s:app=other"}
	c.Learn(300, other)
	if _, ok := c.KnownID(LabelsKey(old)); ok {
		t.Fatal("the old labels still map to the reused number")
	}
	if key, _ := c.BoundLabels(300); key != LabelsKey(old) {
		t.Fatalf("bound to %q before the revocation", key)
	}
	if n := c.RefAs(300, other); n != 1 {
		t.Fatalf("references after taking the number for other labels: %d, want 1", n)
	}
	if fmt.Sprint(revoked) != "[300 [k8s:app=old]]" {
		t.Fatalf("revoked %v", revoked)
	}
	if h := c.Held(); len(h) != 1 || h[0].LabelsKey != LabelsKey(other) || h[0].Refs != 1 {
		t.Fatalf("held %+v", h)
	}
	// Revoking labels the number is not held for does nothing.
	if c.Revoke(300, LabelsKey(old)) {
		t.Fatal("revoked a binding that is gone")
	}
	if last, err := c.Unref(300); err != nil || !last {
		t.Fatalf("unref: %v %v", last, err)
	}
	if _, held := c.BoundLabels(300); held {
		t.Fatal("bound after the last reference went")
	}
}
