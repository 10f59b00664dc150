package lbipam

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/operator/operatortest"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var env k8senv.Package

func TestMain(m *testing.M) {
	os.Exit(env.Main(m, k8senv.Options{}, operatortest.InstallCRDs))
}

// TestLBIPAM runs the IPAM's term loop against a real API server: pools
// with selectors, a disabled pool, requested addresses, another
// loadBalancerClass, exhaustion (Service condition and Event, pool
// condition), a new term of a new IPAM (as after an operator restart)
// keeping every assignment, release on delete and on a type change, and
// never one address on two Services.
func TestLBIPAM(t *testing.T) {
	e := env.Need(t)
	c, err := k8s.NewClientsForConfig(e.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, start, stop, err := resources.Build(c)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	first, err := New(DefaultConfig(), operatortest.Quiet(), c, res)
	if err != nil {
		t.Fatal(err)
	}
	if err := start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	pools := c.Tendril.TendrilV1alpha1().TendrilLoadBalancerIPPools()
	mkPool := func(name string, spec v1alpha1.LoadBalancerIPPoolSpec) {
		t.Helper()
		if _, err := pools.Create(ctx, &v1alpha1.TendrilLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tier := func(v string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"tier": v}}
	}
	// web: a /30, so .1 and .2 (network and broadcast left out).
	mkPool("web", v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{CIDR: "10.50.0.0/30"}}, ServiceSelector: tier("web")})
	mkPool("db", v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{Start: "10.60.0.10", Stop: "10.60.0.11"}}, ServiceSelector: tier("db")})
	mkPool("six", v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{CIDR: "fd00:60::/127"}}, ServiceSelector: tier("six")})
	mkPool("off", v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{CIDR: "10.70.0.0/24"}}, Disabled: true})
	mkPool("broken", v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{Start: "10.80.0.9", Stop: "10.80.0.1"}}, ServiceSelector: tier("none")})
	// The schema refuses a block that is both a CIDR and a range.
	_, err = pools.Create(ctx, &v1alpha1.TendrilLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: "both"},
		Spec: v1alpha1.LoadBalancerIPPoolSpec{Blocks: []v1alpha1.LoadBalancerIPBlock{{CIDR: "10.90.0.0/24", Start: "10.90.0.1", Stop: "10.90.0.2"}}}}, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "either cidr, or start and stop") {
		t.Fatalf("a block with cidr and start/stop: %v", err)
	}

	svcs := c.Core.CoreV1().Services("default")
	mkSvc := func(name, tierLabel string, mod func(*corev1.Service)) {
		t.Helper()
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"tier": tierLabel}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
		if mod != nil {
			mod(s)
		}
		if _, err := svcs.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// A second apart: the older Service is the one that keeps a
		// contested address (creation timestamps have one-second precision).
		time.Sleep(1100 * time.Millisecond)
	}

	term := func(a *IPAM) context.CancelFunc {
		tctx, tcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = a.Job(nil).Run(tctx)
		}()
		return func() { tcancel(); <-done }
	}
	end := term(first)

	mkSvc("web1", "web", nil)
	mkSvc("fixed", "web", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "10.50.0.2" })
	mkSvc("db1", "db", nil)
	mkSvc("other", "web", func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptr.To("example.com/other") })
	mkSvc("none", "none", nil)
	mkSvc("web2", "web", nil)
	mkSvc("dup", "db", func(s *corev1.Service) { s.Annotations = map[string]string{AnnotationIPs: "10.60.0.10"} })
	mkSvc("bad", "db", func(s *corev1.Service) { s.Annotations = map[string]string{AnnotationIPs: "10.60.0.x"} })
	// An IPv6 address asked for by a (single-stack IPv4) Service; one
	// asking for nothing wants IPv4, which the IPv6-only pool lacks.
	mkSvc("v6", "six", func(s *corev1.Service) { s.Annotations = map[string]string{AnnotationIPs: "fd00:60::1"} })
	mkSvc("v6b", "six", nil)

	expect(t, c, map[string]want{
		"web1":  {ips: "10.50.0.1", status: metav1.ConditionTrue, reason: ReasonSatisfied},
		"fixed": {ips: "10.50.0.2", status: metav1.ConditionTrue, reason: ReasonSatisfied},
		"db1":   {ips: "10.60.0.10", status: metav1.ConditionTrue, reason: ReasonSatisfied},
		"other": {},
		"none":  {status: metav1.ConditionFalse, reason: ReasonNoPool},
		"web2":  {status: metav1.ConditionFalse, reason: ReasonPoolExhausted},
		"dup":   {status: metav1.ConditionFalse, reason: ReasonRequestedUnavailable, message: "in use by Service default/db1"},
		"bad":   {status: metav1.ConditionFalse, reason: ReasonInvalidRequest},
		"v6":    {ips: "fd00:60::1", status: metav1.ConditionTrue, reason: ReasonSatisfied},
		"v6b":   {status: metav1.ConditionFalse, reason: ReasonNoPool, message: "no matching pool has IPv4 addresses"},
	})
	expectPool(t, c, "six", metav1.ConditionFalse, "1 of 2 addresses used")
	expectPool(t, c, "web", metav1.ConditionTrue, "2 of 2 addresses used; 1 Services waiting for an address")
	expectPool(t, c, "db", metav1.ConditionFalse, "1 of 2 addresses used")
	operatortest.WaitFor(t, "the broken pool's Valid=False", 30*time.Second, func() bool {
		p, err := pools.Get(ctx, "broken", metav1.GetOptions{})
		cond := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.PoolConditionValid)
		return err == nil && cond != nil && cond.Status == metav1.ConditionFalse && strings.Contains(cond.Message, "before start")
	})
	for _, ev := range []struct{ object, reason string }{{"web2", ReasonPoolExhausted}, {"none", ReasonNoPool}, {"dup", ReasonRequestedUnavailable}, {"web", "PoolExhausted"}} {
		operatortest.WaitFor(t, "a Warning Event "+ev.reason+" on "+ev.object, 30*time.Second, func() bool {
			evs, err := c.Core.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + ev.object + ",reason=" + ev.reason})
			return err == nil && len(evs.Items) > 0 && evs.Items[0].Type == corev1.EventTypeWarning
		})
	}

	// A new term of a new IPAM (an operator restarted, or another replica
	// leading): it reads the assignments back from the Services' status
	// and moves nothing.
	before := addresses(t, c)
	end()
	second, err := New(DefaultConfig(), operatortest.Quiet(), c, res)
	if err != nil {
		t.Fatal(err)
	}
	end = term(second)
	defer func() { end() }()
	mkSvc("db2", "db", nil)
	expect(t, c, map[string]want{"db2": {ips: "10.60.0.11", status: metav1.ConditionTrue, reason: ReasonSatisfied}})
	after := addresses(t, c)
	delete(after, "default/db2")
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("the new term moved addresses: before %v, after %v", before, after)
	}

	// Release on delete: web1's address goes to the waiting web2.
	if err := svcs.Delete(ctx, "web1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, c, map[string]want{"web2": {ips: "10.50.0.1", status: metav1.ConditionTrue, reason: ReasonSatisfied}})
	expectPool(t, c, "web", metav1.ConditionTrue, "2 of 2 addresses used")

	// Release on a type change: fixed becomes a ClusterIP Service.
	cur, err := svcs.Get(ctx, "fixed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Type, cur.Spec.LoadBalancerIP, cur.Spec.AllocateLoadBalancerNodePorts = corev1.ServiceTypeClusterIP, "", nil
	for i := range cur.Spec.Ports {
		cur.Spec.Ports[i].NodePort = 0
	}
	cur.Spec.ExternalTrafficPolicy = ""
	if _, err := svcs.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, c, map[string]want{"fixed": {}})
	expectPool(t, c, "web", metav1.ConditionFalse, "1 of 2 addresses used")
	mkSvc("web3", "web", nil)
	expect(t, c, map[string]want{"web3": {ips: "10.50.0.2", status: metav1.ConditionTrue, reason: ReasonSatisfied}})
}

type want struct {
	ips             string
	status          metav1.ConditionStatus
	reason, message string
}

// expect waits until each named Service (namespace default) has the
// addresses and condition wanted (no condition when status is ""), and
// checks on every look that no address is on two Services.
func expect(t *testing.T, c *k8s.Clients, wants map[string]want) {
	t.Helper()
	var last string
	deadline := time.Now().Add(30 * time.Second)
	for {
		addresses(t, c)
		bad := []string{}
		for name, w := range wants {
			s, err := c.Core.CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var ips []string
			for _, in := range s.Status.LoadBalancer.Ingress {
				ips = append(ips, in.IP)
			}
			cond := meta.FindStatusCondition(s.Status.Conditions, ConditionRequestSatisfied)
			ok := strings.Join(ips, ",") == w.ips
			if w.status == "" {
				ok = ok && cond == nil
			} else {
				ok = ok && cond != nil && cond.Status == w.status && cond.Reason == w.reason && strings.Contains(cond.Message, w.message)
			}
			if !ok {
				bad = append(bad, fmt.Sprintf("%s: addresses %v condition %+v, want %+v", name, ips, cond, w))
			}
		}
		if len(bad) == 0 {
			return
		}
		last = strings.Join(bad, "\n")
		if time.Now().After(deadline) {
			t.Fatalf("Services not as wanted:\n%s", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// expectPool waits for the pool's Exhausted condition.
func expectPool(t *testing.T, c *k8s.Clients, name string, status metav1.ConditionStatus, message string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := c.Tendril.TendrilV1alpha1().TendrilLoadBalancerIPPools().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cond := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.PoolConditionExhausted)
		if cond != nil && cond.Status == status && cond.Message == message {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: Exhausted %+v, want %s %q", name, cond, status, message)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// addresses maps every Service to its ingress addresses, failing the test
// when one address is on two Services.
func addresses(t *testing.T, c *k8s.Clients) map[string][]string {
	t.Helper()
	list, err := c.Core.CoreV1().Services("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	owner := map[string]string{}
	for _, s := range list.Items {
		key := s.Namespace + "/" + s.Name
		for _, in := range s.Status.LoadBalancer.Ingress {
			if o, ok := owner[in.IP]; ok {
				t.Fatalf("address %s on two Services: %s and %s", in.IP, o, key)
			}
			owner[in.IP] = key
			out[key] = append(out[key], in.IP)
		}
	}
	return out
}

func TestParseBlocks(t *testing.T) {
	for _, tc := range []struct {
		blocks []v1alpha1.LoadBalancerIPBlock
		want   string
		size   string
	}{
		{[]v1alpha1.LoadBalancerIPBlock{{CIDR: "10.0.0.0/30"}}, "[{10.0.0.1 10.0.0.2}]", "2"},
		{[]v1alpha1.LoadBalancerIPBlock{{CIDR: "10.0.0.5/32"}}, "[{10.0.0.5 10.0.0.5}]", "1"},
		{[]v1alpha1.LoadBalancerIPBlock{{CIDR: "10.0.0.4/31"}}, "[{10.0.0.4 10.0.0.5}]", "2"},
		{[]v1alpha1.LoadBalancerIPBlock{{CIDR: "fd00::/120"}}, "[{fd00:: fd00::ff}]", "256"},
		{[]v1alpha1.LoadBalancerIPBlock{{Start: "10.1.0.250", Stop: "10.1.1.4"}}, "[{10.1.0.250 10.1.1.4}]", "11"},
		{[]v1alpha1.LoadBalancerIPBlock{{CIDR: "fd00::/64"}}, "[{fd00:: fd00::ffff:ffff:ffff:ffff}]", "18446744073709551616"},
	} {
		r, err := parseBlocks(tc.blocks)
		if err != nil {
			t.Fatalf("%v: %v", tc.blocks, err)
		}
		if got := fmt.Sprint(r); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.blocks, got, tc.want)
		}
		if got := r[0].size().String(); got != tc.size {
			t.Errorf("%v: size %s, want %s", tc.blocks, got, tc.size)
		}
	}
	for _, bad := range [][]v1alpha1.LoadBalancerIPBlock{
		nil,
		{{CIDR: "10.0.0.0/33"}},
		{{Start: "10.0.0.2", Stop: "10.0.0.1"}},
		{{Start: "10.0.0.1", Stop: "fd00::1"}},
		{{CIDR: "10.0.0.0/24", Start: "10.0.0.1", Stop: "10.0.0.2"}},
		{{Start: "10.0.0.1"}},
	} {
		if _, err := parseBlocks(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestRequested(t *testing.T) {
	svc := &corev1.Service{}
	svc.Spec.LoadBalancerIP = "10.0.0.1"
	if r, err := requested(svc); err != nil || fmt.Sprint(r) != "[10.0.0.1]" {
		t.Fatalf("loadBalancerIP: %v %v", r, err)
	}
	svc.Annotations = map[string]string{AnnotationIPs: "10.0.0.2, fd00::2"}
	if r, err := requested(svc); err != nil || fmt.Sprint(r) != "[10.0.0.2 fd00::2]" {
		t.Fatalf("annotation wins: %v %v", r, err)
	}
	if got := families(svc, []netip.Addr{netip.MustParseAddr("fd00::2")}); !slices.Equal(got, []bool{false}) {
		t.Fatalf("families of a requested IPv6 address: %v", got)
	}
	svc.Annotations[AnnotationIPs] = "10.0.0.2,10.0.0.3"
	if _, err := requested(svc); err == nil {
		t.Fatal("two IPv4 addresses accepted")
	}
	if !Managed(&corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(LoadBalancerClass)}}) ||
		Managed(&corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To("x.io/y")}}) ||
		Managed(&corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort}}) {
		t.Fatal("Managed")
	}
}
