package hostdev

import (
	"os"
	"path/filepath"
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
// a tc-mode run's filters from it; detaching leaves nothing.
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
	progID := func(name string) uint32 {
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
		return uint32(info.Program)
	}

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
	if err := back.Detach(n.uplink); err != nil {
		t.Fatal(err)
	}
	back.Close()
	if pins() != 0 || filters() != 0 {
		t.Fatalf("detached: %d pins, %d filters", pins(), filters())
	}
}
