// Package sockterm moves sockets off a service backend that is gone: the
// connected UDP and TCP sockets that the socket load-balancer
// (pkg/datapath/socklb) translated to that backend, for that service, are
// destroyed with BPF socket iterators and the bpf_sock_destroy kfunc
// (bpf/bpf_sock_term.c, Linux 6.5+). A connected UDP socket's next call
// fails with ECONNABORTED and its reconnect is translated again, to a live
// backend; a TCP connection is aborted with a reset instead of hanging.
//
// A socket iterator walks the sockets of the network namespace of the
// thread that opens it, so a sweep enters every network namespace of the
// processes under the socket load-balancer's cgroup (the only processes
// whose sockets it translates) and the agent's own.
package sockterm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/namedns"
)

// Config says where the node's maps are and whose sockets to sweep.
type Config struct {
	// BPFRoot is the node's BPF root: the socket load-balancer's records
	// (tdr_lb_sock_revnat_v1) are read through its pins.
	BPFRoot string
	// CgroupPath is the cgroup v2 directory the socket load-balancer is
	// attached to: the network namespaces of its processes are swept.
	CgroupPath string
}

// Target is a backend that left a service frontend.
type Target struct {
	Backend netip.AddrPort
	// Proto is the frontend's L4 protocol (maps.ProtoTCP or ProtoUDP;
	// others have no socket to sweep).
	Proto uint8
	// RevNATID is the frontend's reverse NAT ID: only sockets translated
	// for this frontend are destroyed (the backend may still serve
	// another).
	RevNATID uint32
}

func (t Target) String() string {
	return fmt.Sprintf("%s/%d (reverse NAT %d)", t.Backend, t.Proto, t.RevNATID)
}

// Result counts what a sweep did.
type Result struct {
	// Namespaces swept.
	Namespaces int
	// Destroyed sockets, and those bpf_sock_destroy refused.
	Destroyed, Failed int
}

// Terminator destroys sockets translated to removed backends.
type Terminator struct {
	cfg Config
	log *slog.Logger

	// mu serializes sweeps: the target map holds one sweep's targets.
	mu   sync.Mutex
	objs bpf.SockTermObjects
	udp  *link.Iter
	tcp  *link.Iter

	// pending holds the targets requested and not swept yet; wake has
	// room for one signal so Request never blocks.
	pendingMu sync.Mutex
	pending   []Target
	wake      chan struct{}

	totalMu sync.Mutex
	total   Result
	sweeps  int
}

// New returns a terminator; nothing is loaded until Start.
func New(cfg Config, log *slog.Logger) *Terminator {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Terminator{cfg: cfg, log: log, wake: make(chan struct{}, 1)}
}

// Start loads the iterators with the node's pinned maps and attaches
// them (an iterator link is not attached to anything: it is opened per
// sweep).
func (t *Terminator) Start() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cfg.CgroupPath == "" {
		return errors.New("socket termination: no cgroup path")
	}
	spec, err := bpf.LoadSockTerm()
	if err != nil {
		return fmt.Errorf("load socket termination spec: %w", err)
	}
	// The pod programs' loader sized the shared maps (--bpf-lb-map-max).
	maps.AdoptPinnedSizes(spec, t.cfg.BPFRoot)
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: t.cfg.BPFRoot}}
	if err := spec.LoadAndAssign(&t.objs, opts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return fmt.Errorf("load socket termination (needs Linux 6.5+ for bpf_sock_destroy): %w\n%+v", err, verr)
		}
		return fmt.Errorf("load socket termination (needs Linux 6.5+ for bpf_sock_destroy): %w", err)
	}
	if t.udp, err = link.AttachIter(link.IterOptions{Program: t.objs.SockTermUdp}); err != nil {
		t.objs.Close()
		return fmt.Errorf("attach the UDP socket iterator: %w", err)
	}
	if t.tcp, err = link.AttachIter(link.IterOptions{Program: t.objs.SockTermTcp}); err != nil {
		t.udp.Close()
		t.objs.Close()
		return fmt.Errorf("attach the TCP socket iterator: %w", err)
	}
	return nil
}

// Close releases the iterators and the object.
func (t *Terminator) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.udp != nil {
		t.udp.Close()
		t.udp = nil
	}
	if t.tcp != nil {
		t.tcp.Close()
		t.tcp = nil
	}
	return t.objs.Close()
}

// Request queues targets for the next sweep of Run and returns at once
// (the LB maps reconciler calls it after it wrote the frontend without
// them, so a socket that reconnects is translated to a live backend).
func (t *Terminator) Request(targets ...Target) {
	if len(targets) == 0 {
		return
	}
	t.pendingMu.Lock()
	t.pending = append(t.pending, targets...)
	t.pendingMu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// Run sweeps for the requested targets until ctx is done: every request
// is swept promptly (targets requested during a sweep go in the next).
func (t *Terminator) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.wake:
		}
		t.pendingMu.Lock()
		targets := t.pending
		t.pending = nil
		t.pendingMu.Unlock()
		if len(targets) == 0 {
			continue
		}
		res, err := t.Terminate(targets)
		if err != nil {
			t.log.Warn("Destroying sockets of removed backends failed", "targets", len(targets), "error", err)
		}
		if res.Destroyed > 0 || res.Failed > 0 {
			t.log.Info("Destroyed sockets translated to removed backends", "targets", len(targets),
				"namespaces", res.Namespaces, "destroyed", res.Destroyed, "failed", res.Failed)
		}
	}
}

// Totals returns the sum of every sweep's result and the number of
// sweeps.
func (t *Terminator) Totals() (Result, int) {
	t.totalMu.Lock()
	defer t.totalMu.Unlock()
	return t.total, t.sweeps
}

// Terminate destroys, in every network namespace of the cgroup's
// processes and in the caller's, the connected sockets that the socket
// load-balancer translated to one of targets for its frontend.
func (t *Terminator) Terminate(targets []Target) (Result, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var res Result
	if t.udp == nil {
		return res, errors.New("socket termination is not started")
	}
	keys := make([]bpf.SockTermLbTermKey, 0, len(targets))
	for _, tg := range targets {
		if tg.Proto != maps.ProtoTCP && tg.Proto != maps.ProtoUDP {
			continue
		}
		keys = append(keys, termKey(tg))
	}
	if len(keys) == 0 {
		return res, nil
	}
	one := uint8(1)
	var errs []error
	for _, k := range keys {
		if err := t.objs.TdrLbTermTargets.Update(&k, &one, ebpf.UpdateAny); err != nil {
			errs = append(errs, fmt.Errorf("socket termination target: %w", err))
		}
	}
	// The targets are cleared whatever happens: the next sweep must not
	// destroy sockets of a backend that came back.
	defer func() {
		for _, k := range keys {
			_ = t.objs.TdrLbTermTargets.Delete(&k)
		}
	}()

	sweep := func() error {
		var errs []error
		for _, it := range []*link.Iter{t.udp, t.tcp} {
			d, f, err := sweepOne(it)
			res.Destroyed += d
			res.Failed += f
			if err != nil {
				errs = append(errs, err)
			}
		}
		res.Namespaces++
		return errors.Join(errs...)
	}
	// The agent's own namespace (host processes outside pods): this
	// thread's, which namespaces() leaves out, so the thread stays put.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := sweep(); err != nil {
		errs = append(errs, fmt.Errorf("sweep the agent's network namespace: %w", err))
	}
	nsPaths, err := t.namespaces()
	if err != nil {
		errs = append(errs, err)
	}
	for _, p := range nsPaths {
		err := namedns.InNetns(p, sweep)
		// A process that exited meanwhile took its namespace's sockets
		// with it (or its namespace is still swept through another).
		if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("sweep %s: %w", p, err))
		}
	}
	t.totalMu.Lock()
	t.total.Namespaces += res.Namespaces
	t.total.Destroyed += res.Destroyed
	t.total.Failed += res.Failed
	t.sweeps++
	t.totalMu.Unlock()
	return res, errors.Join(errs...)
}

func termKey(tg Target) bpf.SockTermLbTermKey {
	k := bpf.SockTermLbTermKey{Port: htons(tg.Backend.Port()), Proto: tg.Proto, RevNatId: tg.RevNATID}
	a := tg.Backend.Addr().Unmap()
	if a.Is4() {
		b := a.As4()
		copy(k.Addr[:], b[:])
		k.Family = maps.FamilyV4
	} else {
		b := a.As16()
		copy(k.Addr[:], b[:])
		k.Family = maps.FamilyV6
	}
	return k
}

// htons gives the port as the datapath stores it (network order, read as
// a host-order u16).
func htons(p uint16) uint16 { return p<<8 | p>>8 }

// recordSize is sizeof(struct lb_term_record) in bpf_sock_term.c.
const recordSize = 16

// sweepOne opens the iterator in the calling thread's network namespace
// and runs it to the end; it returns the sockets destroyed and refused.
func sweepOne(it *link.Iter) (destroyed, failed int, err error) {
	r, err := it.Open()
	if err != nil {
		return 0, 0, fmt.Errorf("open socket iterator: %w", err)
	}
	defer r.Close()
	out, err := io.ReadAll(r)
	if err != nil {
		return 0, 0, fmt.Errorf("read socket iterator: %w", err)
	}
	for len(out) >= recordSize {
		ret := int32(binary.NativeEndian.Uint32(out[8:12]))
		if ret == 0 {
			destroyed++
		} else {
			failed++
		}
		out = out[recordSize:]
	}
	return destroyed, failed, nil
}

// namespaces returns one /proc/<pid>/ns/net path per distinct network
// namespace of the processes in the cgroup and its descendants, other
// than the calling thread's (the one swept first). The thread's, not the
// process's (/proc/self is the main thread's): in a process whose threads
// are not all in one network namespace, leaving out the main thread's
// left out a namespace that held sockets to destroy.
func (t *Terminator) namespaces() ([]string, error) {
	var self unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &self); err != nil {
		return nil, fmt.Errorf("own network namespace: %w", err)
	}
	seen := map[uint64]bool{self.Ino: true}
	var paths []string
	err := filepath.WalkDir(t.cfg.CgroupPath, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			// A cgroup removed during the walk.
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			p := fmt.Sprintf("/proc/%d/ns/net", pid)
			var st unix.Stat_t
			if unix.Stat(p, &st) != nil || seen[st.Ino] {
				continue
			}
			seen[st.Ino] = true
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return paths, fmt.Errorf("list the processes of %s: %w", t.cfg.CgroupPath, err)
	}
	return paths, nil
}
