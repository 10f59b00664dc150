package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/k8s/crdinstall"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var controlPlane k8senv.Package

func TestMain(m *testing.M) { os.Exit(controlPlane.Main(m, k8senv.Options{}, nil)) }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestSelectPodCIDRsPrecedence(t *testing.T) {
	auto4, auto6 := netip.MustParsePrefix("10.128.5.0/24"), netip.MustParsePrefix("fd00:7464::5:0/112")
	node := func(spec []string, ann map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: ann}, Spec: corev1.NodeSpec{PodCIDRs: spec}}
	}
	ann := map[string]string{AnnotationIPv4PodCIDR: "10.9.0.0/24", AnnotationIPv6PodCIDR: "fd09::/112"}
	cases := []struct {
		name       string
		node       *corev1.Node
		v4, v6     string // flags
		want4      string
		want6      string
		from4      CIDRSource
		from6      CIDRSource
		wantErrSub string
	}{
		{"spec wins over everything", node([]string{"10.244.1.0/24", "fd44::/112"}, ann), "10.1.0.0/24", "fd01::/112", "10.244.1.0/24", "fd44::/112", SourceNodeSpec, SourceNodeSpec, ""},
		{"spec for one family, annotation for the other", node([]string{"10.244.1.0/24"}, ann), "auto", "auto", "10.244.1.0/24", "fd09::/112", SourceNodeSpec, SourceAnnotation, ""},
		{"annotation over flag", node(nil, ann), "10.1.0.0/24", "fd01::/112", "10.9.0.0/24", "fd09::/112", SourceAnnotation, SourceAnnotation, ""},
		{"flag over auto", node(nil, nil), "10.1.0.0/24", "fd01::/112", "10.1.0.0/24", "fd01::/112", SourceFlag, SourceFlag, ""},
		{"auto", node(nil, nil), "auto", "auto", auto4.String(), auto6.String(), SourceAuto, SourceAuto, ""},
		{"flag none disables a family", node(nil, nil), "auto", "none", auto4.String(), "invalid Prefix", SourceAuto, SourceNone, ""},
		{"spec beats flag none", node([]string{"fd44::/112"}, nil), "auto", "none", auto4.String(), "fd44::/112", SourceAuto, SourceNodeSpec, ""},
		{"legacy spec.podCIDR", &corev1.Node{Spec: corev1.NodeSpec{PodCIDR: "10.244.7.0/24"}}, "auto", "auto", "10.244.7.0/24", auto6.String(), SourceNodeSpec, SourceAuto, ""},
		{"host bits masked", node([]string{"10.244.1.5/24"}, nil), "auto", "none", "10.244.1.0/24", "invalid Prefix", SourceNodeSpec, SourceNone, ""},
		{"no node (standalone)", nil, "10.1.0.0/24", "none", "10.1.0.0/24", "invalid Prefix", SourceFlag, SourceNone, ""},
		{"bad spec", node([]string{"10.244.1.0/33"}, nil), "auto", "auto", "", "", "", "", "spec.podCIDRs"},
		{"bad annotation", node(nil, map[string]string{AnnotationIPv4PodCIDR: "nope"}), "auto", "auto", "", "", "", "", AnnotationIPv4PodCIDR},
		{"annotation of the wrong family", node(nil, map[string]string{AnnotationIPv6PodCIDR: "10.0.0.0/24"}), "auto", "auto", "", "", "", "", "wrong address family"},
		{"bad flag", node(nil, nil), "10.0.0.0", "auto", "", "", "", "", "ipv4-range"},
		{"nothing at all", node(nil, nil), "none", "none", "", "", "", "", "no pod CIDR"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sel, err := SelectPodCIDRs(tc.node, Ranges{IPv4: tc.v4, IPv6: tc.v6, AutoIPv4: auto4, AutoIPv6: auto6})
			if tc.wantErrSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrSub) {
					t.Fatalf("error %v, want one naming %q", err, tc.wantErrSub)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sel.IPv4.String() != tc.want4 || sel.IPv6.String() != tc.want6 || sel.IPv4From != tc.from4 || sel.IPv6From != tc.from6 {
				t.Fatalf("got %s (%s) %s (%s), want %s (%s) %s (%s)", sel.IPv4, sel.IPv4From, sel.IPv6, sel.IPv6From,
					tc.want4, tc.from4, tc.want6, tc.from6)
			}
		})
	}
}

func clients(t *testing.T) *k8s.Clients {
	t.Helper()
	env := controlPlane.Need(t)
	c, err := k8s.NewClientsForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestWaitForNodeRetriesUntilRegistered: the agent may start before the
// Node exists; WaitForNode keeps retrying and returns it once created.
func TestWaitForNodeRetriesUntilRegistered(t *testing.T) {
	c := clients(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		n, err := WaitForNode(ctx, c.Core, "late-node", quiet())
		if err == nil && n.Name != "late-node" {
			err = fmt.Errorf("got node %s", n.Name)
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("returned before the node existed: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if _, err := c.Core.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "late-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	// A cancelled wait says which node it waited for.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := WaitForNode(short, c.Core, "never", quiet()); err == nil || !strings.Contains(err.Error(), "never") {
		t.Fatalf("error %v, want one naming the node", err)
	}
}

// TestWriteBackRetriesThroughAPIServerRestart starts the write-back while
// the API server is down; it keeps retrying and lands once the server is
// back: annotations on the Node and a TendrilNode with addresses and CIDRs.
func TestWriteBackRetriesThroughAPIServerRestart(t *testing.T) {
	c := clients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := crdinstall.Install(ctx, c.Dynamic, quiet()); err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "wb-node",
		Annotations: map[string]string{AnnotationIPv6PodCIDR: "fd00:stale::/112", AnnotationIPv6Router: "fd00:stale::1"}}}
	n, err := c.Core.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}, {Type: corev1.NodeHostName, Address: "wb-node"}}
	if n, err = c.Core.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	local := Local{
		Name:       "wb-node",
		Selection:  Selection{IPv4: netip.MustParsePrefix("10.244.3.0/24"), IPv4From: SourceFlag, IPv6From: SourceNone},
		RouterIPv4: netip.MustParseAddr("10.244.3.1"),
		Addresses:  AddressesOf(n),
	}
	w := NewWriter(c.Core, c.Tendril, 200*time.Millisecond, quiet())
	done := make(chan error, 1)
	if err := controlPlane.Need(t).RestartAPIServer(ctx, func() {
		go func() { done <- w.Run(ctx, local) }()
		// Let it fail a few times against the stopped server.
		deadline := time.Now().Add(30 * time.Second)
		for w.Status().Attempts < 3 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := w.Status()
	if !st.Done || st.Attempts < 4 {
		t.Fatalf("status %+v: want done after at least 3 failed attempts", st)
	}
	got, err := c.Core.CoreV1().Nodes().Get(ctx, "wb-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations[AnnotationIPv4PodCIDR] != "10.244.3.0/24" || got.Annotations[AnnotationIPv4Router] != "10.244.3.1" {
		t.Fatalf("annotations %v", got.Annotations)
	}
	if _, stale := got.Annotations[AnnotationIPv6PodCIDR]; stale {
		t.Fatalf("stale IPv6 annotation kept: %v", got.Annotations)
	}
	tn, err := c.Tendril.TendrilV1alpha1().TendrilNodes().Get(ctx, "wb-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []v1alpha1.NodeAddress{{Type: "InternalIP", IP: "192.0.2.10"}, {Type: "TendrilInternalIP", IP: "10.244.3.1"}}
	if fmt.Sprint(tn.Spec.Addresses) != fmt.Sprint(want) || fmt.Sprint(tn.Spec.IPAM.PodCIDRs) != "[10.244.3.0/24]" {
		t.Fatalf("TendrilNode spec %+v", tn.Spec)
	}

	// A second run (agent restart with a new CIDR, its health endpoint
	// up) updates the object; the CRD takes the health address's type.
	local.Selection.IPv4 = netip.MustParsePrefix("10.244.4.0/24")
	local.HealthIPv4 = netip.MustParseAddr("10.244.4.7")
	if err := w.Run(ctx, local); err != nil {
		t.Fatal(err)
	}
	tn, err = c.Tendril.TendrilV1alpha1().TendrilNodes().Get(ctx, "wb-node", metav1.GetOptions{})
	if err != nil || fmt.Sprint(tn.Spec.IPAM.PodCIDRs) != "[10.244.4.0/24]" {
		t.Fatalf("after update: %v %+v", err, tn)
	}
	if last := tn.Spec.Addresses[len(tn.Spec.Addresses)-1]; last != (v1alpha1.NodeAddress{Type: v1alpha1.NodeAddressHealthIP, IP: "10.244.4.7"}) {
		t.Fatalf("TendrilNode addresses %+v, want the health endpoint's last", tn.Spec.Addresses)
	}
}
