package loadbalancer

import (
	"net/netip"
	"testing"
)

// TestBackendKey: the backends table's binary primary key tells apart
// backends that differ in any one of service, source, address, port or
// protocol (including names whose text would run together), so that no
// backend replaces another in the table; equal fields give equal keys; a
// typical EndpointSlice backend's key is short (it is stored in each of
// the table's indexes); a service's backends are found by the key's
// prefix.
func TestBackendKey(t *testing.T) {
	base := Backend{Service: ServiceName{Namespace: "bench", Name: "svc-01234"}, Source: "svc-01234-1",
		Addr: netip.MustParseAddrPort("10.245.0.1:8080"), Proto: TCP}
	variants := []Backend{base}
	for _, change := range []func(*Backend){
		func(b *Backend) { b.Service.Namespace = "other" },
		func(b *Backend) { b.Service.Name = "svc-0123" },
		func(b *Backend) { b.Service.Name, b.Source = "svc-01234s", "vc-01234-1" }, // the same text run together
		func(b *Backend) { b.Source = "svc-01234-2" },
		func(b *Backend) { b.Addr = netip.MustParseAddrPort("10.245.0.2:8080") },
		func(b *Backend) { b.Addr = netip.MustParseAddrPort("10.245.0.1:8081") },
		func(b *Backend) { b.Proto = UDP },
		func(b *Backend) { b.Addr = netip.MustParseAddrPort("[::ffff:10.245.0.1]:8080") },
		func(b *Backend) { b.Addr = netip.MustParseAddrPort("[fd00::1]:8080") },
	} {
		v := base
		change(&v)
		variants = append(variants, v)
	}
	seen := map[string]int{}
	for i := range variants {
		k := string(variants[i].key())
		if j, ok := seen[k]; ok {
			t.Fatalf("backends %+v and %+v share the key %q", variants[j], variants[i], k)
		}
		seen[k] = i
	}
	// Fields outside the key do not change it.
	other := base
	other.PortName, other.NodeName, other.Ready = "http", "node-b", true
	if string(other.key()) != string(base.key()) {
		t.Fatal("a backend's conditions or node changed its key")
	}
	if n := len(base.key()); n > 35 {
		t.Fatalf("key of a typical backend is %d bytes, want at most 35", n)
	}

	// In the table: one row per variant (a source's backends are set
	// together: setting them replaces what the source listed before).
	type source struct {
		svc ServiceName
		src string
	}
	bySource := map[source][]*Backend{}
	for i := range variants {
		v := variants[i]
		bySource[source{v.Service, v.Source}] = append(bySource[source{v.Service, v.Source}], &v)
	}
	w := newTestWriter(t)
	for s, bs := range bySource {
		if err := w.SetBackends(s.svc, s.src, bs); err != nil {
			t.Fatal(err)
		}
	}
	txn := w.t.DB.ReadTxn()
	if n := w.t.Backends.NumObjects(txn); n != len(variants) {
		t.Fatalf("%d backend rows, want %d", n, len(variants))
	}
	// A service's backends by the prefix of their keys: every source's,
	// and none of a service whose name or namespace starts the same
	// (bench/svc-0123 against bench/svc-01234 and svc-01234s).
	for name, want := range map[ServiceName]int{
		{Namespace: "bench", Name: "svc-01234"}:  len(variants) - 3,
		{Namespace: "bench", Name: "svc-0123"}:   1,
		{Namespace: "bench", Name: "svc-01234s"}: 1,
		{Namespace: "other", Name: "svc-01234"}:  1,
		{Namespace: "bench", Name: "svc"}:        0,
		{Namespace: "ben", Name: "ch"}:           0,
	} {
		n := 0
		for b := range ServiceBackends(txn, w.t.Backends, name) {
			if b.Service != name {
				t.Fatalf("backends of %s: %+v", name, b)
			}
			n++
		}
		if n != want {
			t.Fatalf("backends of %s: %d, want %d", name, n, want)
		}
	}
}
