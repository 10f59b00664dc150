package cni_test

import (
	"context"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedTwoAttachmentsOneContainer: a container with two
// interfaces (eth0 and net1) has two endpoints; DEL of one attachment
// leaves the other endpoint, its address and its veth.
func TestPrivilegedTwoAttachmentsOneContainer(t *testing.T) {
	testutil.Privileged(t)
	n := startNode(t, "--ipv6-range", "none")
	list := n.confList("tendril-cni", "1.1.0", nil)
	p := n.newPod("multi")
	r0 := n.mustAdd(list, p)
	second := *p
	rt := *p.rt
	rt.IfName = "net1"
	second.rt = &rt
	r1 := n.mustAdd(list, &second)
	if r0.IPs[0].Address.IP.Equal(r1.IPs[0].Address.IP) {
		t.Fatalf("both attachments got %s", r0.IPs[0].Address.IP)
	}
	// The second attachment gets addresses but not the default route.
	if len(r1.Routes) != 0 {
		t.Errorf("net1's result has routes %v, want none (eth0 has the default route)", r1.Routes)
	}
	if out, err := inNetns(p.netns, "ip", "-4", "route", "show", "default"); err != nil || !strings.Contains(string(out), "dev eth0") || strings.Contains(string(out), "net1") {
		t.Errorf("default route after net1's ADD: %q (%v), want only the one via eth0", out, err)
	}
	if err := n.check(list, &second); err != nil {
		t.Errorf("CHECK net1: %v", err)
	}
	ctx := context.Background()
	eps, err := n.agent.EndpointList(ctx)
	if err != nil || len(eps) != 2 {
		t.Fatalf("endpoints %d (%v), want 2", len(eps), err)
	}
	if err := n.del(list, &second); err != nil {
		t.Fatal(err)
	}
	eps, err = n.agent.EndpointList(ctx)
	if err != nil || len(eps) != 1 {
		t.Fatalf("after DEL of net1: %d endpoints (%v), want 1", len(eps), err)
	}
	if got := eps[0].Status.ExternalIdentifiers.CniAttachmentID; got != p.rt.ContainerID+":eth0" {
		t.Fatalf("the remaining endpoint is %s, want the eth0 attachment", got)
	}
	// eth0's endpoint keeps its address, its host veth and the pod's
	// default route: net1, the second attachment, never took it.
	if got := eps[0].Status.Networking.Addressing[0].IPV4; got != r0.IPs[0].Address.IP.String() {
		t.Fatalf("remaining endpoint has %s, want %s", got, r0.IPs[0].Address.IP)
	}
	if _, err := n.nl.LinkByName(eps[0].Status.Networking.InterfaceName); err != nil {
		t.Fatalf("eth0's host veth %s: %v", eps[0].Status.Networking.InterfaceName, err)
	}
	if out, err := inNetns(p.netns, "ip", "-4", "route", "show", "default"); err != nil || !strings.Contains(string(out), "dev eth0") {
		t.Errorf("default route after net1's DEL: %q (%v), want one via eth0", out, err)
	}
	if err := ping(p, r0.IPs[0].Gateway.String()); err != nil {
		t.Errorf("pod cannot reach its router through eth0 after net1's DEL: %v", err)
	}
	if err := n.del(list, p); err != nil {
		t.Fatal(err)
	}
	if eps, _ := n.agent.EndpointList(ctx); len(eps) != 0 {
		t.Fatalf("%d endpoints after both DELs", len(eps))
	}
}
