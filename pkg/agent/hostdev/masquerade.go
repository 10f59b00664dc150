package hostdev

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"

	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/nodemanager"
)

// Masquerade runs the host device programs on the node: it picks the
// devices, writes each device's node address (tdr_hostdev_v1) and the
// non-masquerade prefixes (tdr_nomasq_v1), attaches the programs, and
// collects NAT entries with conntrack (CollectNAT, called by the agent's
// conntrack GC).
type Masquerade struct {
	cfg Config
	log *slog.Logger
	dp  *loader.Loader
	db  *statedb.DB
	// peers is the nodes table (the nodes cell's); nil: no peers' pod
	// CIDRs are kept off masquerade (tests of the programs alone).
	peers statedb.Table[*nodemanager.Peer]
	mode  loader.AttachMode
	root  string

	portMin, portMax uint16
	dsr              bool
	configured       []netip.Prefix

	mu   sync.Mutex
	prog *Programs
	// devices are the attached devices with the address each masquerades
	// to, as last written.
	devices []Device
	// peerCIDRs are the other nodes' pod CIDRs (the nodes table).
	peerCIDRs []netip.Prefix
	gc        GCStats
	lastErr   error
	// reattached counts the devices' programs the check put back.
	reattached uint64
	// l2 attaches the programs even with masquerade off: their ingress
	// answers ARP for L2 announcements (bpf/lib/arp.h).
	l2 bool
	// autoDevices takes the default routes' devices when --devices names
	// none (a node of a cluster); off, nothing attaches to the machine's
	// uplink unless asked (a standalone agent on a workstation).
	autoDevices bool
	// sysctl writes the node's network sysctls (under --procfs: an agent
	// in a container reaches the node's /proc/sys/net through a mount of
	// its own, its /proc/sys being read-only).
	sysctl linux.Sysctl
}

// Device is a device the host programs are attached to, with the
// addresses masqueraded traffic leaves with (invalid: that family is not
// masqueraded there).
type Device struct {
	Name    string     `json:"name"`
	IfIndex int        `json:"ifindex"`
	IPv4    netip.Addr `json:"ipv4"`
	IPv6    netip.Addr `json:"ipv6"`
}

// GCStats count the NAT collections.
type GCStats struct {
	Runs    int       `json:"runs"`
	Deleted int       `json:"deleted"`
	Last    time.Time `json:"last"`
	// DSRDeleted counts DSR records collected (flows other nodes sent
	// to this node's backends, whose conntrack entries are gone).
	DSRDeleted int `json:"dsr-deleted"`
}

// New returns the node's masquerade; nothing happens until Start. peers
// (in db) are the other nodes, whose pod CIDRs WatchPeers keeps off
// masquerade.
func New(cfg Config, dp *loader.Loader, db *statedb.DB, peers statedb.Table[*nodemanager.Peer], mode loader.AttachMode, bpfRoot string, log *slog.Logger) (*Masquerade, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	min, max, err := cfg.PortRange()
	if err != nil {
		return nil, err
	}
	prefixes, err := cfg.NonMasqueradePrefixes()
	if err != nil {
		return nil, err
	}
	dsr, err := cfg.DSR()
	if err != nil {
		return nil, err
	}
	return &Masquerade{cfg: cfg, log: log, dp: dp, db: db, peers: peers, mode: mode, root: bpfRoot, portMin: min, portMax: max, dsr: dsr, configured: prefixes}, nil
}

// SetL2Announcements makes Start attach the programs even with masquerade
// off (called before Start): L2 announcements need their ARP responder.
func (m *Masquerade) SetL2Announcements(on bool) { m.l2 = on }

// SetAutoDevices makes an empty Config.Devices mean the devices of the
// default routes (called before Start; the agent sets it in Kubernetes
// mode). Without it, an empty Devices attaches nothing and reserves no
// port: a standalone agent leaves the machine's uplink alone.
func (m *Masquerade) SetAutoDevices(on bool) { m.autoDevices = on }

// SetProcFS makes the node's sysctls be written under procfs/sys
// (--procfs; called before Start).
func (m *Masquerade) SetProcFS(procfs string) { m.sysctl.ProcFS = procfs }

// DeviceNames are the devices the programs are attached to.
func (m *Masquerade) DeviceNames() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, d := range m.devices {
		out = append(out, d.Name)
	}
	return out
}

// Start attaches the host programs to the devices (or, with masquerade,
// services from outside and L2 announcements all off, removes what an
// earlier run attached) and writes their maps.
func (m *Masquerade) Start(ctx context.Context) error {
	nat := m.dp.Maps().NAT
	if !m.cfg.HostPrograms() && !m.l2 {
		return m.disable(nat)
	}
	devs, err := m.resolveDevices()
	if err != nil {
		return err
	}
	// The ports are reserved only where masquerade has a device to use
	// them on.
	if m.cfg.EnableMasquerade && len(devs) > 0 {
		if err := reservePorts(m.sysctl, m.portMin, m.portMax); err != nil {
			m.log.Warn("Cannot reserve the masquerade ports from the host's ephemeral ports", "error", err)
		}
	}
	if err := m.writeNoMasquerade(); err != nil {
		return err
	}
	if len(devs) == 0 {
		// Nothing to attach to: loading the programs would cost their
		// verification (30–40 ms of the agent's start) for no device.
		// What an earlier run attached elsewhere is removed all the same.
		if err := m.disable(nat); err != nil {
			m.log.Warn("Cannot detach the host programs from former devices", "error", err)
		}
		reason := "no default route"
		if !m.autoDevices {
			reason = "standalone agent: --devices names none"
		}
		m.log.Info("Host device programs not loaded: no device", "reason", reason, "masquerade", m.cfg.EnableMasquerade, "node-port", m.cfg.EnableNodePort)
		return nil
	}
	prog, err := Load(Options{BPFRoot: m.root, AttachMode: m.mode, PortMin: m.portMin, PortMax: m.portMax, DSR: m.dsr, NoNodePort: !m.cfg.EnableNodePort, Maps: m.dp.MapReplacements()}, m.log)
	if err != nil {
		return err
	}
	keep := map[int]bool{}
	for _, d := range devs {
		// The address first: the program reads it from its first packet.
		if err := nat.SetHostDevice(maps.HostDevice{IfIndex: d.IfIndex, MasqIPv4: d.IPv4, MasqIPv6: d.IPv6, NoMasquerade: !m.cfg.EnableMasquerade}); err != nil {
			prog.Close()
			return err
		}
		if err := prog.Attach(d.IfIndex); err != nil {
			prog.Close()
			return fmt.Errorf("attach the host programs to %s: %w", d.Name, err)
		}
		keep[d.IfIndex] = true
	}
	if err := prog.DetachOthers(keep); err != nil {
		m.log.Warn("Cannot detach the host programs from former devices", "error", err)
	}
	m.dropOtherDevices(nat, keep)
	m.mu.Lock()
	m.prog, m.devices = prog, devs
	m.mu.Unlock()
	m.log.Info("Host device programs attached", "masquerade", m.cfg.EnableMasquerade, "node-port", m.cfg.EnableNodePort, "l2-announcements", m.l2, "devices", devs, "port-range", m.cfg.MasqueradePortRange, "attach-mode", m.mode,
		"lb-mode", m.cfg.LBMode, "kept-from-previous-run", prog.Kept())
	return nil
}

// disable removes what an earlier run with the host programs left: the devices'
// entries (the programs then translate nothing) and their pinned links.
func (m *Masquerade) disable(nat *maps.NATMaps) error {
	m.dropOtherDevices(nat, nil)
	return errors.Join(detachPinned(m.root, m.log), removeFilters(nil, nil, m.log))
}

func (m *Masquerade) dropOtherDevices(nat *maps.NATMaps, keep map[int]bool) {
	devs, err := nat.HostDevices()
	if err != nil {
		m.log.Warn("Cannot list host devices", "error", err)
		return
	}
	for _, d := range devs {
		if !keep[d.IfIndex] {
			if err := nat.DeleteHostDevice(d.IfIndex); err != nil {
				m.log.Warn("Cannot remove a former host device", "ifindex", d.IfIndex, "error", err)
			}
		}
	}
}

// resolveDevices finds the configured devices (default, with
// autoDevices: those of the default routes, IPv4 or IPv6; without: none)
// and the addresses each masquerades to: its first global IPv4 and IPv6
// ones.
func (m *Masquerade) resolveDevices() ([]Device, error) {
	names := m.cfg.Devices
	if len(names) == 0 && m.autoDevices {
		routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask)) && r.LinkIndex > 0 {
				l, err := netlink.LinkByIndex(r.LinkIndex)
				if err == nil && !slices.Contains(names, l.Attrs().Name) {
					names = append(names, l.Attrs().Name)
				}
			}
		}
		if len(names) == 0 {
			m.log.Info("No default route: masquerade has no device (--devices names them)")
		}
	}
	var out []Device
	for _, n := range names {
		l, err := netlink.LinkByName(n)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", n, err)
		}
		d := Device{Name: n, IfIndex: l.Attrs().Index}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", n, err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok || !ip.Unmap().IsGlobalUnicast() {
				continue
			}
			ip = ip.Unmap()
			if ip.Is4() && !d.IPv4.IsValid() {
				d.IPv4 = ip
			} else if ip.Is6() && !d.IPv6.IsValid() {
				d.IPv6 = ip
			}
		}
		if !d.IPv4.IsValid() && !d.IPv6.IsValid() {
			m.log.Warn("Device has no global address: pod traffic through it is not masqueraded", "device", n)
		}
		out = append(out, d)
	}
	return out, nil
}

func isZeroMask(m []byte) bool {
	for _, b := range m {
		if b != 0 {
			return false
		}
	}
	return true
}

// writeNoMasquerade writes the configured prefixes and the peers' pod
// CIDRs.
func (m *Masquerade) writeNoMasquerade() error {
	m.mu.Lock()
	want := append(slices.Clone(m.configured), m.peerCIDRs...)
	m.mu.Unlock()
	return m.dp.Maps().NAT.SetNoMasquerade(want)
}

// WatchPeers keeps the other nodes' pod CIDRs among the non-masquerade
// prefixes, from the nodes table (pkg/nodemanager), until ctx ends: each
// change of the table is written as it comes (its watch channel). Nodes a
// masqueraded pod might reach by their pod addresses before the ipcache
// knows the pod's identity.
func (m *Masquerade) WatchPeers(ctx context.Context) {
	if m.db == nil || m.peers == nil || !m.cfg.EnableMasquerade {
		return
	}
	followPeerCIDRs(ctx, m.db, m.peers, func(cidrs []netip.Prefix) {
		m.mu.Lock()
		changed := !slices.Equal(cidrs, m.peerCIDRs)
		m.peerCIDRs = cidrs
		m.mu.Unlock()
		if changed {
			if err := m.writeNoMasquerade(); err != nil {
				m.log.Warn("Cannot write the non-masquerade prefixes", "error", err)
			}
		}
	})
}

// followPeerCIDRs calls apply with the peers' pod CIDRs (sorted) now and
// again each time the table changes, woken by the table's watch channel,
// until ctx ends.
func followPeerCIDRs(ctx context.Context, db *statedb.DB, peers statedb.Table[*nodemanager.Peer], apply func([]netip.Prefix)) {
	for {
		objs, watch := peers.AllWatch(db.ReadTxn())
		var cidrs []netip.Prefix
		for p := range objs {
			cidrs = append(cidrs, p.PodCIDRs...)
		}
		sort.Slice(cidrs, func(i, j int) bool { return cidrs[i].String() < cidrs[j].String() })
		apply(cidrs)
		select {
		case <-ctx.Done():
			return
		case <-watch:
		}
	}
}

// RefreshAddresses rewrites a device's address (masquerade's, and
// NodePort's source NAT's) when it changed (a node address that moved):
// called on a timer.
func (m *Masquerade) RefreshAddresses() {
	if !m.cfg.HostPrograms() {
		return
	}
	devs, err := m.resolveDevices()
	if err != nil {
		m.log.Warn("Cannot read the masquerade devices", "error", err)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range devs {
		for i, old := range m.devices {
			if old.IfIndex == d.IfIndex && (old.IPv4 != d.IPv4 || old.IPv6 != d.IPv6) {
				if err := m.dp.Maps().NAT.SetHostDevice(maps.HostDevice{IfIndex: d.IfIndex, MasqIPv4: d.IPv4, MasqIPv6: d.IPv6, NoMasquerade: !m.cfg.EnableMasquerade}); err != nil {
					m.log.Warn("Cannot write a device's new address", "device", d.Name, "error", err)
					continue
				}
				m.log.Info("Masquerade address changed", "device", d.Name, "from", []netip.Addr{old.IPv4, old.IPv6}, "to", []netip.Addr{d.IPv4, d.IPv6})
				m.devices[i] = d
			}
		}
	}
}

// CheckAttachments looks in the kernel for every device's programs and
// attaches again what something else removed (see Programs.Check).
func (m *Masquerade) CheckAttachments() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prog == nil {
		return
	}
	for _, d := range m.devices {
		reattached, err := m.prog.Check(d.IfIndex)
		switch {
		case err != nil:
			m.log.Warn("Cannot check or attach again a device's host programs", "device", d.Name,
				"found-removed", reattached, "error", err)
		case reattached:
			m.reattached++
			m.log.Warn("Attached the host programs of a device again: something else had removed them",
				"device", d.Name, "ifindex", d.IfIndex)
		}
	}
}

// AttachWireGuard gives the WireGuard device its programs (see
// Programs.AttachWireGuard); nothing without the host programs (no NAT
// mapping is made then, so none has replies to translate back, and no
// uplink enforces the host firewall either).
func (m *Masquerade) AttachWireGuard(ifindex int) error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prog == nil {
		return nil
	}
	attached, err := m.prog.AttachWireGuard(ifindex)
	if attached {
		m.log.Info("WireGuard device given its programs (NodePort reverse translation, host firewall)", "ifindex", ifindex, "attach-mode", m.mode)
	}
	if err != nil {
		return fmt.Errorf("attach the WireGuard programs to device %d: %w", ifindex, err)
	}
	return nil
}

// CollectNAT deletes the NAT entries and DSR records of flows conntrack
// no longer has: the agent's conntrack GC calls it after each sweep.
func (m *Masquerade) CollectNAT() (maps.NATSweep, error) {
	if m == nil {
		return maps.NATSweep{}, nil
	}
	dm := m.dp.Maps()
	now := maps.MonotonicNow()
	res, err := dm.NAT.NATMap().CollectNAT(dm.CTMap(), now)
	// DSR records of this node's backends go with conntrack the same way.
	dsr, derr := dm.NAT.DSRMap().CollectDSR(dm.CTMap(), now)
	err = errors.Join(err, derr)
	m.mu.Lock()
	m.gc.Runs++
	m.gc.Deleted += res.Deleted
	m.gc.DSRDeleted += dsr.Deleted
	m.gc.Last = time.Now()
	m.lastErr = err
	m.mu.Unlock()
	return res, err
}

// Stop releases this process's handles; the attachments stay.
func (m *Masquerade) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prog != nil {
		m.prog.Close()
		m.prog = nil
	}
}

// reservePorts adds the range to the host's ip_local_reserved_ports (of
// this network namespace), so the host's own connections never pick a
// masquerade port as their ephemeral port.
func reservePorts(sc linux.Sysctl, min, max uint16) error {
	key := []string{"net", "ipv4", "ip_local_reserved_ports"}
	have, err := sc.Get(key...)
	if err != nil {
		return err
	}
	r := fmt.Sprintf("%d-%d", min, max)
	if min == max {
		r = strconv.Itoa(int(min))
	}
	for _, f := range strings.Split(have, ",") {
		if f == r {
			return nil
		}
	}
	if have != "" {
		r = have + "," + r
	}
	return sc.Set(r, key...)
}

// detachPinned unpins every host device link under root.
func detachPinned(root string, log *slog.Logger) error {
	entries, err := os.ReadDir(linksDir(root))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range entries {
		if _, _, ok := parseAttachmentName(e.Name()); !ok && !isWireGuardAttachment(e.Name()) {
			continue
		}
		if err := os.Remove(filepath.Join(linksDir(root), e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("Detached the host programs of a previous run (host programs off, or no device)", "attachment", e.Name())
	}
	return errors.Join(errs...)
}
