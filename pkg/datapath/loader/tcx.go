package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// TCX mode: one BPF link per endpoint and direction, pinned under
// <bpf-root>/links/ep<ID>-<dir> so it outlives the agent.

// pinnedLink is a TCX link an earlier run pinned, with where it attaches.
type pinnedLink struct {
	link    link.Link
	ifindex int
	id      uint16
	dir     string
}

// loadPinnedLinks opens every pinned link. A link whose interface is gone
// (the pod's veth was deleted while the agent was down: the kernel keeps
// the link, attached to nothing, and refuses to update it) is unpinned.
func (l *Loader) loadPinnedLinks() (map[string]pinnedLink, error) {
	entries, err := os.ReadDir(l.linksDir())
	if err != nil {
		return nil, fmt.Errorf("read pinned links: %w", err)
	}
	out := map[string]pinnedLink{}
	for _, e := range entries {
		id, dir, ok := parseLinkName(e.Name())
		if !ok {
			continue
		}
		path := filepath.Join(l.linksDir(), e.Name())
		lk, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			l.log.Warn("Removing unloadable pinned link", "path", path, "error", err)
			_ = os.Remove(path)
			continue
		}
		ifindex, err := TCXIfindex(lk)
		if err != nil {
			// Left as it is: unpinning a link that may be live would
			// detach its program.
			l.log.Warn("Cannot read a pinned link's interface; leaving it with its program", "path", path, "error", err)
			lk.Close()
			continue
		}
		if ifindex == 0 {
			l.log.Info("Removing the pinned link of an interface that is gone", "path", path)
			if err := l.unpinLink(e.Name(), lk); err != nil {
				l.log.Warn("Cannot remove pinned link", "path", path, "error", err)
			}
			continue
		}
		out[e.Name()] = pinnedLink{link: lk, ifindex: ifindex, id: id, dir: dir}
	}
	return out, nil
}

func closeLinks(links map[string]pinnedLink) {
	for _, p := range links {
		p.link.Close()
	}
}

// TCXIfindex is the interface a TCX link attaches to: 0 once the
// interface is gone or the link was detached (BPF_LINK_DETACH). The host
// device programs (hostdev) read their links with it too.
func TCXIfindex(lk link.Link) (int, error) {
	info, err := lk.Info()
	if err != nil {
		return 0, fmt.Errorf("link info: %w", err)
	}
	tcx := info.TCX()
	if tcx == nil {
		return 0, fmt.Errorf("link %d is not a TCX link (type %d)", info.ID, info.Type)
	}
	return int(tcx.Ifindex), nil
}

// attachTCXLocked gives one direction of ep a TCX link with this run's
// program: an update of the link it has, or a new one.
func (l *Loader) attachTCXLocked(ep EndpointInfo, dir string) error {
	name := linkName(ep.ID, dir)
	if lk, ok := l.links[name]; ok {
		if ifindex, err := TCXIfindex(lk); err == nil && ifindex == ep.IfIndex {
			return lk.Update(l.progFor(dir))
		}
		// The link belongs to an interface that is gone (the pod's veth
		// was recreated under the same endpoint ID): replace it.
		if err := l.dropTCXLinkLocked(name); err != nil {
			l.log.Warn("Cannot remove the pinned link of a former interface", "attachment", name, "error", err)
		}
	}
	return l.attachTCXLink(ep.IfIndex, ep.ID, dir)
}

// attachTCXLink attaches and pins a new TCX link. The kernel waits for an
// RCU grace period here, holding rtnl.
func (l *Loader) attachTCXLink(ifindex int, id uint16, dir string) error {
	attach := ebpf.AttachTCXIngress
	if dir == dirEgress {
		attach = ebpf.AttachTCXEgress
	}
	lk, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: l.progFor(dir), Attach: attach})
	if err != nil {
		return fmt.Errorf("attach TCX %s to interface %d: %w", dir, ifindex, err)
	}
	name := linkName(id, dir)
	path := filepath.Join(l.linksDir(), name)
	_ = os.Remove(path)
	if err := lk.Pin(path); err != nil {
		lk.Close()
		return fmt.Errorf("pin link %s: %w", path, err)
	}
	l.links[name] = lk
	return nil
}

// dropTCXLinksLocked detaches both of an endpoint's TCX links.
func (l *Loader) dropTCXLinksLocked(id uint16) error {
	return eachDirection(id, l.dropTCXLinkLocked)
}

// dropTCXLinkLocked detaches one TCX link: unpinned and closed, the link
// has no reference left. A pin this process does not hold is removed too.
func (l *Loader) dropTCXLinkLocked(name string) error {
	lk, ok := l.links[name]
	if !ok {
		if err := os.Remove(filepath.Join(l.linksDir(), name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove pinned link %s: %w", name, err)
		}
		return nil
	}
	delete(l.links, name)
	return l.unpinLink(name, lk)
}

func (l *Loader) unpinLink(name string, lk link.Link) error {
	defer lk.Close()
	if err := lk.Unpin(); err != nil {
		return fmt.Errorf("unpin link %s: %w", name, err)
	}
	return nil
}
