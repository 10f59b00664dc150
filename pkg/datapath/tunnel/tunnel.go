// Package tunnel is the kernel side of the tunnel routing mode
// (docs/routing.md): the node's tunnel device in external (collect_md)
// mode, the overlay programs of bpf/bpf_overlay.c attached to it with
// TCX, and the pod programs' tdr_tunnel_v1 entry that tells from_pod where
// the device is. The device builds and strips the outer headers; the
// programs set and read the tunnel key (the owner node, and the source's
// identity as the VNI). Everything here outlives the agent: the device,
// the pinned links and the map entry keep the overlay forwarding while
// the agent restarts.
package tunnel

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
)

// Protocol is the encapsulation between nodes.
type Protocol string

const (
	VXLAN  Protocol = "vxlan"
	Geneve Protocol = "geneve"
)

// DefaultPort is the UDP port of both protocols' devices, Cilium's (8472
// for VXLAN, the Linux kernel's historical default rather than IANA's
// 4789; Cilium uses 6081 for Geneve).
const (
	DefaultVXLANPort  uint16 = 8472
	DefaultGenevePort uint16 = 6081
)

// Overhead is the bytes the encapsulation adds to a packet: outer IPv4
// (20; IPv6, 40, when underlay6), UDP (8), the VXLAN or Geneve base header (8)
// and the inner Ethernet header (14). The pods' MTU is lowered by it.
// Tendril sets no Geneve option, so Geneve's is VXLAN's.
func Overhead(_ Protocol, underlay6 bool) int {
	if underlay6 {
		return 40 + 8 + 8 + 14
	}
	return 20 + 8 + 8 + 14
}

// DeviceName is the node's tunnel device of protocol p.
func DeviceName(p Protocol) string {
	if p == Geneve {
		return "tendril_geneve"
	}
	return "tendril_vxlan"
}

// deviceNames are every tunnel device Tendril creates (tendril_geneve is
// the kernel's Geneve device or Geneve in eBPF's carrier).
var deviceNames = [...]string{"tendril_vxlan", "tendril_geneve"}

// EnsureDevice creates the tunnel device of protocol p on UDP port port,
// in external mode (no remote, no VNI: the tunnel key of each packet says
// both), and sets it up. A device of that name with other settings (a
// different port, not external) is replaced. It returns the device.
func EnsureDevice(nl *netlink.Handle, p Protocol, port uint16) (netlink.Link, error) {
	name := DeviceName(p)
	if l, err := nl.LinkByName(name); err == nil {
		if matches(l, p, port) {
			if err := up(nl, l); err != nil {
				return nil, err
			}
			return l, nil
		}
		if err := nl.LinkDel(l); err != nil {
			return nil, fmt.Errorf("replace tunnel device %s: %w", name, err)
		}
	}
	var l netlink.Link
	switch p {
	case VXLAN:
		l = &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name}, FlowBased: true, Port: int(port)}
	case Geneve:
		l = &netlink.Geneve{LinkAttrs: netlink.LinkAttrs{Name: name}, FlowBased: true, Dport: port}
	default:
		return nil, fmt.Errorf("tunnel protocol %q: must be %s or %s", p, VXLAN, Geneve)
	}
	if err := nl.LinkAdd(l); err != nil {
		return nil, fmt.Errorf("create %s device %s on port %d: %w", p, name, port, err)
	}
	created, err := nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("read tunnel device %s: %w", name, err)
	}
	if err := up(nl, created); err != nil {
		return nil, err
	}
	return created, nil
}

// up sets the device up, without ARP: the routes to the peers' pod CIDRs
// go to it without a next hop (pkg/nodemanager's NetlinkRoutes.Device),
// and no neighbour answers on an overlay whose programs key each packet
// by its destination; without ARP the kernel takes the device's own
// address as every neighbour's (from_overlay makes the frame the
// receiving host's).
func up(nl *netlink.Handle, l netlink.Link) error {
	if err := nl.LinkSetARPOff(l); err != nil {
		return fmt.Errorf("turn ARP off on tunnel device %s: %w", l.Attrs().Name, err)
	}
	if err := nl.LinkSetUp(l); err != nil {
		return fmt.Errorf("set tunnel device %s up: %w", l.Attrs().Name, err)
	}
	return nil
}

// CarrierMTU is the carrier's MTU (EnsureCarrier): what the kernel gives
// its own Geneve device over an underlay of 1500 bytes, so the host's
// packets leave room for the headers geneve_encap pushes: 1450 over IPv4,
// 1430 over IPv6 (underlay6).
func CarrierMTU(underlay6 bool) int { return 1500 - Overhead(Geneve, underlay6) }

// EnsureCarrier creates (or keeps) the carrier of Geneve in eBPF: a
// device named as the Geneve device (tendril_geneve, so the routes to the
// peers' pod CIDRs go to it whichever Geneve the node runs) of kind ifb,
// up, without ARP, its MTU CarrierMTU(underlay6). It has no tunnel: its egress
// program (to_overlay) encapsulates what the host stack routes to it and
// redirects it out of the underlay; what the program does not redirect
// reaches the ifb's transmit, which drops a packet no tc action sent it
// (the kernel has no dummy module here, and ifb is the device that drops
// what it is given). A tendril_geneve of another kind (a kernel Geneve
// device of an earlier run) is replaced. It returns the device.
func EnsureCarrier(nl *netlink.Handle, underlay6 bool) (netlink.Link, error) {
	name := DeviceName(Geneve)
	mtu := CarrierMTU(underlay6)
	if l, err := nl.LinkByName(name); err == nil {
		if _, ok := l.(*netlink.Ifb); ok && l.Attrs().MTU == mtu {
			if err := up(nl, l); err != nil {
				return nil, err
			}
			return l, nil
		}
		if err := nl.LinkDel(l); err != nil {
			return nil, fmt.Errorf("replace %s with the Geneve carrier: %w", name, err)
		}
	}
	if err := nl.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu}}); err != nil {
		return nil, fmt.Errorf("create the Geneve carrier %s (ifb): %w", name, err)
	}
	l, err := nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("read the Geneve carrier %s: %w", name, err)
	}
	if err := up(nl, l); err != nil {
		return nil, err
	}
	return l, nil
}

// probeName and probePort are the Geneve device GeneveModule creates and
// deletes. The port is not Geneve's: the kernel allows one external
// Geneve device per port, and the node's own tendril_geneve (or another
// owner's) may hold 6081. The probe is never set up, so it opens no
// socket on it.
const (
	probeName        = "tendril_gprobe"
	probePort uint16 = 1
)

// GeneveModule reports whether the kernel can create a Geneve device: a
// tendril_geneve of kind geneve says so; else it creates one in external
// mode and deletes it. A kernel without the module answers EOPNOTSUPP
// ("Unknown device type"): false. Another error is returned.
func GeneveModule(nl *netlink.Handle) (bool, error) {
	if l, err := nl.LinkByName(DeviceName(Geneve)); err == nil {
		if _, ok := l.(*netlink.Geneve); ok {
			return true, nil
		}
	}
	if l, err := nl.LinkByName(probeName); err == nil {
		_ = nl.LinkDel(l)
	}
	err := nl.LinkAdd(&netlink.Geneve{LinkAttrs: netlink.LinkAttrs{Name: probeName}, FlowBased: true, Dport: probePort})
	if errors.Is(err, unix.EOPNOTSUPP) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("probe for the kernel's Geneve module: %w", err)
	}
	if l, err := nl.LinkByName(probeName); err == nil {
		if err := nl.LinkDel(l); err != nil {
			return true, fmt.Errorf("delete the Geneve probe device: %w", err)
		}
	}
	return true, nil
}

// matches: l is the device EnsureDevice would create.
func matches(l netlink.Link, p Protocol, port uint16) bool {
	switch d := l.(type) {
	case *netlink.Vxlan:
		return p == VXLAN && d.FlowBased && d.Port == int(port)
	case *netlink.Geneve:
		return p == Geneve && d.FlowBased && d.Dport == port
	}
	return false
}

// RemoveDevices deletes Tendril's tunnel devices but keep ("" for all):
// a node switched to native routing, or to the other protocol, keeps no
// device of the old mode. An absent device is not an error.
func RemoveDevices(nl *netlink.Handle, keep string) error {
	var errs []error
	for _, name := range deviceNames {
		if name == keep {
			continue
		}
		l, err := nl.LinkByName(name)
		if err != nil {
			continue
		}
		if err := nl.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete tunnel device %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// SetDevice writes the pod programs' tdr_tunnel_v1 entry: from_pod
// redirects to ifindex (0: native routing, no redirect), and Geneve in
// eBPF (TUNNEL_F_GENEVE_BPF) is off. m is the map of
// that name among the pod programs' maps (loader.MapReplacements).
func SetDevice(m *ebpf.Map, ifindex int) error {
	if m == nil {
		return fmt.Errorf("tunnel map %s not loaded", bpf.OverlayMapTdrTunnelV1)
	}
	v := bpf.LxcTunnelInfo{Ifindex: uint32(ifindex)}
	if err := m.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("write %s: %w", bpf.OverlayMapTdrTunnelV1, err)
	}
	return nil
}

// tunnelFlagGeneveBPF is TUNNEL_F_GENEVE_BPF (bpf/lib/maps.h).
const tunnelFlagGeneveBPF = 1

// SetGeneveBPF turns on Geneve in eBPF (bpf/lib/geneve.h): from_geneve
// goes into the host programs' tail-call slot (calls: the pod programs'
// tdr_overlay_calls_v1) first, then tdr_tunnel_v1 (tun) asks from_pod to
// encapsulate and from_netdev to decapsulate, so no decapsulated packet
// finds the slot empty.
func SetGeneveBPF(tun, calls *ebpf.Map, p *Programs) error {
	if tun == nil || calls == nil || p == nil || p.Geneve == nil {
		return fmt.Errorf("geneve in eBPF: maps or program not loaded")
	}
	if err := calls.Put(uint32(0), p.Geneve); err != nil {
		return fmt.Errorf("write %s: %w", bpf.OverlayMapTdrOverlayCallsV1, err)
	}
	v := bpf.LxcTunnelInfo{Flags: tunnelFlagGeneveBPF}
	if err := tun.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("write %s: %w", bpf.OverlayMapTdrTunnelV1, err)
	}
	return nil
}

// ClearGeneveCall empties the host programs' tail-call slot of Geneve
// in eBPF (a node back on VXLAN or native routing; write tdr_tunnel_v1
// first, so from_netdev no longer decapsulates). An empty slot is not an
// error.
func ClearGeneveCall(calls *ebpf.Map) error {
	if calls == nil {
		return fmt.Errorf("tail-call map %s not loaded", bpf.OverlayMapTdrOverlayCallsV1)
	}
	if err := calls.Delete(uint32(0)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("clear %s: %w", bpf.OverlayMapTdrOverlayCallsV1, err)
	}
	return nil
}

// Device reads the tdr_tunnel_v1 entry (0: native routing).
func Device(m *ebpf.Map) (int, error) {
	var v bpf.LxcTunnelInfo
	if err := m.Lookup(uint32(0), &v); err != nil {
		return 0, fmt.Errorf("read %s: %w", bpf.OverlayMapTdrTunnelV1, err)
	}
	return int(v.Ifindex), nil
}

// Programs are the loaded overlay programs: From and To for the tunnel
// device, Geneve for the host programs' tail call (Geneve in eBPF).
type Programs struct {
	From, To, Geneve *ebpf.Program
}

// Load loads bpf/bpf_overlay.c's programs with the pod programs' maps
// (maps: loader.MapReplacements; nil in a test, which pins its own under
// bpfRoot). dsr is --bpf-lb-mode=dsr: from_overlay then records the
// frontend of a DSR request another node sent on through the overlay, as
// the host device programs do in native routing (LB_DSR, the same flag).
func Load(maps map[string]*ebpf.Map, bpfRoot string, dsr bool) (*Programs, error) {
	spec, err := bpf.LoadOverlay()
	if err != nil {
		return nil, fmt.Errorf("load overlay programs' spec: %w", err)
	}
	var lbDSR uint8
	if dsr {
		lbDSR = 1
	}
	v, ok := spec.Variables["LB_DSR"]
	if !ok {
		return nil, fmt.Errorf("overlay programs: no LB_DSR variable")
	}
	if err := v.Set(lbDSR); err != nil {
		return nil, fmt.Errorf("overlay programs: set LB_DSR: %w", err)
	}
	var objs struct {
		From   *ebpf.Program `ebpf:"from_overlay"`
		To     *ebpf.Program `ebpf:"to_overlay"`
		Geneve *ebpf.Program `ebpf:"from_geneve"`
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: bpfRoot}, MapReplacements: maps}
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load overlay programs: %w\n%+v", err, verr)
		}
		return nil, fmt.Errorf("load overlay programs: %w", err)
	}
	return &Programs{From: objs.From, To: objs.To, Geneve: objs.Geneve}, nil
}

// Close releases the programs (their attachments stay).
func (p *Programs) Close() error {
	return errors.Join(p.From.Close(), p.To.Close(), p.Geneve.Close())
}

// linkNames are the pinned links' names under the links directory,
// beside the pods' (ep<id>-<dir>) and the host devices' (dev<ifindex>-<dir>).
const (
	linkIngress = "overlay-ingress"
	linkEgress  = "overlay-egress"
)

// Attach attaches the programs to the device ifindex with TCX, the links
// pinned under linksDir: a link of an earlier run on the same device gets
// the new program atomically (no packet sees the device without one); a
// link left on another device (a device deleted and created again) is
// replaced.
func (p *Programs) Attach(ifindex int, linksDir string) error {
	if err := os.MkdirAll(linksDir, 0o700); err != nil {
		return fmt.Errorf("links directory: %w", err)
	}
	for _, a := range []struct {
		name string
		prog *ebpf.Program
		at   ebpf.AttachType
	}{{linkIngress, p.From, ebpf.AttachTCXIngress}, {linkEgress, p.To, ebpf.AttachTCXEgress}} {
		if err := attach(filepath.Join(linksDir, a.name), ifindex, a.prog, a.at); err != nil {
			return err
		}
	}
	return nil
}

func attach(pin string, ifindex int, prog *ebpf.Program, at ebpf.AttachType) error {
	if lk, err := link.LoadPinnedLink(pin, nil); err == nil {
		defer lk.Close()
		if on, ierr := loader.TCXIfindex(lk); ierr == nil && on == ifindex {
			if err := lk.Update(prog); err != nil {
				return fmt.Errorf("update pinned link %s: %w", pin, err)
			}
			return nil
		}
		// The device it was on is gone.
		_ = lk.Unpin()
	}
	lk, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at})
	if err != nil {
		return fmt.Errorf("attach %s to device %d: %w", filepath.Base(pin), ifindex, err)
	}
	defer lk.Close()
	_ = os.Remove(pin)
	if err := lk.Pin(pin); err != nil {
		return fmt.Errorf("pin link %s: %w", pin, err)
	}
	return nil
}

// Detach removes the overlay's pinned links (native routing): their
// programs leave the device. Absent links are not an error.
func Detach(linksDir string) error {
	var errs []error
	for _, name := range []string{linkIngress, linkEgress} {
		pin := filepath.Join(linksDir, name)
		lk, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			errs = append(errs, fmt.Errorf("open pinned link %s: %w", pin, err))
			continue
		}
		if err := lk.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", pin, err))
		}
		lk.Close()
	}
	return errors.Join(errs...)
}
