// Package hostdev loads Tendril's host device programs (bpf/bpf_host.c:
// masquerade of pod traffic leaving the node, and the reverse translation
// of its replies) and attaches them at the node's uplinks, TCX ingress
// and egress (pinned links under <bpf-root>/links/dev<ifindex>-<dir>) or
// tc filters (--datapath-attach-mode=tc), the way pkg/datapath/loader
// attaches the pod programs: an attachment outlives the agent, and a
// restart swaps its program atomically. The programs share the pod
// programs' pinned maps (loaded with them as replacements).
package hostdev

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
)

// Directions of an attachment: ingress runs from_netdev (replies coming
// in), egress to_netdev (pod traffic leaving). The WireGuard device's
// attachments (AttachWireGuard) are of their own kinds: ingress runs
// from_wireguard, egress to_wireguard, and the devices' bookkeeping
// (DetachOthers, removeFilters) does not see them.
const (
	dirIngress         = "ingress"
	dirEgress          = "egress"
	dirWireGuard       = "wireguard"
	dirWireGuardEgress = "wireguard_egress"
)

// wireGuardDirections are the WireGuard device's attachments.
var wireGuardDirections = [...]string{dirWireGuard, dirWireGuardEgress}

// isEgress reports whether an attachment of dir is at a device's egress.
func isEgress(dir string) bool { return dir == dirEgress || dir == dirWireGuardEgress }

var directions = [...]string{dirIngress, dirEgress}

// tc slot of the device filters: the pod filters' slot (priority 1, the
// first to run; handle 1), named tendril:dev<ifindex>-<dir>.
const (
	tcPriority   = 1
	tcHandle     = 1
	tcNamePrefix = "tendril:"
)

// Options say how to load and attach the programs.
type Options struct {
	// BPFRoot is the node's BPF root; links are pinned under its links/.
	BPFRoot string
	// AttachMode is TCX links or tc filters (the pod programs' mode).
	AttachMode loader.AttachMode
	// PortMin and PortMax bound the masquerade source ports.
	PortMin, PortMax uint16
	// DSR sends requests from outside to a remote backend by direct
	// server return, and honours the DSR option of other nodes'
	// (--bpf-lb-mode=dsr; LB_DSR in bpf/lib/nodeport_dsr.h).
	DSR bool
	// NoNodePort leaves requests from outside to service frontends
	// alone (--enable-node-port=false with masquerade on; NODEPORT_OFF).
	NoNodePort bool
	// Maps are the pod programs' loaded maps by name
	// (loader.MapReplacements): the host programs use the same ones.
	Maps map[string]*ebpf.Map
}

// Programs are the loaded host device programs and their attachments.
type Programs struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	toNetdev *ebpf.Program
	fromNet  *ebpf.Program
	fromWG   *ebpf.Program
	toWG     *ebpf.Program
	nl       *netlink.Handle
	// links are the TCX links this process holds, by attachment name;
	// filters the tc filters, by attachment name.
	links   map[string]link.Link
	filters map[string]bool
	// kept counts attachments of an earlier run given this run's programs.
	kept int
}

// Load loads the programs in the caller's network namespace (the node's:
// devices are found there by index).
func Load(opts Options, log *slog.Logger) (*Programs, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.AttachMode == "" {
		opts.AttachMode = loader.AttachTCX
	}
	spec, err := bpf.LoadHost()
	if err != nil {
		return nil, fmt.Errorf("load host device programs' spec: %w", err)
	}
	var dsr, off uint8
	if opts.DSR {
		dsr = 1
	}
	if opts.NoNodePort {
		off = 1
	}
	for name, v := range map[string]any{"MASQ_PORT_MIN": opts.PortMin, "MASQ_PORT_MAX": opts.PortMax, "LB_DSR": dsr, "NODEPORT_OFF": off} {
		sv, ok := spec.Variables[name]
		if !ok {
			return nil, fmt.Errorf("host device programs have no %s", name)
		}
		if err := sv.Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	// Each program from its own copy of the spec, side by side: the
	// kernel verifies a program in the thread that loads it, and the
	// verification is most of the load (as the pod programs, see
	// loader.loadObjects). The maps are the pod programs' (replacements).
	copts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: opts.BPFRoot}, MapReplacements: opts.Maps}
	var to struct {
		P *ebpf.Program `ebpf:"to_netdev"`
	}
	var from struct {
		P *ebpf.Program `ebpf:"from_netdev"`
	}
	var fromWG struct {
		P *ebpf.Program `ebpf:"from_wireguard"`
	}
	var toWG struct {
		P *ebpf.Program `ebpf:"to_wireguard"`
	}
	var wg sync.WaitGroup
	var toErr, fromErr, wgErr, toWGErr error
	wg.Add(4)
	go func() { defer wg.Done(); toErr = spec.Copy().LoadAndAssign(&to, copts) }()
	go func() { defer wg.Done(); fromErr = spec.Copy().LoadAndAssign(&from, copts) }()
	go func() { defer wg.Done(); wgErr = spec.Copy().LoadAndAssign(&fromWG, copts) }()
	go func() { defer wg.Done(); toWGErr = spec.Copy().LoadAndAssign(&toWG, copts) }()
	wg.Wait()
	closeAll := func() {
		for _, p := range []*ebpf.Program{to.P, from.P, fromWG.P, toWG.P} {
			if p != nil {
				p.Close()
			}
		}
	}
	if err := errors.Join(toErr, fromErr, wgErr, toWGErr); err != nil {
		closeAll()
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load host device programs: %w\n%+v", err, verr)
		}
		return nil, fmt.Errorf("load host device programs: %w", err)
	}
	if err := os.MkdirAll(linksDir(opts.BPFRoot), 0o750); err != nil {
		closeAll()
		return nil, fmt.Errorf("create links directory: %w", err)
	}
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("open netlink handle: %w", err)
	}
	return &Programs{opts: opts, log: log, toNetdev: to.P, fromNet: from.P, fromWG: fromWG.P, toWG: toWG.P, nl: nl,
		links: map[string]link.Link{}, filters: map[string]bool{}}, nil
}

func linksDir(root string) string { return filepath.Join(root, "links") }

// attachmentName names one attachment: its pin, and (with tcNamePrefix)
// its tc filter.
func attachmentName(ifindex int, dir string) string { return fmt.Sprintf("dev%d-%s", ifindex, dir) }

func parseAttachmentName(name string) (int, string, bool) {
	rest, ok := strings.CutPrefix(name, "dev")
	if !ok {
		return 0, "", false
	}
	idx, dir, ok := strings.Cut(rest, "-")
	if !ok || (dir != dirIngress && dir != dirEgress) {
		return 0, "", false
	}
	n, err := strconv.Atoi(idx)
	if err != nil || n <= 0 {
		return 0, "", false
	}
	return n, dir, true
}

func (p *Programs) prog(dir string) *ebpf.Program {
	switch dir {
	case dirIngress:
		return p.fromNet
	case dirWireGuard:
		return p.fromWG
	case dirWireGuardEgress:
		return p.toWG
	}
	return p.toNetdev
}

// Attach gives the device both programs in the attach mode, taking over
// what an earlier run left there (its pinned link updated in place, its
// tc filter replaced in its slot: no packet sees no program), and removes
// the attachment of the other mode after the new one is in place.
func (p *Programs) Attach(ifindex int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, dir := range directions {
		name := attachmentName(ifindex, dir)
		if p.opts.AttachMode == loader.AttachTC {
			if err := p.attachTC(ifindex, dir); err != nil {
				return err
			}
			if err := p.dropLink(name); err != nil {
				return err
			}
			continue
		}
		if err := p.attachTCX(ifindex, dir); err != nil {
			return err
		}
		if err := p.deleteFilter(ifindex, dir); err != nil {
			return err
		}
	}
	return nil
}

// Check looks in the kernel for the device's programs and attaches again
// what something else removed (a tc filter or the clsact qdisc deleted, a
// TCX link detached): without them the device's traffic is neither
// masqueraded nor load-balanced. It reports whether anything was gone.
func (p *Programs) Check(ifindex int) (reattached bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, dir := range directions {
		name := attachmentName(ifindex, dir)
		if p.opts.AttachMode == loader.AttachTC {
			if p.holdsFilter(ifindex, dir) {
				continue
			}
			reattached = true
			if err := p.attachTC(ifindex, dir); err != nil {
				return true, err
			}
			continue
		}
		if lk, ok := p.links[name]; ok {
			at, err := loader.TCXIfindex(lk)
			if err != nil {
				return reattached, fmt.Errorf("read link %s: %w", name, err)
			}
			if at == ifindex {
				continue
			}
		}
		reattached = true
		if err := p.attachTCX(ifindex, dir); err != nil {
			return true, err
		}
	}
	return reattached, nil
}

// AttachWireGuard gives the WireGuard device (ifindex) from_wireguard at
// its ingress and to_wireguard at its egress, in the attach mode: with
// node encryption a remote backend's reply to a NodePort client arrives
// there, decrypted, and needs the reverse translation from_netdev gives it
// on the underlay, and the node's own traffic with the other nodes goes
// through the device, where the host firewall checks it both ways
// (docs/encryption.md). An attachment already in place is left as it is;
// the ones of a former device (the device process started again makes a
// new device, with another index) are removed. Reports whether it
// attached anything.
func (p *Programs) AttachWireGuard(ifindex int) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	attached := false
	names := map[string]bool{}
	for _, dir := range wireGuardDirections {
		name := attachmentName(ifindex, dir)
		names[name] = true
		did, err := p.attachWireGuard(ifindex, dir)
		attached = attached || did
		if err != nil {
			return attached, err
		}
	}
	if !attached {
		// Nothing new: a former device's links went when this one's
		// attachments were made (the cell calls this at every reconcile).
		return false, nil
	}
	entries, err := os.ReadDir(linksDir(p.opts.BPFRoot))
	if err != nil {
		return attached, fmt.Errorf("read pinned links: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if isWireGuardAttachment(e.Name()) && !names[e.Name()] {
			errs = append(errs, p.dropLink(e.Name()))
		}
	}
	return attached, errors.Join(errs...)
}

// attachWireGuard makes one of the WireGuard device's attachments (dir)
// unless it is in place; it reports whether it attached. p.mu is held.
func (p *Programs) attachWireGuard(ifindex int, dir string) (bool, error) {
	name := attachmentName(ifindex, dir)
	attached := false
	if p.opts.AttachMode == loader.AttachTC {
		if !p.holdsFilter(ifindex, dir) {
			if err := p.attachTC(ifindex, dir); err != nil {
				return false, err
			}
			attached = true
		}
		return attached, p.dropLink(name)
	}
	lk, ok := p.links[name]
	at := 0
	if ok {
		var err error
		if at, err = loader.TCXIfindex(lk); err != nil {
			return false, fmt.Errorf("read link %s: %w", name, err)
		}
	}
	if at != ifindex {
		if err := p.attachTCX(ifindex, dir); err != nil {
			return false, err
		}
		attached = true
	}
	return attached, p.deleteFilter(ifindex, dir)
}

// isWireGuardAttachment reports whether a pinned link's name is a
// WireGuard device's (AttachWireGuard).
func isWireGuardAttachment(name string) bool {
	if !strings.HasPrefix(name, "dev") {
		return false
	}
	for _, dir := range wireGuardDirections {
		if strings.HasSuffix(name, "-"+dir) {
			return true
		}
	}
	return false
}

// holdsFilter reports whether the kernel has Tendril's filter in its slot
// of the device's hook (a hook that cannot be listed holds none).
func (p *Programs) holdsFilter(ifindex int, dir string) bool {
	want := p.filter(ifindex, dir, -1)
	fs, err := p.nl.FilterList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}, want.Parent)
	if err != nil {
		return false
	}
	for _, f := range fs {
		a := f.Attrs()
		if bf, ok := f.(*netlink.BpfFilter); ok && a.Priority == tcPriority && a.Handle == tcHandle && bf.Name == want.Name {
			return true
		}
	}
	return false
}

func (p *Programs) attachTCX(ifindex int, dir string) error {
	name := attachmentName(ifindex, dir)
	pin := filepath.Join(linksDir(p.opts.BPFRoot), name)
	if lk, ok := p.links[name]; ok {
		at, err := loader.TCXIfindex(lk)
		if err != nil {
			// Not known to be gone: never drop a link that may work.
			return fmt.Errorf("read link %s: %w", name, err)
		}
		if at == ifindex {
			return lk.Update(p.prog(dir))
		}
		// Detached by someone else (it names no device): a new link
		// replaces it.
		if err := p.dropLink(name); err != nil {
			return err
		}
	}
	if lk, err := link.LoadPinnedLink(pin, nil); err == nil {
		if at, ierr := loader.TCXIfindex(lk); ierr == nil && at == ifindex {
			if err := lk.Update(p.prog(dir)); err != nil {
				lk.Close()
				return fmt.Errorf("update pinned link %s: %w", name, err)
			}
			p.links[name] = lk
			p.kept++
			return nil
		}
		// A link of a device that is gone (the index was reused).
		_ = lk.Unpin()
		lk.Close()
	}
	attach := ebpf.AttachTCXIngress
	if isEgress(dir) {
		attach = ebpf.AttachTCXEgress
	}
	lk, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: p.prog(dir), Attach: attach})
	if err != nil {
		return fmt.Errorf("attach TCX %s to device %d: %w", dir, ifindex, err)
	}
	_ = os.Remove(pin)
	if err := lk.Pin(pin); err != nil {
		lk.Close()
		return fmt.Errorf("pin link %s: %w", pin, err)
	}
	p.links[name] = lk
	return nil
}

func (p *Programs) filter(ifindex int, dir string, fd int) *netlink.BpfFilter {
	parent := uint32(netlink.HANDLE_MIN_INGRESS)
	if isEgress(dir) {
		parent = netlink.HANDLE_MIN_EGRESS
	}
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: parent, Handle: tcHandle, Priority: tcPriority, Protocol: unix.ETH_P_ALL},
		Fd:          fd, Name: tcNamePrefix + attachmentName(ifindex, dir), DirectAction: true,
	}
}

// attachTC puts the program into Tendril's tc slot of the device's hook;
// another component's filter there is an error, never overwritten.
func (p *Programs) attachTC(ifindex int, dir string) error {
	qdisc := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
	if err := p.nl.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact qdisc to device %d: %w", ifindex, err)
	}
	want := p.filter(ifindex, dir, p.prog(dir).FD())
	fs, err := p.nl.FilterList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}, want.Parent)
	if err != nil {
		return fmt.Errorf("list tc filters of device %d: %w", ifindex, err)
	}
	for _, f := range fs {
		a := f.Attrs()
		if a.Priority != tcPriority || a.Handle == 0 {
			continue
		}
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == want.Name {
			continue
		}
		return fmt.Errorf("another %s filter (handle %#x) holds priority %d on device %d (%s): not replacing it", f.Type(), a.Handle, tcPriority, ifindex, dir)
	}
	if err := p.nl.FilterReplace(want); err != nil {
		return fmt.Errorf("replace tc filter %s: %w", want.Name, err)
	}
	p.filters[attachmentName(ifindex, dir)] = true
	return nil
}

// deleteFilter removes Tendril's filter of a device's hook, if there.
func (p *Programs) deleteFilter(ifindex int, dir string) error {
	delete(p.filters, attachmentName(ifindex, dir))
	want := p.filter(ifindex, dir, -1)
	fs, err := p.nl.FilterList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}, want.Parent)
	if err != nil {
		// No clsact qdisc: no filter either.
		return nil
	}
	for _, f := range fs {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == want.Name && bf.Priority == tcPriority && bf.Handle == tcHandle {
			if err := p.nl.FilterDel(want); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("delete tc filter %s: %w", want.Name, err)
			}
		}
	}
	return nil
}

// dropLink detaches a TCX link: unpinned and closed.
func (p *Programs) dropLink(name string) error {
	pin := filepath.Join(linksDir(p.opts.BPFRoot), name)
	lk, ok := p.links[name]
	delete(p.links, name)
	if !ok {
		var err error
		if lk, err = link.LoadPinnedLink(pin, nil); err != nil {
			return nil
		}
	}
	defer lk.Close()
	if err := lk.Unpin(); err != nil {
		return fmt.Errorf("unpin link %s: %w", name, err)
	}
	return nil
}

// Detach removes both programs from a device, whichever mode attached
// them.
func (p *Programs) Detach(ifindex int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, dir := range directions {
		errs = append(errs, p.dropLink(attachmentName(ifindex, dir)), p.deleteFilter(ifindex, dir))
	}
	return errors.Join(errs...)
}

// DetachOthers removes the pinned links of devices not in keep (devices
// an earlier run attached to that are no longer configured).
func (p *Programs) DetachOthers(keep map[int]bool) error {
	entries, err := os.ReadDir(linksDir(p.opts.BPFRoot))
	if err != nil {
		return fmt.Errorf("read pinned links: %w", err)
	}
	var errs []error
	for _, e := range entries {
		idx, _, ok := parseAttachmentName(e.Name())
		if !ok || keep[idx] {
			continue
		}
		p.mu.Lock()
		errs = append(errs, p.dropLink(e.Name()))
		p.mu.Unlock()
		p.log.Info("Detached the host programs from a device no longer configured", "attachment", e.Name())
	}
	errs = append(errs, removeFilters(p.nl, keep, p.log))
	return errors.Join(errs...)
}

// removeFilters deletes Tendril's host-program tc filters from every
// device of the namespace not in keep. tc filters have no pin to list, so
// a former tc-mode run's filters are found by their name on the devices
// themselves; without this they stayed on a device dropped from --devices
// (translating nothing, since its map entry goes, but still run per packet).
func removeFilters(nl *netlink.Handle, keep map[int]bool, log *slog.Logger) error {
	if nl == nil {
		var err error
		if nl, err = netlink.NewHandle(); err != nil {
			return fmt.Errorf("netlink handle: %w", err)
		}
		defer nl.Close()
	}
	links, err := nl.LinkList()
	if err != nil {
		return fmt.Errorf("list devices: %w", err)
	}
	var errs []error
	for _, l := range links {
		idx := l.Attrs().Index
		if keep[idx] {
			continue
		}
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := nl.FilterList(l, parent)
			if err != nil {
				continue // no clsact qdisc: no filter either
			}
			for _, f := range fs {
				bf, ok := f.(*netlink.BpfFilter)
				if !ok || bf.Priority != tcPriority || bf.Handle != tcHandle {
					continue
				}
				name, ok := strings.CutPrefix(bf.Name, tcNamePrefix)
				if _, _, own := parseAttachmentName(name); !ok || !own {
					continue
				}
				if err := nl.FilterDel(bf); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("delete tc filter %s of %s: %w", bf.Name, l.Attrs().Name, err))
					continue
				}
				log.Info("Detached the host programs' tc filter from a device no longer configured",
					"device", l.Attrs().Name, "filter", bf.Name)
			}
		}
	}
	return errors.Join(errs...)
}

// Attachment is one of the programs' attachments.
type Attachment struct {
	IfIndex int    `json:"ifindex"`
	Dir     string `json:"direction"`
	Mode    string `json:"mode"`
}

// Attachments lists what this process attached.
func (p *Programs) Attachments() []Attachment {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Attachment
	for name := range p.links {
		if idx, dir, ok := parseAttachmentName(name); ok {
			out = append(out, Attachment{IfIndex: idx, Dir: dir, Mode: string(loader.AttachTCX)})
		}
	}
	for name := range p.filters {
		if idx, dir, ok := parseAttachmentName(name); ok {
			out = append(out, Attachment{IfIndex: idx, Dir: dir, Mode: string(loader.AttachTC)})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].IfIndex != out[j].IfIndex {
			return out[i].IfIndex < out[j].IfIndex
		}
		return out[i].Dir < out[j].Dir
	})
	return out
}

// Kept counts the attachments of an earlier run taken over.
func (p *Programs) Kept() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kept
}

// Close releases this process's handles: pinned links and tc filters keep
// the programs attached.
func (p *Programs) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, lk := range p.links {
		lk.Close()
		delete(p.links, name)
	}
	if p.nl != nil {
		p.nl.Close()
		p.nl = nil
	}
	p.toNetdev.Close()
	p.fromNet.Close()
	p.fromWG.Close()
	p.toWG.Close()
}
