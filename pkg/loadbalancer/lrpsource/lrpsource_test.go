package lrpsource

import (
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/watchers"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

func svcPolicy(ns, name string) *v1alpha1.TendrilLocalRedirectPolicy {
	return &v1alpha1.TendrilLocalRedirectPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.LocalRedirectPolicySpec{
			RedirectFrontend: v1alpha1.RedirectFrontend{ServiceMatcher: &v1alpha1.LRPServiceMatcher{ServiceName: "kube-dns", Namespace: ns}},
			RedirectBackend: v1alpha1.RedirectBackend{
				LocalEndpointSelector: metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "node-local-dns"}},
				ToPorts:               []v1alpha1.LRPPort{{Port: "53", Protocol: "UDP", Name: "dns"}, {Port: "53", Protocol: "TCP", Name: "dns-tcp"}},
			},
		},
	}
}

func addrPolicy(ip string, ports ...v1alpha1.LRPPort) *v1alpha1.TendrilLocalRedirectPolicy {
	p := svcPolicy("tenant-a", "meta")
	p.Spec.RedirectFrontend = v1alpha1.RedirectFrontend{AddressMatcher: &v1alpha1.LRPAddressMatcher{IP: ip, ToPorts: ports}}
	p.Spec.RedirectBackend.ToPorts = []v1alpha1.LRPPort{{Port: "8080", Protocol: "TCP"}}
	return p
}

// TestParseRefusesBadPolicies: every malformed part refuses the whole
// policy with an error naming the field.
func TestParseRefusesBadPolicies(t *testing.T) {
	allowed := Limits{AddressCIDRs: []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16")}, AddressNamespaces: []string{"tenant-a", "kube-system"}}
	tcp80 := v1alpha1.LRPPort{Port: "80", Protocol: "TCP"}
	cases := []struct {
		name   string
		policy func() *v1alpha1.TendrilLocalRedirectPolicy
		want   string
	}{
		{"bad ip", func() *v1alpha1.TendrilLocalRedirectPolicy { return addrPolicy("169.254.1.300", tcp80) }, "not an IP address"},
		{"loopback", func() *v1alpha1.TendrilLocalRedirectPolicy { return addrPolicy("127.0.0.1", tcp80) }, "unicast"},
		{"unspecified", func() *v1alpha1.TendrilLocalRedirectPolicy { return addrPolicy("0.0.0.0", tcp80) }, "unicast"},
		{"multicast", func() *v1alpha1.TendrilLocalRedirectPolicy { return addrPolicy("224.0.0.1", tcp80) }, "unicast"},
		{"namespace not allowed", func() *v1alpha1.TendrilLocalRedirectPolicy {
			p := addrPolicy("169.254.1.1", tcp80)
			p.Namespace = "tenant-b"
			return p
		}, "namespace tenant-b may not redirect addresses"},
		{"outside allowed", func() *v1alpha1.TendrilLocalRedirectPolicy { return addrPolicy("8.8.8.8", tcp80) }, "lrp-address-matcher-cidrs"},
		{"no frontend port", func() *v1alpha1.TendrilLocalRedirectPolicy { return addrPolicy("169.254.1.1") }, "at least one port"},
		{"port 0", func() *v1alpha1.TendrilLocalRedirectPolicy {
			return addrPolicy("169.254.1.1", v1alpha1.LRPPort{Port: "0"})
		}, "port \"0\""},
		{"port too big", func() *v1alpha1.TendrilLocalRedirectPolicy {
			return addrPolicy("169.254.1.1", v1alpha1.LRPPort{Port: "65536"})
		}, "port \"65536\""},
		{"port not a number", func() *v1alpha1.TendrilLocalRedirectPolicy {
			return addrPolicy("169.254.1.1", v1alpha1.LRPPort{Port: "http"})
		}, "port \"http\""},
		{"bad protocol", func() *v1alpha1.TendrilLocalRedirectPolicy {
			return addrPolicy("169.254.1.1", v1alpha1.LRPPort{Port: "80", Protocol: "ICMP"})
		}, "TCP or UDP"},
		{"unnamed ports", func() *v1alpha1.TendrilLocalRedirectPolicy {
			return addrPolicy("169.254.1.1", v1alpha1.LRPPort{Port: "80"}, v1alpha1.LRPPort{Port: "81"})
		}, "unnamed"},
		{"both matchers", func() *v1alpha1.TendrilLocalRedirectPolicy {
			p := svcPolicy("kube-system", "x")
			p.Spec.RedirectFrontend.AddressMatcher = &v1alpha1.LRPAddressMatcher{IP: "169.254.1.1", ToPorts: []v1alpha1.LRPPort{tcp80}}
			return p
		}, "both set"},
		{"no matcher", func() *v1alpha1.TendrilLocalRedirectPolicy {
			p := svcPolicy("kube-system", "x")
			p.Spec.RedirectFrontend.ServiceMatcher = nil
			return p
		}, "neither"},
		{"other namespace's service", func() *v1alpha1.TendrilLocalRedirectPolicy {
			p := svcPolicy("tenant-a", "x")
			p.Spec.RedirectFrontend.ServiceMatcher.Namespace = "kube-system"
			return p
		}, "own namespace"},
		{"bad service name", func() *v1alpha1.TendrilLocalRedirectPolicy {
			p := svcPolicy("kube-system", "x")
			p.Spec.RedirectFrontend.ServiceMatcher.ServiceName = "pod/x"
			return p
		}, "serviceName"},
		{"empty selector", func() *v1alpha1.TendrilLocalRedirectPolicy {
			p := svcPolicy("kube-system", "x")
			p.Spec.RedirectBackend.LocalEndpointSelector = metav1.LabelSelector{}
			return p
		}, "empty"},
		{"bad selector", func() *v1alpha1.TendrilLocalRedirectPolicy {
			p := svcPolicy("kube-system", "x")
			p.Spec.RedirectBackend.LocalEndpointSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}
			return p
		}, "localEndpointSelector"},
		{"no backend port", func() *v1alpha1.TendrilLocalRedirectPolicy {
			p := svcPolicy("kube-system", "x")
			p.Spec.RedirectBackend.ToPorts = nil
			return p
		}, "redirectBackend.toPorts"},
		{"duplicate port", func() *v1alpha1.TendrilLocalRedirectPolicy {
			p := svcPolicy("kube-system", "x")
			p.Spec.RedirectBackend.ToPorts[1].Protocol = "UDP"
			return p
		}, "listed twice"},
		{"unpaired frontend port", func() *v1alpha1.TendrilLocalRedirectPolicy {
			p := svcPolicy("kube-system", "x")
			p.Spec.RedirectFrontend.ServiceMatcher.ToPorts = []v1alpha1.LRPPort{{Name: "metrics", Protocol: "TCP"}}
			return p
		}, "no backend port"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.policy(), allowed)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse: %v, want an error with %q", err, c.want)
			}
		})
	}
	if _, err := Parse(svcPolicy("kube-system", "ok"), allowed); err != nil {
		t.Fatalf("a good policy refused: %v", err)
	}
	if _, err := Parse(addrPolicy("169.254.169.254", tcp80), allowed); err != nil {
		t.Fatalf("a good address policy refused: %v", err)
	}
	if _, err := Parse(addrPolicy("8.8.8.8", tcp80), Limits{AddressNamespaces: []string{"*"}}); err != nil {
		t.Fatalf("with no allowed ranges and any namespace, any unicast address: %v", err)
	}
	if _, err := Parse(addrPolicy("169.254.169.254", tcp80), Limits{}); err == nil {
		t.Fatal("with no namespace allowed, an addressMatcher was accepted")
	}
}

func pod(ns, name, ip string, lbls map[string]string, mut ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	for _, m := range mut {
		m(p)
	}
	return p
}

func newWriter(t *testing.T) *loadbalancer.Writer {
	t.Helper()
	tables, err := loadbalancer.NewTables(statedb.New())
	if err != nil {
		t.Fatal(err)
	}
	return loadbalancer.NewWriter(tables, "node-a")
}

func redirectOf(t *testing.T, w *loadbalancer.Writer, ns, name string) *loadbalancer.LocalRedirect {
	t.Helper()
	r, _, ok := w.Tables().Redirects.Get(w.Tables().DB.ReadTxn(), loadbalancer.RedirectByName.Query(loadbalancer.ServiceName{Namespace: ns, Name: name}))
	if !ok {
		return nil
	}
	return r
}

func podsOf(r *loadbalancer.LocalRedirect) []string {
	var out []string
	for _, b := range r.Backends {
		if b.Proto == loadbalancer.UDP {
			out = append(out, b.Pod)
		}
	}
	return out
}

// TestSourceSelectsLocalPodsOfItsNamespace: the backends are the running,
// ready pods of the policy's namespace its selector matches; a pod of
// another namespace with the same labels never is; a refused update
// removes what the policy had applied; the initializer waits for both
// kinds.
func TestSourceSelectsLocalPodsOfItsNamespace(t *testing.T) {
	w := newWriter(t)
	s := New(w, Limits{}, slog.New(slog.DiscardHandler))
	cache := map[string]string{"k8s-app": "node-local-dns"}
	s.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Upsert, Key: "kube-system/cache", Object: pod("kube-system", "cache", "10.0.0.7", cache)})
	s.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Upsert, Key: "tenant-a/fake", Object: pod("tenant-a", "fake", "10.0.0.66", cache)})
	s.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Upsert, Key: "kube-system/unready", Object: pod("kube-system", "unready", "10.0.0.8", cache,
		func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse })})
	s.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Upsert, Key: "kube-system/hostnet", Object: pod("kube-system", "hostnet", "192.168.1.1", cache,
		func(p *corev1.Pod) { p.Spec.HostNetwork = true })})
	s.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Synced})
	if init, _ := w.Tables().Frontends.Initialized(w.Tables().DB.ReadTxn()); init {
		t.Fatal("initialized before the policies synced")
	}
	s.OnPolicy(watchers.Event[*v1alpha1.TendrilLocalRedirectPolicy]{Kind: watchers.Upsert, Key: "kube-system/nodelocaldns", Object: svcPolicy("kube-system", "nodelocaldns")})
	s.OnPolicy(watchers.Event[*v1alpha1.TendrilLocalRedirectPolicy]{Kind: watchers.Synced})
	if init, _ := w.Tables().Frontends.Initialized(w.Tables().DB.ReadTxn()); !init {
		t.Fatal("not initialized after both kinds synced")
	}
	r := redirectOf(t, w, "kube-system", "nodelocaldns")
	if r == nil || len(r.Backends) != 2 || podsOf(r)[0] != "kube-system/cache" {
		t.Fatalf("backends %+v, want the cache pod on UDP and TCP 53", r)
	}

	// The cache pod goes: no backend left.
	s.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Delete, Key: "kube-system/cache", Object: pod("kube-system", "cache", "10.0.0.7", cache)})
	if r := redirectOf(t, w, "kube-system", "nodelocaldns"); r == nil || len(r.Backends) != 0 {
		t.Fatalf("after the pod's deletion: %+v", r)
	}

	// A tenant's policy naming kube-system's service is refused whole,
	// and a bad update of a good policy removes it.
	foreign := svcPolicy("tenant-a", "steal")
	foreign.Spec.RedirectFrontend.ServiceMatcher.Namespace = "kube-system"
	s.OnPolicy(watchers.Event[*v1alpha1.TendrilLocalRedirectPolicy]{Kind: watchers.Upsert, Key: "tenant-a/steal", Object: foreign})
	if r := redirectOf(t, w, "tenant-a", "steal"); r != nil {
		t.Fatalf("a cross-namespace policy reached the tables: %+v", r)
	}
	bad := svcPolicy("kube-system", "nodelocaldns")
	bad.Spec.RedirectBackend.ToPorts[0].Port = "99999"
	s.OnPolicy(watchers.Event[*v1alpha1.TendrilLocalRedirectPolicy]{Kind: watchers.Upsert, Key: "kube-system/nodelocaldns", Object: bad})
	if r := redirectOf(t, w, "kube-system", "nodelocaldns"); r != nil {
		t.Fatalf("a refused update left the policy applied: %+v", r)
	}
	rej := s.Rejected()
	if len(rej) != 2 || !strings.Contains(rej["kube-system/nodelocaldns"], "99999") || !strings.Contains(rej["tenant-a/steal"], "own namespace") {
		t.Fatalf("rejected: %v", rej)
	}
}

// TestSourceSkipRedirectFromBackend: the policy's flag reaches the
// redirect, and each backend carries its pod's network namespace cookie
// once the endpoint's is known (SetNetnsCookie), and loses it when it is
// forgotten.
func TestSourceSkipRedirectFromBackend(t *testing.T) {
	w := newWriter(t)
	s := New(w, Limits{}, slog.New(slog.DiscardHandler))
	cache := map[string]string{"k8s-app": "node-local-dns"}
	s.OnPod(watchers.Event[*corev1.Pod]{Kind: watchers.Upsert, Key: "kube-system/cache", Object: pod("kube-system", "cache", "10.0.0.7", cache)})
	p := svcPolicy("kube-system", "nodelocaldns")
	p.Spec.SkipRedirectFromBackend = true
	s.OnPolicy(watchers.Event[*v1alpha1.TendrilLocalRedirectPolicy]{Kind: watchers.Upsert, Key: "kube-system/nodelocaldns", Object: p})
	cookies := func() []uint64 {
		var out []uint64
		for _, b := range redirectOf(t, w, "kube-system", "nodelocaldns").Backends {
			out = append(out, b.NetnsCookie)
		}
		return out
	}
	if r := redirectOf(t, w, "kube-system", "nodelocaldns"); r == nil || !r.SkipFromBackend {
		t.Fatalf("the flag did not reach the redirect: %+v", r)
	}
	if got := cookies(); len(got) != 2 || got[0] != 0 || got[1] != 0 {
		t.Fatalf("cookies before the endpoint: %v, want none known", got)
	}
	s.SetNetnsCookie("kube-system/cache", 99)
	s.SetNetnsCookie("tenant-a/other", 5)
	if got := cookies(); len(got) != 2 || got[0] != 99 || got[1] != 99 {
		t.Fatalf("cookies: %v, want 99 on each backend", got)
	}
	s.SetNetnsCookie("kube-system/cache", 0)
	if got := cookies(); got[0] != 0 || got[1] != 0 {
		t.Fatalf("cookies after the endpoint went: %v", got)
	}
	p.Spec.SkipRedirectFromBackend = false
	s.OnPolicy(watchers.Event[*v1alpha1.TendrilLocalRedirectPolicy]{Kind: watchers.Upsert, Key: "kube-system/nodelocaldns", Object: p})
	if r := redirectOf(t, w, "kube-system", "nodelocaldns"); r.SkipFromBackend {
		t.Fatal("the flag stayed on")
	}
}
