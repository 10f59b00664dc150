package loadbalancer

import (
	"net/netip"
	"testing"
)

func dnsService() *Service {
	return &Service{Name: ServiceName{Namespace: "kube-system", Name: "kube-dns"}, Type: "ClusterIP",
		Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:     []ServicePort{{Name: "dns", Port: 53, Proto: UDP}, {Name: "dns-tcp", Port: 53, Proto: TCP}}}
}

func dnsBackends() []*Backend {
	return []*Backend{
		{Addr: netip.MustParseAddrPort("10.0.1.5:53"), Proto: UDP, PortName: "dns", NodeName: "node-b", Ready: true, Serving: true},
		{Addr: netip.MustParseAddrPort("10.0.1.5:53"), Proto: TCP, PortName: "dns-tcp", NodeName: "node-b", Ready: true, Serving: true},
	}
}

func cacheRedirect(backends ...string) *LocalRedirect {
	r := &LocalRedirect{Name: ServiceName{Namespace: "kube-system", Name: "nodelocaldns"},
		Service: ServiceName{Namespace: "kube-system", Name: "kube-dns"}}
	for _, a := range backends {
		r.Backends = append(r.Backends,
			RedirectBackend{Pod: "kube-system/cache", Addr: netip.MustParseAddrPort(a), Proto: UDP, PortName: "dns"},
			RedirectBackend{Pod: "kube-system/cache", Addr: netip.MustParseAddrPort(a), Proto: TCP, PortName: "dns-tcp"})
	}
	return r
}

// TestLocalRedirectServiceMatcher: the service's cluster IP frontends get
// the local pods while the policy has any, the service's own backends
// again when none is left or the policy goes; a policy of another
// namespace changes nothing.
func TestLocalRedirectServiceMatcher(t *testing.T) {
	w := newTestWriter(t)
	svc := dnsService()
	if err := w.UpsertService(svc); err != nil {
		t.Fatal(err)
	}
	if err := w.SetBackends(svc.Name, "s1", dnsBackends()); err != nil {
		t.Fatal(err)
	}
	check := func(what, key, wantType, wantBackend string) {
		t.Helper()
		f := frontends(w)[key]
		if f == nil {
			t.Fatalf("%s: no frontend %s", what, key)
		}
		if got := active(f); f.Type != wantType || len(got) != 1 || got[0] != wantBackend {
			t.Fatalf("%s: %s is %s to %v, want %s to %s", what, key, f.Type, got, wantType, wantBackend)
		}
	}
	check("before", "10.96.0.10:53/UDP", FrontendClusterIP, "10.0.1.5:53")

	if err := w.UpsertLocalRedirect(cacheRedirect("10.0.0.7:53")); err != nil {
		t.Fatal(err)
	}
	check("redirected", "10.96.0.10:53/UDP", FrontendLocalRedirect, "10.0.0.7:53")
	check("redirected", "10.96.0.10:53/TCP", FrontendLocalRedirect, "10.0.0.7:53")
	if f := frontends(w)["10.96.0.10:53/UDP"]; f.Redirect.Name != "nodelocaldns" || !f.Backends[0].Local {
		t.Fatalf("redirected frontend %+v should name its policy and a local backend", f)
	}

	// The cache pod is gone: the service's own backends again.
	if err := w.UpsertLocalRedirect(cacheRedirect()); err != nil {
		t.Fatal(err)
	}
	check("no local backend", "10.96.0.10:53/UDP", FrontendClusterIP, "10.0.1.5:53")
	if err := w.UpsertLocalRedirect(cacheRedirect("10.0.0.8:53")); err != nil {
		t.Fatal(err)
	}
	check("back", "10.96.0.10:53/UDP", FrontendLocalRedirect, "10.0.0.8:53")
	if err := w.DeleteLocalRedirect(ServiceName{Namespace: "kube-system", Name: "nodelocaldns"}); err != nil {
		t.Fatal(err)
	}
	check("deleted", "10.96.0.10:53/TCP", FrontendClusterIP, "10.0.1.5:53")

	// A policy of another namespace naming the service (the source
	// refuses it; the writer ignores it all the same).
	foreign := cacheRedirect("10.0.0.9:53")
	foreign.Name.Namespace = "tenant-a"
	if err := w.UpsertLocalRedirect(foreign); err != nil {
		t.Fatal(err)
	}
	check("foreign policy", "10.96.0.10:53/UDP", FrontendClusterIP, "10.0.1.5:53")
}

// TestLocalRedirectServiceMatcherPorts: only the ports the policy names
// are redirected.
func TestLocalRedirectServiceMatcherPorts(t *testing.T) {
	w := newTestWriter(t)
	svc := dnsService()
	if err := w.UpsertService(svc); err != nil {
		t.Fatal(err)
	}
	if err := w.SetBackends(svc.Name, "s1", dnsBackends()); err != nil {
		t.Fatal(err)
	}
	r := cacheRedirect("10.0.0.7:53")
	r.Ports = []ServicePort{{Name: "dns", Port: 53, Proto: UDP}}
	if err := w.UpsertLocalRedirect(r); err != nil {
		t.Fatal(err)
	}
	fs := frontends(w)
	if fs["10.96.0.10:53/UDP"].Type != FrontendLocalRedirect || fs["10.96.0.10:53/TCP"].Type != FrontendClusterIP {
		t.Fatalf("only the named port should be redirected: UDP %s, TCP %s", fs["10.96.0.10:53/UDP"].Type, fs["10.96.0.10:53/TCP"].Type)
	}
}

// TestLocalRedirectAddressMatcher: an address gets a frontend while the
// policy has local backends and none without (it stops redirecting); a
// service's address is never taken, whichever came first, and is handed
// back to the policy when the service goes.
func TestLocalRedirectAddressMatcher(t *testing.T) {
	w := newTestWriter(t)
	addr := netip.MustParseAddr("169.254.20.10")
	r := &LocalRedirect{Name: ServiceName{Namespace: "tenant-a", Name: "cache"}, Address: addr,
		Ports:    []ServicePort{{Name: "dns", Port: 53, Proto: UDP}},
		Backends: []RedirectBackend{{Pod: "tenant-a/c", Addr: netip.MustParseAddrPort("10.0.0.7:1053"), Proto: UDP, PortName: "other"}}}
	if err := w.UpsertLocalRedirect(r); err != nil {
		t.Fatal(err)
	}
	f := frontends(w)["169.254.20.10:53/UDP"]
	if f == nil || f.Type != FrontendLocalRedirect || f.External() || f.Redirect != r.Name {
		t.Fatalf("address frontend %+v", f)
	}
	if got := active(f); len(got) != 1 || got[0] != "10.0.0.7:1053" {
		t.Fatalf("a single port pairs with the single backend port whatever its name: %v", got)
	}
	noBackends := *r
	noBackends.Backends = nil
	if err := w.UpsertLocalRedirect(&noBackends); err != nil {
		t.Fatal(err)
	}
	if f := frontends(w)["169.254.20.10:53/UDP"]; f != nil {
		t.Fatalf("no local backend: the address is not redirected, have %+v", f)
	}
	if err := w.UpsertLocalRedirect(r); err != nil {
		t.Fatal(err)
	}

	// A service with that address takes it, though the policy came first.
	svc := &Service{Name: ServiceName{Namespace: "tenant-b", Name: "dns"}, Type: "ClusterIP", Addresses: []netip.Addr{addr},
		Ports: []ServicePort{{Name: "dns", Port: 53, Proto: UDP}}}
	if err := w.UpsertService(svc); err != nil {
		t.Fatal(err)
	}
	if f := frontends(w)["169.254.20.10:53/UDP"]; f.Service != svc.Name || f.Type != FrontendClusterIP {
		t.Fatalf("the service's address should be the service's: %+v", f)
	}
	// A change of the policy does not take it back.
	r2 := *r
	r2.Backends = append(r2.Backends, RedirectBackend{Pod: "tenant-a/d", Addr: netip.MustParseAddrPort("10.0.0.8:1053"), Proto: UDP, PortName: "other"})
	if err := w.UpsertLocalRedirect(&r2); err != nil {
		t.Fatal(err)
	}
	if f := frontends(w)["169.254.20.10:53/UDP"]; f.Service != svc.Name {
		t.Fatalf("the policy took the service's address back: %+v", f)
	}
	if err := w.DeleteService(svc.Name); err != nil {
		t.Fatal(err)
	}
	if f := frontends(w)["169.254.20.10:53/UDP"]; f == nil || f.Type != FrontendLocalRedirect || len(active(f)) != 2 {
		t.Fatalf("the service gone, the policy's frontend should be back: %+v", f)
	}
	if err := w.DeleteLocalRedirect(r.Name); err != nil {
		t.Fatal(err)
	}
	if len(frontends(w)) != 0 {
		t.Fatalf("frontends left: %v", frontends(w))
	}
}

// withCookie is r with skipRedirectFromBackend and the cache pod's
// network namespace cookie.
func withCookie(r *LocalRedirect, cookie uint64) *LocalRedirect {
	r.SkipFromBackend = true
	for i := range r.Backends {
		r.Backends[i].NetnsCookie = cookie
	}
	return r
}

// TestLocalRedirectSkipFromBackendService: with skipRedirectFromBackend, a
// serviceMatcher's redirected frontends name the cache pod's network
// namespace as a client to skip and keep the service's own backends for
// it; they go with the flag off, the pod gone (no local backend, or its
// cookie unknown) and the policy deleted.
func TestLocalRedirectSkipFromBackendService(t *testing.T) {
	w := newTestWriter(t)
	svc := dnsService()
	if err := w.UpsertService(svc); err != nil {
		t.Fatal(err)
	}
	if err := w.SetBackends(svc.Name, "s1", dnsBackends()); err != nil {
		t.Fatal(err)
	}
	skipOf := func(what, key string, want uint64) {
		t.Helper()
		f := frontends(w)[key]
		if f == nil {
			t.Fatalf("%s: no frontend %s", what, key)
		}
		if want == 0 {
			if len(f.SkipClients) != 0 || len(f.SkipAddrs) != 0 || f.SkipMode != "" || len(f.Original) != 0 {
				t.Fatalf("%s: %s skips %v (%q, original %v), want none", what, key, f.SkipClients, f.SkipMode, f.Original)
			}
			return
		}
		if f.Type != FrontendLocalRedirect || len(f.SkipClients) != 1 || f.SkipClients[0] != want || f.SkipMode != SkipToOriginal {
			t.Fatalf("%s: %s is %s skipping %v (%q), want LocalRedirect skipping [%d] to the original", what, key, f.Type, f.SkipClients, f.SkipMode, want)
		}
		if len(f.Original) != 1 || f.Original[0].Addr != netip.MustParseAddrPort("10.0.1.5:53") || !f.Original[0].Active {
			t.Fatalf("%s: %s original backends %+v, want the service's 10.0.1.5:53", what, key, f.Original)
		}
	}
	if err := w.UpsertLocalRedirect(withCookie(cacheRedirect("10.0.0.7:53"), 4242)); err != nil {
		t.Fatal(err)
	}
	skipOf("skipping", "10.96.0.10:53/UDP", 4242)
	skipOf("skipping", "10.96.0.10:53/TCP", 4242)

	// The service's backends change: the skipped clients' follow.
	moved := dnsBackends()
	for _, b := range moved {
		b.Addr = netip.MustParseAddrPort("10.0.1.6:53")
	}
	if err := w.SetBackends(svc.Name, "s1", moved); err != nil {
		t.Fatal(err)
	}
	if f := frontends(w)["10.96.0.10:53/UDP"]; len(f.Original) != 1 || f.Original[0].Addr != netip.MustParseAddrPort("10.0.1.6:53") {
		t.Fatalf("original backends did not follow the service's: %+v", f.Original)
	}
	if err := w.SetBackends(svc.Name, "s1", dnsBackends()); err != nil {
		t.Fatal(err)
	}

	// The flag off.
	if err := w.UpsertLocalRedirect(cacheRedirect("10.0.0.7:53")); err != nil {
		t.Fatal(err)
	}
	skipOf("flag off", "10.96.0.10:53/UDP", 0)
	if err := w.UpsertLocalRedirect(withCookie(cacheRedirect("10.0.0.7:53"), 4242)); err != nil {
		t.Fatal(err)
	}
	skipOf("flag on again", "10.96.0.10:53/UDP", 4242)
	if f := frontends(w)["10.96.0.10:53/UDP"]; len(f.SkipAddrs) != 1 || f.SkipAddrs[0] != netip.MustParseAddr("10.0.0.7") {
		t.Fatalf("per-packet skip addresses %v, want the cache pod's 10.0.0.7", f.SkipAddrs)
	}
	// The pod's namespace not known (no endpoint yet): the socket LB
	// does not know it, the per-packet path still does by its address.
	if err := w.UpsertLocalRedirect(withCookie(cacheRedirect("10.0.0.7:53"), 0)); err != nil {
		t.Fatal(err)
	}
	if f := frontends(w)["10.96.0.10:53/UDP"]; len(f.SkipClients) != 0 || len(f.SkipAddrs) != 1 || f.SkipMode != SkipToOriginal || len(f.Original) != 1 {
		t.Fatalf("cookie unknown: %+v", f)
	}
	// The pod gone: no redirect, nothing to skip.
	if err := w.UpsertLocalRedirect(withCookie(cacheRedirect(), 4242)); err != nil {
		t.Fatal(err)
	}
	skipOf("pod gone", "10.96.0.10:53/UDP", 0)
	if f := frontends(w)["10.96.0.10:53/UDP"]; f.Type != FrontendClusterIP {
		t.Fatalf("pod gone: %s", f.Type)
	}
	if err := w.UpsertLocalRedirect(withCookie(cacheRedirect("10.0.0.7:53"), 4242)); err != nil {
		t.Fatal(err)
	}
	skipOf("pod back", "10.96.0.10:53/UDP", 4242)
	if err := w.DeleteLocalRedirect(ServiceName{Namespace: "kube-system", Name: "nodelocaldns"}); err != nil {
		t.Fatal(err)
	}
	skipOf("policy deleted", "10.96.0.10:53/UDP", 0)
}

// TestLocalRedirectSkipFromBackendAddress: an addressMatcher's frontend
// lets the cache pod reach the address itself (SkipPass), with no
// backends of its own for it; the flag off or the policy deleted, none.
func TestLocalRedirectSkipFromBackendAddress(t *testing.T) {
	w := newTestWriter(t)
	r := &LocalRedirect{Name: ServiceName{Namespace: "kube-system", Name: "cache"}, Address: netip.MustParseAddr("169.254.20.10"),
		Ports:    []ServicePort{{Name: "dns", Port: 53, Proto: UDP}},
		Backends: []RedirectBackend{{Pod: "kube-system/c", Addr: netip.MustParseAddrPort("10.0.0.7:53"), Proto: UDP, PortName: "dns"}}}
	if err := w.UpsertLocalRedirect(withCookie(r, 77)); err != nil {
		t.Fatal(err)
	}
	f := frontends(w)["169.254.20.10:53/UDP"]
	if f == nil || len(f.SkipClients) != 1 || f.SkipClients[0] != 77 || len(f.SkipAddrs) != 1 || f.SkipMode != SkipPass || len(f.Original) != 0 {
		t.Fatalf("address frontend %+v, want the cache skipped to the address itself", f)
	}
	off := *r
	off.SkipFromBackend = false
	if err := w.UpsertLocalRedirect(&off); err != nil {
		t.Fatal(err)
	}
	if f := frontends(w)["169.254.20.10:53/UDP"]; f == nil || len(f.SkipClients) != 0 || len(f.SkipAddrs) != 0 || f.SkipMode != "" {
		t.Fatalf("flag off: %+v", f)
	}
	if err := w.UpsertLocalRedirect(withCookie(r, 77)); err != nil {
		t.Fatal(err)
	}
	if err := w.DeleteLocalRedirect(r.Name); err != nil {
		t.Fatal(err)
	}
	if len(frontends(w)) != 0 {
		t.Fatalf("frontends left: %v", frontends(w))
	}
}
