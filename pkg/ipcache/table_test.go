package ipcache

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"
)

// TestPrefixClaimsHeldInline: a prefix's effective claim is held in the
// object itself and only the others in a slice (none for one claim);
// every claim comes back through Claims and the dump's JSON in
// precedence order, and the JSON reads back into the same object.
func TestPrefixClaimsHeldInline(t *testing.T) {
	b := &fakeBackend{m: map[netip.Prefix]Entry{}, fail: map[netip.Prefix]bool{}}
	c := startCache(t, b)
	p := netip.MustParsePrefix("10.65.0.2/32")
	get := func() *PrefixClaims {
		obj, _, ok := c.table.Get(c.db.ReadTxn(), PrefixIndex.Query(p))
		if !ok {
			t.Fatal("the prefix is not in the table")
		}
		return obj
	}
	if err := c.Upsert(p, Entry{Identity: 20001, Source: SourceKubernetes, Owner: OwnerTendrilEndpoint("x", "a")}); err != nil {
		t.Fatal(err)
	}
	if obj := get(); obj.Shadowed != nil || obj.Resolved.Identity != 20001 || len(obj.Claims()) != 1 {
		t.Fatalf("one claim: resolved %+v, shadowed %v", obj.Resolved, obj.Shadowed)
	}
	if err := c.Upsert(p, Entry{Identity: 20002, Source: SourceKVStore, Owner: OwnerKVStore("10.65.0.2")}); err != nil {
		t.Fatal(err)
	}
	if err := c.Upsert(p, Entry{Identity: 7, Source: SourceLocal, Owner: OwnerEndpoint(7)}); err != nil {
		t.Fatal(err)
	}
	obj := get()
	var order []Source
	for _, cl := range obj.Claims() {
		order = append(order, cl.Source)
	}
	if want := []Source{SourceLocal, SourceKubernetes, SourceKVStore}; !reflect.DeepEqual(order, want) || obj.Resolved.Identity != 7 || len(obj.Shadowed) != 2 {
		t.Fatalf("claims %v (resolved %+v), want %v with the local one effective", order, obj.Resolved, want)
	}
	data, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var dump struct {
		Claims   []Claim
		Resolved Entry
	}
	if err := json.Unmarshal(data, &dump); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(dump.Claims, obj.Claims()) || dump.Resolved != obj.Resolved {
		t.Fatalf("dump %s: claims or resolved differ from the object's", data)
	}
	var back PrefixClaims
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Prefix != obj.Prefix || back.Resolved != obj.Resolved || back.Seq != obj.Seq || !reflect.DeepEqual(back.Shadowed, obj.Shadowed) {
		t.Fatalf("read back %+v, want %+v", back, *obj)
	}
	// The local claim goes: the Kubernetes one is effective, held inline.
	if err := c.Delete(p, SourceLocal, OwnerEndpoint(7)); err != nil {
		t.Fatal(err)
	}
	if obj := get(); obj.Resolved.Source != SourceKubernetes || len(obj.Shadowed) != 1 || obj.Shadowed[0].Source != SourceKVStore {
		t.Fatalf("after the local claim went: resolved %+v, shadowed %v", obj.Resolved, obj.Shadowed)
	}
	if err := json.Unmarshal([]byte(`{"Prefix":"10.65.0.2/32","Claims":[]}`), &back); err == nil {
		t.Fatal("a dump without claims read back")
	}
}
