package cni_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedRemovedProgramsPutBack: in either attach mode, with the
// attachment check every second, programs someone else takes off a pod's
// veth (tc: its egress filter deleted; TCX: its ingress link detached
// with BPF_LINK_DETACH, as `bpftool link detach` does) are attached again
// by the agent with no regeneration, and the other pod's are left alone.
func TestPrivilegedRemovedProgramsPutBack(t *testing.T) {
	testutil.Privileged(t)
	for _, mode := range []string{"tc", "tcx"} {
		t.Run(mode, func(t *testing.T) {
			n := startNode(t, "--ipv6-range", "none", "--datapath-attach-mode="+mode, "--datapath-defer-tcx=false",
				"--datapath-attachment-check-interval=1s")
			list := n.confList("tendril-cni", "1.1.0", nil)
			a, b := n.newPod("a"), n.newPod("b")
			ipA := n.mustAdd(list, a).IPs[0].Address.IP.String()
			n.mustAdd(list, b)
			n.checkAttachments(t, mode, 4)
			var id uint16
			var veth string
			for _, e := range n.endpoints() {
				if e.Status.Networking.Addressing[0].IPV4 == ipA {
					id, veth = uint16(e.ID), e.Status.Networking.InterfaceName
				}
			}
			if id == 0 {
				t.Fatalf("no endpoint of pod a (%s)", ipA)
			}
			var otherBefore []string
			for _, e := range n.endpoints() {
				if uint16(e.ID) != id {
					otherBefore = n.attachmentsOf(t, uint16(e.ID))
				}
			}
			before := n.attachmentsOf(t, id)
			switch mode {
			case "tc":
				lk, err := n.nl.LinkByName(veth)
				if err != nil {
					t.Fatal(err)
				}
				err = n.nl.FilterDel(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{
					LinkIndex: lk.Attrs().Index, Parent: netlink.HANDLE_MIN_EGRESS, Handle: 1, Priority: 1, Protocol: unix.ETH_P_ALL}})
				if err != nil {
					t.Fatalf("delete pod a's egress filter: %v", err)
				}
			case "tcx":
				lk, err := link.LoadPinnedLink(filepath.Join(n.bpfRoot, "links", fmt.Sprintf("ep%d-ingress", id)), nil)
				if err != nil {
					t.Fatal(err)
				}
				err = lk.Detach()
				lk.Close()
				if err != nil {
					t.Fatalf("detach pod a's ingress link: %v", err)
				}
			}
			removed := n.attachmentsOf(t, id)
			t.Logf("pod a (endpoint %d) before: %v; after the removal: %v", id, before, removed)
			eventually(t, "pod a's programs attached again", func() bool {
				now := n.attachmentsOf(t, id)
				if len(now) != 2 {
					return false
				}
				if mode == "tc" {
					return slices.Equal(now, before)
				}
				// A new ingress link (a new kernel ID), the egress one kept.
				return now[0] != before[0] && now[1] == before[1] && linkAttached(t, n.bpfRoot, fmt.Sprintf("ep%d-ingress", id))
			})
			n.checkAttachments(t, mode, 4)
			var otherAfter []string
			for _, e := range n.endpoints() {
				if uint16(e.ID) != id {
					otherAfter = n.attachmentsOf(t, uint16(e.ID))
				}
			}
			if strings.Join(otherAfter, " ") != strings.Join(otherBefore, " ") {
				t.Errorf("pod b's attachments changed: %v, were %v", otherAfter, otherBefore)
			}
			if !reachable(b, ipA) {
				t.Error("b cannot reach a after a's programs came back")
			}
			// Counted once the check's Update returns, just after the kernel
			// holds the programs again.
			eventually(t, "tendril_endpoint_programs_reattached_total to count the check", func() bool {
				return n.metric(t, "tendril_endpoint_programs_reattached_total") == 1
			})
		})
	}
}

// linkAttached reports whether the pinned TCX link is attached to an
// interface (a detached link reports none).
func linkAttached(t *testing.T, bpfRoot, name string) bool {
	t.Helper()
	lk, err := link.LoadPinnedLink(filepath.Join(bpfRoot, "links", name), nil)
	if err != nil {
		return false
	}
	defer lk.Close()
	info, err := lk.Info()
	if err != nil || info.TCX() == nil {
		return false
	}
	return info.TCX().Ifindex != 0
}

// metric reads one of the agent's metrics over its API socket (GET
// /v1/metrics/, as `tendril metrics list`); -1 when it is not there.
func (n *node) metric(t *testing.T, name string) float64 {
	t.Helper()
	var list []*models.Metric
	if err := n.agent.Do(context.Background(), "GET", "/metrics/", nil, nil, nil, &list); err != nil {
		t.Fatal(err)
	}
	for _, m := range list {
		if m.Name == name {
			return m.Value
		}
	}
	return -1
}
