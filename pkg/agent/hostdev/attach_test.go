package hostdev

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
)

// TestPrivilegedHostDeviceAttachModes: the host programs attach to an
// uplink with pinned TCX links; a second run (the agent restarted) takes
// both links over with its programs; a run in tc mode puts tc filters in
// Tendril's slot and removes the links; a run in TCX mode again moves back
// and removes the filters; a run that no longer configures a device removes
// a tc-mode run's filters from it; detaching leaves nothing. In each mode,
// programs someone else removes (a deleted filter, a detached link) are
// attached again by Check.
func TestPrivilegedHostDeviceAttachModes(t *testing.T) {
	n := newMasqNode(t, 61000, 61999)
	root := n.h.opts.BPFRoot
	run := func(mode loader.AttachMode) *Programs {
		t.Helper()
		p, err := Load(Options{BPFRoot: root, AttachMode: mode, PortMin: 61000, PortMax: 61999, Maps: n.l.MapReplacements()}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Attach(n.uplink); err != nil {
			p.Close()
			t.Fatal(err)
		}
		return p
	}
	pins := func() int {
		t.Helper()
		c := 0
		entries, _ := os.ReadDir(linksDir(root))
		for _, e := range entries {
			if _, _, ok := parseAttachmentName(e.Name()); ok {
				c++
			}
		}
		return c
	}
	filters := func() int {
		t.Helper()
		c := 0
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := netlink.FilterList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: n.uplink}}, parent)
			if err != nil {
				continue
			}
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == tcNamePrefix+attachmentName(n.uplink, dirIngress) ||
					ok && bf.Name == tcNamePrefix+attachmentName(n.uplink, dirEgress) {
					c++
				}
			}
		}
		return c
	}
	progID := func(name string) uint32 { return uint32(pinnedLinkInfo(t, root, name).Program) }

	first := run(loader.AttachTCX)
	if pins() != 2 || filters() != 0 || len(first.Attachments()) != 2 {
		t.Fatalf("TCX: %d pins, %d filters, attachments %v", pins(), filters(), first.Attachments())
	}
	firstProg := progID(attachmentName(n.uplink, dirEgress))
	first.Close()

	second := run(loader.AttachTCX)
	if second.Kept() != 2 || pins() != 2 {
		t.Fatalf("restart: kept %d, %d pins", second.Kept(), pins())
	}
	if id := progID(attachmentName(n.uplink, dirEgress)); id == firstProg {
		t.Fatalf("restart kept the first run's program %d on the link", id)
	}
	second.Close()

	tc := run(loader.AttachTC)
	if pins() != 0 || filters() != 2 {
		t.Fatalf("tc: %d pins, %d filters", pins(), filters())
	}
	// Someone deletes the egress filter: the check puts it back.
	if err := netlink.FilterDel(tc.filter(n.uplink, dirEgress, -1)); err != nil {
		t.Fatal(err)
	}
	checkPutsBack(t, tc, n.uplink, func() bool { return filters() == 2 })
	tc.Close()

	// A tc-mode run's filters on a device the next run no longer
	// configures are found on the device and removed (they have no pin).
	other, err := Load(Options{BPFRoot: root, AttachMode: loader.AttachTCX, PortMin: 61000, PortMax: 61999, Maps: n.l.MapReplacements()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.DetachOthers(map[int]bool{}); err != nil {
		t.Fatal(err)
	}
	other.Close()
	if pins() != 0 || filters() != 0 {
		t.Fatalf("device dropped after a tc run: %d pins, %d filters", pins(), filters())
	}
	run(loader.AttachTC).Close()

	back := run(loader.AttachTCX)
	if pins() != 2 || filters() != 0 {
		t.Fatalf("back to TCX: %d pins, %d filters", pins(), filters())
	}
	// Someone detaches the ingress link (BPF_LINK_DETACH): the check
	// attaches a new one.
	ingress := attachmentName(n.uplink, dirIngress)
	detachedID := pinnedLinkInfo(t, root, ingress).ID
	detached, err := link.LoadPinnedLink(filepath.Join(linksDir(root), ingress), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = detached.Detach()
	detached.Close()
	if err != nil {
		t.Fatal(err)
	}
	checkPutsBack(t, back, n.uplink, func() bool {
		info := pinnedLinkInfo(t, root, ingress)
		return info.ID != detachedID && int(info.TCX().Ifindex) == n.uplink && pins() == 2
	})
	if err := back.Detach(n.uplink); err != nil {
		t.Fatal(err)
	}
	back.Close()
	if pins() != 0 || filters() != 0 {
		t.Fatalf("detached: %d pins, %d filters", pins(), filters())
	}
}

// TestPrivilegedStartWithoutDevices: on a node with no device for the host
// programs (no default route, no --devices) the agent's start loads
// nothing — the programs would only cost their verification — and still
// removes what an earlier run attached to a device: its pinned TCX links
// and a tc-mode run's filters.
func TestPrivilegedStartWithoutDevices(t *testing.T) {
	n := newMasqNode(t, 61000, 61999)
	root := n.h.opts.BPFRoot
	for _, mode := range []loader.AttachMode{loader.AttachTCX, loader.AttachTC} {
		earlier, err := Load(Options{BPFRoot: root, AttachMode: mode, PortMin: 61000, PortMax: 61999, Maps: n.l.MapReplacements()}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := earlier.Attach(n.uplink); err != nil {
			t.Fatal(err)
		}
		earlier.Close()
		if len(hostAttachments(t, root, n.uplink)) != 2 {
			t.Fatalf("%s: the earlier run's attachments %v, want 2", mode, hostAttachments(t, root, n.uplink))
		}
		cfg := DefaultConfig()
		cfg.MasqueradePortRange = "61000-61999"
		m, err := New(cfg, n.l, nil, nil, mode, root, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		if m.prog != nil {
			t.Fatalf("%s: the programs were loaded with no device to attach them to", mode)
		}
		st, err := m.Status()
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Devices) != 0 || len(st.Attachments) != 0 {
			t.Fatalf("%s: devices %v, attachments %v, want none (no default route)", mode, st.Devices, st.Attachments)
		}
		if got := hostAttachments(t, root, n.uplink); len(got) != 0 {
			t.Fatalf("%s: left attached %v", mode, got)
		}
		m.Stop()
	}
}

// hostAttachments lists the host programs' pinned links under root and
// their tc filters on ifindex.
func hostAttachments(t *testing.T, root string, ifindex int) []string {
	t.Helper()
	var out []string
	entries, _ := os.ReadDir(linksDir(root))
	for _, e := range entries {
		if _, _, ok := parseAttachmentName(e.Name()); ok {
			out = append(out, "link "+e.Name())
		}
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := netlink.FilterList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}, parent)
		if err != nil {
			continue
		}
		for _, f := range fs {
			if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, tcNamePrefix) {
				out = append(out, "filter "+bf.Name)
			}
		}
	}
	return out
}

// checkPutsBack runs the check on a device whose programs someone took
// off: it says it attached them again and intact() holds; a second check
// finds nothing gone.
func checkPutsBack(t *testing.T, p *Programs, ifindex int, intact func() bool) {
	t.Helper()
	reattached, err := p.Check(ifindex)
	if err != nil || !reattached {
		t.Fatalf("check after a removal: reattached %v, %v", reattached, err)
	}
	if !intact() {
		t.Fatal("the check did not put the programs back")
	}
	if reattached, err := p.Check(ifindex); err != nil || reattached {
		t.Fatalf("second check: reattached %v, %v", reattached, err)
	}
}

// pinnedLinkInfo reads a pinned link of the host programs.
func pinnedLinkInfo(t *testing.T, root, name string) *link.Info {
	t.Helper()
	lk, err := link.LoadPinnedLink(filepath.Join(linksDir(root), name), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	info, err := lk.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info
}
