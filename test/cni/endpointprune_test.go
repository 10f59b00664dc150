package cni_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedStaleEndpointPrunedAfterRestart: three pods, then the
// agent is killed and one pod's endpoint state removed (its pod and veth
// stay, but the agent cannot restore it). The restarted agent's endpoints
// table reconciler removes that endpoint's map entries and keeps its
// programs on the veth that still exists, so the pod is cut off (its
// programs find no endpoint: fail closed, never a pod veth without
// programs), and leaves the two restored endpoints' as they were: the same
// TCX links, their map entries, and traffic between them. `GET
// /v1/statedb/rows/endpoints` shows the two. Once the pod is gone (its
// namespace and veth deleted), the next agent's prune removes the
// programs too.
func TestPrivilegedStaleEndpointPrunedAfterRestart(t *testing.T) {
	testutil.Privileged(t)
	args := []string{"--ipv6-range", "none", "--ipv4-range", "10.233.0.0/24"}
	n := startNode(t, args...)
	list := n.confList("tendril-cni", "1.1.0", nil)
	a, b, c := n.newPod("a"), n.newPod("b"), n.newPod("c")
	ips := map[*pod]string{}
	for _, p := range []*pod{a, b, c} {
		ips[p] = n.mustAdd(list, p).IPs[0].Address.IP.String()
	}
	ids := map[*pod]uint16{}
	var cVeth string
	for _, e := range n.endpoints() {
		for p, ip := range ips {
			if e.Status.Networking.Addressing[0].IPV4 == ip {
				ids[p] = uint16(e.ID)
				if p == c {
					cVeth = e.Status.Networking.InterfaceName
				}
			}
		}
	}
	if len(ids) != 3 || cVeth == "" {
		t.Fatalf("endpoints of the three pods: %v (c's veth %q)", ids, cVeth)
	}
	mode := n.attachMode(t)
	n.checkAttachments(t, mode, 6)
	if !reachable(a, ips[b]) || !reachable(a, ips[c]) {
		t.Fatal("a cannot reach b and c before the restart")
	}
	kept := map[*pod][]string{a: n.attachmentsOf(t, ids[a]), b: n.attachmentsOf(t, ids[b])}

	n.killAgent(t)
	if err := os.RemoveAll(filepath.Join(n.dir, "state", "endpoints", fmt.Sprint(ids[c]))); err != nil {
		t.Fatal(err)
	}
	// Before the new agent: c is attached, with its map entries.
	cAttached := n.attachmentsOf(t, ids[c])
	if len(cAttached) != 2 {
		t.Fatalf("endpoint %d (pod c) has attachments %v before the restart, want 2", ids[c], cAttached)
	}
	if !n.inEndpointMap(t, ids[c], ips[c]) {
		t.Fatalf("endpoint %d (pod c) is not in the endpoint map before the restart", ids[c])
	}
	n.runAgent(t, args...)

	eventually(t, fmt.Sprintf("the map entries of endpoint %d (pod c, not restored) pruned", ids[c]), func() bool {
		return !n.inEndpointMap(t, ids[c], ips[c])
	})
	if got := n.attachmentsOf(t, ids[c]); strings.Join(got, " ") != strings.Join(cAttached, " ") {
		t.Errorf("endpoint %d (pod c, veth alive): attachments %v after the restart, want its programs kept: %v", ids[c], got, cAttached)
	}
	if reachable(a, ips[c]) || reachable(c, ips[a]) {
		t.Error("pod c, whose endpoint was not restored, still has traffic: its programs should drop it")
	}
	for _, p := range []*pod{a, b} {
		if got := n.attachmentsOf(t, ids[p]); strings.Join(got, " ") != strings.Join(kept[p], " ") {
			t.Errorf("restored endpoint %d (pod %s): attachments %v after the restart, had %v", ids[p], p.name, got, kept[p])
		}
		if !n.inEndpointMap(t, ids[p], ips[p]) {
			t.Errorf("restored endpoint %d (pod %s) is not in the endpoint map after the restart", ids[p], p.name)
		}
	}
	if !reachable(a, ips[b]) || !reachable(b, ips[a]) {
		t.Error("the restored pods cannot reach each other after the restart")
	}
	var rows struct {
		Header []string   `json:"header"`
		Rows   [][]string `json:"rows"`
	}
	if err := n.agent.Do(context.Background(), "GET", "/statedb/rows/endpoints", nil, nil, nil, &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows.Rows) != 2 {
		t.Fatalf("the endpoints table after the restart: %v %v", rows.Header, rows.Rows)
	}
	for _, r := range rows.Rows {
		if r[0] != fmt.Sprint(ids[a]) && r[0] != fmt.Sprint(ids[b]) || r[len(r)-1] == "" || !strings.HasPrefix(r[len(r)-1], "Done") {
			t.Errorf("row of the endpoints table: %v (header %v)", r, rows.Header)
		}
	}

	// The pod goes (its namespace, with it the veth pair); the next
	// agent's prune removes the programs that were left to cut it off.
	if out, err := exec.Command("ip", "netns", "del", filepath.Base(c.netns)).CombinedOutput(); err != nil {
		t.Fatalf("delete pod c's namespace: %v: %s", err, out)
	}
	eventually(t, "pod c's host veth "+cVeth+" gone with its namespace", func() bool {
		_, err := n.nl.LinkByName(cVeth)
		return err != nil
	})
	n.killAgent(t)
	n.runAgent(t, args...)
	eventually(t, fmt.Sprintf("the programs of endpoint %d (pod c, its veth gone) pruned", ids[c]), func() bool {
		return len(n.attachmentsOf(t, ids[c])) == 0 && !n.pinnedLinkOf(t, ids[c])
	})
	if !reachable(a, ips[b]) {
		t.Error("the restored pods cannot reach each other after the second restart")
	}
}

// pinnedLinkOf reports whether a TCX link pin of endpoint id is left
// (attachmentsOf lists only pins whose link loads; a link whose interface
// went still loads, so this is the same check, by file).
func (n *node) pinnedLinkOf(t *testing.T, id uint16) bool {
	t.Helper()
	for _, dir := range []string{"ingress", "egress"} {
		if _, err := os.Stat(filepath.Join(n.bpfRoot, "links", fmt.Sprintf("ep%d-%s", id, dir))); err == nil {
			return true
		}
	}
	return false
}

// attachmentsOf describes endpoint id's attachments: each pinned TCX link
// with its kernel link ID (the same ID after a restart means the link was
// kept, its program swapped in place), each tc filter of the endpoint
// with its interface.
func (n *node) attachmentsOf(t *testing.T, id uint16) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{"ingress", "egress"} {
		name := fmt.Sprintf("ep%d-%s", id, dir)
		lk, err := link.LoadPinnedLink(filepath.Join(n.bpfRoot, "links", name), nil)
		if err == nil {
			info, err := lk.Info()
			lk.Close()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s=link%d", name, info.ID))
		} else if !os.IsNotExist(err) && !strings.Contains(err.Error(), "no such file") {
			t.Fatal(err)
		}
	}
	links, err := n.nl.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := n.nl.FilterList(l, parent)
			if err != nil {
				continue
			}
			for _, f := range fs {
				bf, ok := f.(*netlink.BpfFilter)
				if ok && (bf.Name == fmt.Sprintf("tendril:ep%d-ingress", id) || bf.Name == fmt.Sprintf("tendril:ep%d-egress", id)) {
					out = append(out, fmt.Sprintf("%s@%s", bf.Name, l.Attrs().Name))
				}
			}
		}
	}
	return out
}

// inEndpointMap reports whether the pinned endpoint map has an interface
// entry of endpoint id or an entry of its address.
func (n *node) inEndpointMap(t *testing.T, id uint16, ip string) bool {
	t.Helper()
	m, err := maps.OpenPinned(n.bpfRoot, true)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	eps, err := m.EndpointMap().List()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range eps {
		if e.ID == id {
			return true
		}
	}
	e, ok, err := m.EndpointMap().LookupAddr(netip.MustParseAddr(ip))
	if err != nil {
		t.Fatal(err)
	}
	return ok && e.ID == id
}
