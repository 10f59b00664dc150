// Package prefilter is the kernel side of the XDP prefilter
// (bpf/bpf_xdp.c): its pinned maps (the deny list's two LPM tries and the
// per-CPU drop counters) and its program, attached to host devices with
// pinned XDP links so that it keeps dropping while the agent is down.
package prefilter

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/datapath/bpf"
)

// Stat slots of tdr_prefilter_stats_v1 (PREFILTER_STAT_*, bpf/lib/prefilter.h).
const (
	statIPv4 = 0
	statIPv6 = 1
)

// MaxEntries is each family's capacity (PREFILTER_MAX_ENTRIES).
const MaxEntries = 16384

// Counters are the drops the program counted, summed over CPUs.
type Counters struct {
	IPv4Packets, IPv4Bytes uint64
	IPv6Packets, IPv6Bytes uint64
}

// Packets is the drops of both families.
func (c Counters) Packets() uint64 { return c.IPv4Packets + c.IPv6Packets }

// Datapath is the prefilter's maps and program under one BPF root.
type Datapath struct {
	root string
	log  *slog.Logger
	objs bpf.XdpObjects

	mu    sync.Mutex
	links map[int]*link.Link
}

// Dir is the prefilter's directory under a node's BPF root: its maps and
// links are pinned there, apart from the pod datapath's, whose loader
// removes the tdr_ maps of the root that its own object lacks.
func Dir(root string) string { return filepath.Join(root, "prefilter") }

// Open loads the program and opens (or creates) its maps pinned under
// the node's BPF root (in Dir): a deny list an earlier run left is the
// maps' content until the reconciler says otherwise.
func Open(bpfRoot string, log *slog.Logger) (*Datapath, error) {
	// The agent opens the prefilter while the hive is built, before the
	// loader's start mounts bpffs: on a fresh machine nothing is mounted
	// yet (the agent failed to start with --enable-xdp-prefilter there).
	if _, err := bpffs.Prepare(bpfRoot); err != nil {
		return nil, fmt.Errorf("prefilter: %w", err)
	}
	root := Dir(bpfRoot)
	if err := os.MkdirAll(linksDir(root), 0o700); err != nil {
		return nil, fmt.Errorf("prefilter: create %s: %w", linksDir(root), err)
	}
	d := &Datapath{root: root, log: log, links: map[int]*link.Link{}}
	if err := bpf.LoadXdpObjects(&d.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: root}}); err != nil {
		return nil, fmt.Errorf("prefilter: load bpf_xdp.o under %s: %w", root, err)
	}
	return d, nil
}

// Close releases the program and maps (pins and links stay).
func (d *Datapath) Close() {
	d.mu.Lock()
	for _, l := range d.links {
		(*l).Close()
	}
	d.links = map[int]*link.Link{}
	d.mu.Unlock()
	_ = d.objs.Close()
}

// XDP is the XDP program (for tests and the benchmark).
func (d *Datapath) XDP() *ebpf.Program { return d.objs.XdpPrefilter }

// TC is the same check as a tc program, the benchmark's baseline.
func (d *Datapath) TC() *ebpf.Program { return d.objs.TcPrefilter }

func key4(p netip.Prefix) bpf.XdpPrefilter4Key {
	return bpf.XdpPrefilter4Key{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()}
}

func key6(p netip.Prefix) bpf.XdpPrefilter6Key {
	return bpf.XdpPrefilter6Key{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}
}

// Put adds a denied prefix (masked; an IPv4-mapped IPv6 prefix is refused
// by the caller's validation, not here).
func (d *Datapath) Put(p netip.Prefix) error {
	p = p.Masked()
	one := uint8(1)
	var err error
	if p.Addr().Is4() {
		err = d.objs.TdrPrefilter4V1.Put(key4(p), one)
	} else {
		err = d.objs.TdrPrefilter6V1.Put(key6(p), one)
	}
	if err != nil {
		return fmt.Errorf("put %s into the prefilter map: %w", p, err)
	}
	return nil
}

// Delete removes a prefix; an absent one is no error.
func (d *Datapath) Delete(p netip.Prefix) error {
	p = p.Masked()
	var err error
	if p.Addr().Is4() {
		err = d.objs.TdrPrefilter4V1.Delete(key4(p))
	} else {
		err = d.objs.TdrPrefilter6V1.Delete(key6(p))
	}
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete %s from the prefilter map: %w", p, err)
	}
	return nil
}

// Prefixes lists what both maps hold.
func (d *Datapath) Prefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	var k4 bpf.XdpPrefilter4Key
	var v uint8
	it := d.objs.TdrPrefilter4V1.Iterate()
	for it.Next(&k4, &v) {
		out = append(out, netip.PrefixFrom(netip.AddrFrom4(k4.Addr), int(k4.Prefixlen)))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list tdr_prefilter4_v1: %w", err)
	}
	var k6 bpf.XdpPrefilter6Key
	it = d.objs.TdrPrefilter6V1.Iterate()
	for it.Next(&k6, &v) {
		out = append(out, netip.PrefixFrom(netip.AddrFrom16(k6.Addr), int(k6.Prefixlen)))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list tdr_prefilter6_v1: %w", err)
	}
	return out, nil
}

// Counters sums the per-CPU drop counters.
func (d *Datapath) Counters() (Counters, error) {
	var c Counters
	for _, slot := range []uint32{statIPv4, statIPv6} {
		var per []bpf.XdpPrefilterStat
		if err := d.objs.TdrPrefilterStatsV1.Lookup(slot, &per); err != nil {
			return Counters{}, fmt.Errorf("read prefilter counters: %w", err)
		}
		for _, s := range per {
			if slot == statIPv4 {
				c.IPv4Packets += s.Packets
				c.IPv4Bytes += s.Bytes
			} else {
				c.IPv6Packets += s.Packets
				c.IPv6Bytes += s.Bytes
			}
		}
	}
	return c, nil
}

func linksDir(root string) string { return filepath.Join(root, "links") }

const linkPrefix = "xdp-prefilter-dev"

func linkPin(root string, ifindex int) string {
	return filepath.Join(linksDir(root), linkPrefix+strconv.Itoa(ifindex))
}

// Attach attaches the program to a device (driver mode where the device
// has it, else generic), or updates the pinned link an earlier run left
// on it to this program.
func (d *Datapath) Attach(ifindex int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if l, ok := d.links[ifindex]; ok {
		return (*l).Update(d.objs.XdpPrefilter)
	}
	pin := linkPin(d.root, ifindex)
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		if info, ierr := l.Info(); ierr == nil && info.XDP() != nil && int(info.XDP().Ifindex) == ifindex {
			if err := l.Update(d.objs.XdpPrefilter); err != nil {
				l.Close()
				return fmt.Errorf("update pinned XDP link of device %d: %w", ifindex, err)
			}
			d.links[ifindex] = &l
			return nil
		}
		// The device it was on is gone (the index may be reused).
		_ = l.Unpin()
		l.Close()
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: d.objs.XdpPrefilter, Interface: ifindex})
	if err != nil {
		return fmt.Errorf("attach XDP prefilter to device %d: %w", ifindex, err)
	}
	_ = os.Remove(pin)
	if err := l.Pin(pin); err != nil {
		l.Close()
		return fmt.Errorf("pin XDP link %s: %w", pin, err)
	}
	d.links[ifindex] = &l
	return nil
}

// Attached lists the devices the pinned links are on.
func (d *Datapath) Attached() []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []int
	for i := range d.links {
		out = append(out, i)
	}
	return out
}

// DetachOthers removes the pinned links of devices not in keep (nil: all):
// devices an earlier run attached to that are no longer configured.
func (d *Datapath) DetachOthers(keep map[int]bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	entries, err := os.ReadDir(linksDir(d.root))
	if err != nil {
		return fmt.Errorf("read pinned links: %w", err)
	}
	var errs []error
	for _, e := range entries {
		idx, err := strconv.Atoi(strings.TrimPrefix(e.Name(), linkPrefix))
		if !strings.HasPrefix(e.Name(), linkPrefix) || err != nil || keep[idx] {
			continue
		}
		if l, ok := d.links[idx]; ok {
			delete(d.links, idx)
			(*l).Close()
		}
		l, err := link.LoadPinnedLink(filepath.Join(linksDir(d.root), e.Name()), nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("load pinned link %s: %w", e.Name(), err))
			continue
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", e.Name(), err))
		}
		l.Close()
		d.log.Info("Detached the XDP prefilter from a device no longer configured", "ifindex", idx)
	}
	return errors.Join(errs...)
}

// DetachPinned removes every pinned XDP prefilter link under the node's
// BPF root without loading the program (the prefilter was turned off).
func DetachPinned(bpfRoot string) error {
	root := Dir(bpfRoot)
	entries, err := os.ReadDir(linksDir(root))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read pinned links: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), linkPrefix) {
			continue
		}
		l, err := link.LoadPinnedLink(filepath.Join(linksDir(root), e.Name()), nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("load pinned link %s: %w", e.Name(), err))
			continue
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", e.Name(), err))
		}
		l.Close()
	}
	return errors.Join(errs...)
}
