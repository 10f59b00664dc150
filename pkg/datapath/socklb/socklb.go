// Package socklb loads Tendril's socket-level service load-balancer
// (bpf/bpf_sock.c) with the node's pinned maps and attaches its cgroup
// hooks (connect, sendmsg, recvmsg, getpeername; IPv4 and IPv6) to a
// cgroup v2 with pinned BPF links, so that sockets keep being translated
// while the agent is down and a restarted agent swaps the programs in
// place.
//
// The object declares the same maps as the pod programs (bpf/lib/maps.h
// includes bpf/lib/lbmaps.h): loaded with the same BPF root, it shares
// their kernel maps by pinned name, and the pod loader's cleanup of pins
// of other layouts knows every map it uses.
package socklb

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// Config says where the maps are and which cgroup to attach to.
type Config struct {
	// BPFRoot is the node's BPF root (the pod loader's --bpf-root): the
	// maps are shared through it, and the links are pinned under
	// <BPFRoot>/socklb.
	BPFRoot string
	// CgroupPath is the cgroup v2 directory whose sockets (and its
	// descendants') are translated: the node's root cgroup for an agent,
	// a child cgroup in tests.
	CgroupPath string
	// TraceEvents reports each connection translated at connect as a
	// socket translation event (EVENT_SOCK_XLATE) in the events ring.
	TraceEvents bool
}

// hook is one attachment: a program of the object and its attach type.
type hook struct {
	name   string
	attach ebpf.AttachType
	prog   func(*bpf.SockPrograms) *ebpf.Program
}

var hooks = []hook{
	{"connect4", ebpf.AttachCGroupInet4Connect, func(p *bpf.SockPrograms) *ebpf.Program { return p.SockConnect4 }},
	{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, func(p *bpf.SockPrograms) *ebpf.Program { return p.SockSendmsg4 }},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, func(p *bpf.SockPrograms) *ebpf.Program { return p.SockRecvmsg4 }},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, func(p *bpf.SockPrograms) *ebpf.Program { return p.SockGetpeername4 }},
	{"connect6", ebpf.AttachCGroupInet6Connect, func(p *bpf.SockPrograms) *ebpf.Program { return p.SockConnect6 }},
	{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg, func(p *bpf.SockPrograms) *ebpf.Program { return p.SockSendmsg6 }},
	{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, func(p *bpf.SockPrograms) *ebpf.Program { return p.SockRecvmsg6 }},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername, func(p *bpf.SockPrograms) *ebpf.Program { return p.SockGetpeername6 }},
}

// HookNames are the hooks attached, in order; their links are pinned
// under <BPFRoot>/socklb by these names.
func HookNames() []string {
	out := make([]string, len(hooks))
	for i, h := range hooks {
		out[i] = h.name
	}
	return out
}

// SockLB is the loaded socket load-balancer.
type SockLB struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	objs  bpf.SockObjects
	links map[string]link.Link
	// kept counts hooks whose pinned link of an earlier run got this
	// run's program in place.
	kept int
}

// New returns a socket load-balancer; nothing is loaded until Start.
func New(cfg Config, log *slog.Logger) *SockLB {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &SockLB{cfg: cfg, log: log, links: map[string]link.Link{}}
}

func (s *SockLB) linksDir() string { return filepath.Join(s.cfg.BPFRoot, "socklb") }

// Start loads the programs with the pinned maps (creating those not
// pinned yet) and attaches every hook to the cgroup: a hook pinned by an
// earlier run on the same cgroup gets this run's program in place (the
// link stays: no socket is ever missed); one pinned on another cgroup is
// replaced after the new one is attached.
func (s *SockLB) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.CgroupPath == "" {
		return errors.New("socket load-balancing: no cgroup path")
	}
	if _, err := bpffs.Prepare(s.cfg.BPFRoot); err != nil {
		return err
	}
	if err := os.MkdirAll(s.linksDir(), 0o750); err != nil {
		return fmt.Errorf("create %s: %w", s.linksDir(), err)
	}
	cgID, err := cgroupID(s.cfg.CgroupPath)
	if err != nil {
		return err
	}
	spec, err := bpf.LoadSock()
	if err != nil {
		return fmt.Errorf("load socket load-balancer spec: %w", err)
	}
	if s.cfg.TraceEvents {
		vs, ok := spec.Variables["TRACE_EVENTS"]
		if !ok {
			return fmt.Errorf("socket load-balancer object has no constant TRACE_EVENTS")
		}
		if err := vs.Set(uint8(1)); err != nil {
			return fmt.Errorf("set TRACE_EVENTS: %w", err)
		}
	}
	// The pod programs' loader sized the shared maps (--bpf-lb-map-max).
	maps.AdoptPinnedSizes(spec, s.cfg.BPFRoot)
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: s.cfg.BPFRoot}}
	if err := spec.LoadAndAssign(&s.objs, opts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return fmt.Errorf("load socket load-balancer: %w\n%+v", err, verr)
		}
		return fmt.Errorf("load socket load-balancer (are the pinned maps under %s of this version?): %w", s.cfg.BPFRoot, err)
	}
	for _, h := range hooks {
		if err := s.attachLocked(h, cgID); err != nil {
			return fmt.Errorf("attach socket hook %s to %s: %w", h.name, s.cfg.CgroupPath, err)
		}
	}
	s.log.Info("Socket load-balancing attached", "cgroup", s.cfg.CgroupPath, "hooks", len(hooks), "kept", s.kept)
	return nil
}

func (s *SockLB) attachLocked(h hook, cgID uint64) error {
	prog := h.prog(&s.objs.SockPrograms)
	pin := filepath.Join(s.linksDir(), h.name)
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		if onCgroup(old, cgID) {
			if err := old.Update(prog); err != nil {
				old.Close()
				return fmt.Errorf("update pinned link %s: %w", pin, err)
			}
			s.links[h.name] = old
			s.kept++
			return nil
		}
		// Another cgroup (the configuration changed): its pin makes way,
		// and its link, held open until the new one is attached, goes
		// with its last handle after.
		defer old.Close()
		if err := old.Unpin(); err != nil {
			return fmt.Errorf("move pinned link %s aside: %w", pin, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	lk, err := link.AttachCgroup(link.CgroupOptions{Path: s.cfg.CgroupPath, Attach: h.attach, Program: prog})
	if err != nil {
		return err
	}
	if err := lk.Pin(pin); err != nil {
		lk.Close()
		return fmt.Errorf("pin link %s: %w", pin, err)
	}
	s.links[h.name] = lk
	return nil
}

// onCgroup reports whether lk is a cgroup link attached to cgroup id.
func onCgroup(lk link.Link, id uint64) bool {
	info, err := lk.Info()
	if err != nil {
		return false
	}
	cg := info.Cgroup()
	return cg != nil && cg.CgroupId == id
}

// cgroupID is the ID of the cgroup v2 directory at path (its inode
// number, as the kernel reports it in link info).
func cgroupID(path string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", path, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return 0, fmt.Errorf("%s is not a cgroup v2 directory", path)
	}
	var s unix.Stat_t
	if err := unix.Stat(path, &s); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", path, err)
	}
	return s.Ino, nil
}

// Maps returns the load-balancing maps, as this object holds them (the
// node's pinned maps).
func (s *SockLB) Maps() *maps.LBMaps {
	o := &s.objs.SockMaps
	return &maps.LBMaps{Services4: o.TdrLb4ServicesV1, Services6: o.TdrLb6ServicesV1, Slots: o.TdrLbSlotsV1, Backends: o.TdrLbBackendsV1,
		RevNAT: o.TdrLbRevnatV1, Affinity: o.TdrLbAffinityV1, Maglev: o.TdrLbMaglevV1, SockRevNAT: o.TdrLbSockRevnatV1,
		Skip4: o.TdrLb4SkipV1, Skip6: o.TdrLb6SkipV1, SkipSrc: o.TdrLbSkipsrcV1}
}

// Metrics returns the datapath counters map (the socket hooks count
// REASON_SVC_NO_BACKEND there).
func (s *SockLB) Metrics() maps.MetricsMap {
	return (&maps.Maps{Metrics: s.objs.TdrMetricsV2}).MetricsMap()
}

// Status is what `tendril status` shows of socket load-balancing.
type Status struct {
	Cgroup string `json:"cgroup"`
	// Hooks attached by this process, and of them, kept from an earlier
	// run.
	Hooks int `json:"hooks"`
	Kept  int `json:"kept"`
}

// Status reports the attachments.
func (s *SockLB) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Status{Cgroup: s.cfg.CgroupPath, Hooks: len(s.links), Kept: s.kept}
}

// Close releases this process's handles; the pinned links keep the hooks
// attached.
func (s *SockLB) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, lk := range s.links {
		lk.Close()
		delete(s.links, name)
	}
	return s.objs.Close()
}

// Detach unpins and closes every hook's link (the hooks are detached),
// whether this process attached it or an earlier run pinned it.
func (s *SockLB) Detach() error {
	s.mu.Lock()
	var errs []error
	for _, h := range hooks {
		pin := filepath.Join(s.linksDir(), h.name)
		lk, ok := s.links[h.name]
		if !ok {
			var err error
			lk, err = link.LoadPinnedLink(pin, nil)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("open pinned link %s: %w", pin, err))
				continue
			}
		}
		if err := lk.Unpin(); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", pin, err))
		}
		lk.Close()
		delete(s.links, h.name)
	}
	s.mu.Unlock()
	return errors.Join(errs...)
}
