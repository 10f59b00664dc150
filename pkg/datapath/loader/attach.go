package loader

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// AttachMode is how the programs attach to an endpoint's host veth.
//
// TCX links (the default) are owned by Tendril alone: each is a BPF link,
// pinned, that no other program on the interface can replace or detach by
// mistake, and whose program is swapped atomically. Attaching or
// detaching one waits for an RCU grace period while holding rtnl (the
// kernel's tcx_link_attach and tcx_link_release call synchronize_rcu), 12
// to 15 ms here, so attachments of concurrent pods, and every other rtnl
// user, queue behind one another.
//
// tc mode adds a clsact qdisc and two cls_bpf filters (direct action) at a
// fixed priority and handle, named after the endpoint; the filters hold
// their programs in the kernel, so nothing needs a pin. It needs no normal
// grace period (about 0.2 ms per endpoint), but the slot is a convention,
// not an ownership: anyone with CAP_NET_ADMIN may replace or delete the
// filter, and a filter of another component at a lower priority runs
// first.
type AttachMode string

const (
	// AttachTCX attaches TCX links, pinned under <bpf-root>/links.
	AttachTCX AttachMode = "tcx"
	// AttachTC attaches cls_bpf filters to a clsact qdisc.
	AttachTC AttachMode = "tc"
)

// ParseAttachMode checks a mode's name (the agent's
// --datapath-attach-mode).
func ParseAttachMode(s string) (AttachMode, error) {
	m := AttachMode(s)
	return m, m.validate()
}

func (m AttachMode) validate() error {
	switch m {
	case AttachTCX, AttachTC:
		return nil
	}
	return fmt.Errorf("datapath attach mode %q: must be %s or %s", string(m), AttachTCX, AttachTC)
}

// Directions of an attachment: ingress of the host veth runs from_pod
// (packets the pod sends), egress runs to_pod (packets for the pod).
const (
	dirIngress = "ingress"
	dirEgress  = "egress"
)

var directions = [...]string{dirIngress, dirEgress}

// eachDirection calls fn with the attachment name of each of endpoint
// id's directions, all of them even when one fails.
func eachDirection(id uint16, fn func(name string) error) error {
	var errs []error
	for _, dir := range directions {
		errs = append(errs, fn(linkName(id, dir)))
	}
	return errors.Join(errs...)
}

// linkName names one attachment: the pin of a TCX link, and (with
// tcFilterNamePrefix) the name of a tc filter.
func linkName(id uint16, dir string) string { return fmt.Sprintf("ep%d-%s", id, dir) }

func parseLinkName(name string) (uint16, string, bool) {
	rest, ok := strings.CutPrefix(name, "ep")
	if !ok {
		return 0, "", false
	}
	idStr, dir, ok := strings.Cut(rest, "-")
	if !ok || (dir != dirIngress && dir != dirEgress) {
		return 0, "", false
	}
	id, err := strconv.ParseUint(idStr, 10, 16)
	if err != nil {
		return 0, "", false
	}
	return uint16(id), dir, true
}

// takeOver gives every endpoint an earlier run attached this run's
// programs, in this run's mode. An attachment of the same mode has its
// program swapped in place (TCX link update, tc filter replace: atomic).
// One of the other mode gets this mode's attachment first and loses the
// old one after: while both are there, the TCX program runs and the tc
// filter does not (the kernel runs tc filters only when the TCX programs
// return "next", which Tendril's never do), so no packet sees no program
// and none is processed twice. An attachment that cannot switch keeps its
// mode with this run's program; the endpoint's regeneration tries again.
func (l *Loader) takeOver() error {
	pinned, err := l.loadPinnedLinks()
	if err != nil {
		return err
	}
	filters, err := l.listTCFilters()
	if err != nil {
		closeLinks(pinned)
		return err
	}
	var switched int
	if l.cfg.AttachMode == AttachTC {
		switched, err = l.takeOverAsTC(pinned, filters)
	} else {
		switched, err = l.takeOverAsTCX(pinned, filters)
	}
	if err != nil {
		return err
	}
	l.reusedLinks = len(l.links) + len(l.filters)
	if l.reusedLinks > 0 {
		l.log.Info("Attached this run's programs to the endpoints of the previous run",
			"mode", l.cfg.AttachMode, "attachments", l.reusedLinks, "switched-from-other-mode", switched)
	}
	return nil
}

// takeOverAsTCX updates the pinned links, then moves the endpoints of tc
// filters to TCX links.
func (l *Loader) takeOverAsTCX(pinned map[string]pinnedLink, filters map[string]tcFilter) (switched int, err error) {
	for name, p := range pinned {
		delete(pinned, name)
		if err := p.link.Update(l.progFor(p.dir)); err != nil {
			p.link.Close()
			closeLinks(pinned)
			return 0, fmt.Errorf("update pinned link %s: %w", name, err)
		}
		l.links[name] = p.link
	}
	for name, f := range filters {
		if _, linked := l.links[name]; !linked && l.cfg.DeferTCX {
			// Promoted in the background like a new endpoint's: a
			// start does not wait an RCU grace period per endpoint.
			if err := l.replaceTCFilter(f); err != nil {
				return switched, fmt.Errorf("replace the program of tc filter %s on interface %d: %w", name, f.ifindex, err)
			}
			l.filters[name] = f
			l.pendingTCX[f.id] = struct{}{}
			continue
		}
		if err := l.switchToTCX(name, f); err != nil {
			l.log.Warn("Cannot switch an endpoint's tc filter to a TCX link; it keeps the filter, with this run's program",
				"attachment", name, "ifindex", f.ifindex, "error", err)
			if err := l.replaceTCFilter(f); err != nil {
				return switched, fmt.Errorf("replace the program of tc filter %s on interface %d: %w", name, f.ifindex, err)
			}
			l.filters[name] = f
			continue
		}
		switched++
	}
	return switched, nil
}

// switchToTCX attaches a TCX link where f is (unless a pinned link of the
// endpoint is there already), then deletes f.
func (l *Loader) switchToTCX(name string, f tcFilter) error {
	if lk, ok := l.links[name]; ok {
		if ifindex, _ := TCXIfindex(lk); ifindex != f.ifindex {
			return fmt.Errorf("endpoint's pinned link is on interface %d", ifindex)
		}
	} else if err := l.attachTCXLink(f.ifindex, f.id, f.dir); err != nil {
		return err
	}
	return l.deleteTCFilter(f)
}

// takeOverAsTC replaces the tc filters' programs, then moves the
// endpoints of pinned links to tc filters.
func (l *Loader) takeOverAsTC(pinned map[string]pinnedLink, filters map[string]tcFilter) (switched int, err error) {
	defer closeLinks(pinned)
	for name, f := range filters {
		if err := l.replaceTCFilter(f); err != nil {
			return 0, fmt.Errorf("replace the program of tc filter %s on interface %d: %w", name, f.ifindex, err)
		}
		l.filters[name] = f
	}
	for name, p := range pinned {
		delete(pinned, name)
		if err := l.switchToTC(name, p); err != nil {
			l.log.Warn("Cannot switch an endpoint's TCX link to a tc filter; it keeps the link, with this run's program",
				"attachment", name, "ifindex", p.ifindex, "error", err)
			if err := p.link.Update(l.progFor(p.dir)); err != nil {
				p.link.Close()
				return switched, fmt.Errorf("update pinned link %s: %w", name, err)
			}
			l.links[name] = p.link
			continue
		}
		switched++
	}
	return switched, nil
}

// switchToTC attaches a tc filter where p is (unless one of the endpoint
// is there already), then unpins p, which detaches it.
func (l *Loader) switchToTC(name string, p pinnedLink) error {
	if f, ok := l.filters[name]; ok {
		if f.ifindex != p.ifindex {
			return fmt.Errorf("endpoint's tc filter is on interface %d", f.ifindex)
		}
	} else if err := l.attachTCFilter(tcFilter{ifindex: p.ifindex, id: p.id, dir: p.dir}); err != nil {
		return err
	}
	return l.unpinLink(name, p.link)
}
