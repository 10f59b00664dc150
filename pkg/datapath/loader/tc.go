package loader

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// tc mode: a clsact qdisc on the host veth and one cls_bpf filter per
// direction in direct-action mode (the program's return value is the
// verdict). The kernel holds a filter's program, so nothing is pinned:
// the filters stay when the agent stops, and go with their interface.
//
// Tendril's filter has a fixed slot on each hook, priority 1 (the first
// to run, as Cilium's) and handle 1, protocol all, and is named
// "tendril:ep<ID>-<ingress|egress>". Replacing a filter in its slot swaps
// the program atomically (the kernel links the new one in place of the
// old under RCU). A filter is Tendril's only by that name in that slot:
// filters elsewhere are never touched, and a filter of another name in
// Tendril's slot is an error, not something to overwrite.
const (
	tcFilterPriority   = 1
	tcFilterHandle     = 1
	tcFilterNamePrefix = "tendril:"
)

// tcFilter is one of Tendril's filters: the interface and hook it is on
// and the endpoint it serves.
type tcFilter struct {
	ifindex int
	id      uint16
	dir     string
}

func (f tcFilter) name() string { return linkName(f.id, f.dir) }

// tcParent is the clsact hook of a direction.
func tcParent(dir string) uint32 {
	if dir == dirIngress {
		return netlink.HANDLE_MIN_INGRESS
	}
	return netlink.HANDLE_MIN_EGRESS
}

func tcFilterName(id uint16, dir string) string { return tcFilterNamePrefix + linkName(id, dir) }

// parseTCFilter reports whether f is Tendril's filter on the hook of
// parent, and for which endpoint.
func parseTCFilter(f netlink.Filter, parent uint32) (tcFilter, bool) {
	bf, ok := f.(*netlink.BpfFilter)
	if !ok {
		return tcFilter{}, false
	}
	a := bf.Attrs()
	if a.Priority != tcFilterPriority || a.Handle != tcFilterHandle {
		return tcFilter{}, false
	}
	rest, ok := strings.CutPrefix(bf.Name, tcFilterNamePrefix)
	if !ok {
		return tcFilter{}, false
	}
	id, dir, ok := parseLinkName(rest)
	if !ok || tcParent(dir) != parent {
		return tcFilter{}, false
	}
	return tcFilter{ifindex: a.LinkIndex, id: id, dir: dir}, true
}

// ifaceRef names an interface by index for netlink calls that take a
// Link but only read its index (no lookup round trip).
func ifaceRef(ifindex int) netlink.Link {
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}
}

// bpfFilter is the filter of f's slot, running this run's program (fd -1
// for a delete, which names the slot only).
func (l *Loader) bpfFilter(f tcFilter, fd int) *netlink.BpfFilter {
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: f.ifindex, Parent: tcParent(f.dir), Handle: tcFilterHandle, Priority: tcFilterPriority, Protocol: unix.ETH_P_ALL,
		},
		Fd: fd, Name: tcFilterName(f.id, f.dir), DirectAction: true,
	}
}

// attachTCLocked gives ep both filters with this run's programs. On an
// interface where this process knows both filters, that is a replace of
// each; otherwise the clsact qdisc is added first, and when the qdisc was
// there already, Tendril's slots are checked for another's filter.
func (l *Loader) attachTCLocked(ep EndpointInfo) error {
	want := [len(directions)]tcFilter{}
	known := true
	for i, dir := range directions {
		want[i] = tcFilter{ifindex: ep.IfIndex, id: ep.ID, dir: dir}
		cur, ok := l.filters[want[i].name()]
		if ok && cur.ifindex != ep.IfIndex {
			// The pod's veth was recreated under the same endpoint ID;
			// the old filter went with its interface, or goes now.
			if err := l.dropTCFilterLocked(cur.name()); err != nil {
				l.log.Warn("Cannot delete the tc filter of a former interface", "attachment", cur.name(), "error", err)
			}
		}
		known = known && ok && cur.ifindex == ep.IfIndex
	}
	if known && l.replaceTCFilters(want[:]) == nil {
		return nil
	}
	// Unknown, or a replace failed (someone deleted the qdisc): from the
	// start.
	if err := l.prepareTCHooks(ep.IfIndex); err != nil {
		return err
	}
	return l.replaceTCFilters(want[:])
}

// attachTCFilter attaches one filter on an interface this process has not
// attached to yet.
func (l *Loader) attachTCFilter(f tcFilter) error {
	if err := l.prepareTCHooks(f.ifindex); err != nil {
		return err
	}
	return l.replaceTCFilters([]tcFilter{f})
}

func (l *Loader) replaceTCFilters(fs []tcFilter) error {
	for _, f := range fs {
		if err := l.replaceTCFilter(f); err != nil {
			return err
		}
		l.filters[f.name()] = f
	}
	return nil
}

// replaceTCFilter puts this run's program into f's slot: a new filter, or
// the old one's program swapped atomically.
func (l *Loader) replaceTCFilter(f tcFilter) error {
	if err := l.nl.FilterReplace(l.bpfFilter(f, l.progFor(f.dir).FD())); err != nil {
		return fmt.Errorf("replace tc filter %s on interface %d: %w", tcFilterName(f.id, f.dir), f.ifindex, err)
	}
	return nil
}

// prepareTCHooks adds the clsact qdisc to an interface; when it was there
// already, it makes sure no other component's filter holds Tendril's slot.
func (l *Loader) prepareTCHooks(ifindex int) error {
	existed, err := l.addClsact(ifindex)
	if err != nil || !existed {
		return err
	}
	for _, dir := range directions {
		if err := l.checkTCSlot(ifindex, dir); err != nil {
			return err
		}
	}
	return nil
}

// checkTCSlot fails when a filter that is not Tendril's holds Tendril's
// priority on a hook (another clsact user, or an ingress qdisc without an
// egress hook, shows up as an error here or in the replace).
func (l *Loader) checkTCSlot(ifindex int, dir string) error {
	parent := tcParent(dir)
	fs, err := l.nl.FilterList(ifaceRef(ifindex), parent)
	if err != nil {
		return fmt.Errorf("list tc filters of interface %d (%s): %w", ifindex, dir, err)
	}
	for _, f := range fs {
		a := f.Attrs()
		// Handle 0 is the dump's entry for the priority's classifier
		// itself, not a filter.
		if a.Priority != tcFilterPriority || a.Handle == 0 {
			continue
		}
		if _, ours := parseTCFilter(f, parent); ours {
			continue
		}
		name := ""
		if bf, ok := f.(*netlink.BpfFilter); ok {
			name = bf.Name
		}
		return fmt.Errorf("another %s filter %q (handle %#x) holds priority %d on interface %d (%s): not replacing it",
			f.Type(), name, a.Handle, tcFilterPriority, ifindex, dir)
	}
	return nil
}

// listTCFilters finds Tendril's filters on every interface with a clsact
// qdisc in the namespace: one qdisc dump, then a filter dump per hook of
// those interfaces.
func (l *Loader) listTCFilters() (map[string]tcFilter, error) {
	qdiscs, err := l.nl.QdiscList(nil)
	if err != nil {
		return nil, fmt.Errorf("list qdiscs: %w", err)
	}
	out := map[string]tcFilter{}
	for _, q := range qdiscs {
		if q.Type() != "clsact" {
			continue
		}
		ifindex := q.Attrs().LinkIndex
		for _, dir := range directions {
			parent := tcParent(dir)
			fs, err := l.nl.FilterList(ifaceRef(ifindex), parent)
			if err != nil {
				// The interface may have gone since the qdisc dump.
				l.log.Warn("Cannot list an interface's tc filters; not taking them over", "ifindex", ifindex, "hook", dir, "error", err)
				continue
			}
			for _, f := range fs {
				if tf, ok := parseTCFilter(f, parent); ok {
					out[tf.name()] = tf
				}
			}
		}
	}
	return out, nil
}

// forgetVanishedTCFiltersLocked drops from this process's record each
// filter of endpoint id that the kernel no longer holds in its slot on
// its interface (a hook that cannot be listed, its qdisc gone, counts as
// holding none), so that the next attach puts it back; it reports whether
// any was gone.
func (l *Loader) forgetVanishedTCFiltersLocked(id uint16) (vanished bool) {
	for _, dir := range directions {
		name := linkName(id, dir)
		f, ok := l.filters[name]
		if !ok || l.holdsTCFilter(f) {
			continue
		}
		delete(l.filters, name)
		vanished = true
	}
	return vanished
}

// holdsTCFilter reports whether the kernel has Tendril's filter f in its
// slot.
func (l *Loader) holdsTCFilter(f tcFilter) bool {
	parent := tcParent(f.dir)
	fs, err := l.nl.FilterList(ifaceRef(f.ifindex), parent)
	if err != nil {
		return false
	}
	for _, kf := range fs {
		if got, ok := parseTCFilter(kf, parent); ok && got.id == f.id {
			return true
		}
	}
	return false
}

// dropTCFiltersLocked deletes both of an endpoint's filters.
func (l *Loader) dropTCFiltersLocked(id uint16) error {
	return eachDirection(id, l.dropTCFilterLocked)
}

// dropTCFilterLocked deletes a filter this process knows of. The clsact
// qdisc stays: other filters may use it, and an empty one costs a pointer
// test per packet.
func (l *Loader) dropTCFilterLocked(name string) error {
	f, ok := l.filters[name]
	if !ok {
		return nil
	}
	delete(l.filters, name)
	return l.deleteTCFilter(f)
}

// deleteTCFilter deletes f; one that is gone already (with its interface
// or its qdisc) is no error.
func (l *Loader) deleteTCFilter(f tcFilter) error {
	err := l.nl.FilterDel(l.bpfFilter(f, -1))
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) {
		return nil
	}
	return fmt.Errorf("delete tc filter %s on interface %d: %w", tcFilterName(f.id, f.dir), f.ifindex, err)
}

// addClsact adds the clsact qdisc to an interface unless it has one. Adding
// it deactivates the device for a moment (qdisc_graft calls dev_deactivate
// on an up device, ingress qdiscs included): a packet sent through the
// device then meets the noop qdisc and is dropped. So it is added when an
// endpoint is first attached, in either mode, before the pod has traffic,
// and a later switch to tc mode under traffic adds nothing.
func (l *Loader) addClsact(ifindex int) (existed bool, err error) {
	qdisc := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
	err = l.nl.QdiscAdd(qdisc)
	if err == nil {
		return false, nil
	}
	if errors.Is(err, unix.EEXIST) {
		return true, nil
	}
	return false, fmt.Errorf("add clsact qdisc to interface %d: %w", ifindex, err)
}
