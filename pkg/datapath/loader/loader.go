// Package loader loads Tendril's eBPF datapath once per node, pins its maps
// under the node's BPF root so the datapath keeps forwarding and enforcing
// while the agent is down, attaches the programs to each endpoint's host
// veth (TCX links, pinned, or legacy tc cls_bpf filters: see AttachMode),
// and on restart swaps the programs of the existing attachments
// atomically.
package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// Every pinned map's name carries its layout version (tdr_ct4_v1,
// tdr_endpoints_v2): a changed layout gets a new name, so new maps are
// created instead of old ones being misread. At start, the entries of maps
// of the previous layout are carried over into the new maps (see
// migrateLegacy), then pins of names this datapath does not use are
// removed; a pin under a current name whose shape differs (a development
// build) is replaced by an empty map.

// Config is the loader's configuration.
type Config struct {
	// BPFRoot is the bpffs directory of this node's maps and links.
	BPFRoot string
	// PolicyVerdictEvents reports allowed new flows to the events ring
	// buffer too (drops are always reported).
	PolicyVerdictEvents bool
	// TraceEvents reports forwarded packets as trace events (TraceOff,
	// TracePerConnection, TraceEveryPacket; see events.go).
	TraceEvents TraceMode
	// DirectDelivery lets a pod's program deliver packets for another
	// local pod straight into that pod's namespace (bpf_redirect_peer),
	// enforcing the destination's ingress policy in the same pass, instead
	// of handing them to the host stack. Host firewall and NAT rules
	// between local pods are bypassed then.
	DirectDelivery bool
	// AttachMode is how the programs attach to each endpoint's host veth;
	// empty means AttachTCX.
	AttachMode AttachMode
	// DeferTCX, in TCX mode, attaches a new endpoint with tc filters and
	// moves it to TCX links in the background once the node is quiet
	// (RunTCXPromotion; see promote.go): no RCU grace period on the path
	// of pod creation, and no moment without a program.
	DeferTCX bool
	// TCXQuietPeriod is how long no endpoint must have been attached
	// before a promotion to TCX links starts; zero means 500 ms.
	TCXQuietPeriod time.Duration
	// LBSizes are the capacities of the service load-balancing maps
	// (zero: the datapath's defaults, 100,000 services of 10 backends).
	LBSizes maps.LBSizes
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{BPFRoot: "/sys/fs/bpf/tendril", DirectDelivery: true, AttachMode: AttachTCX, DeferTCX: true}
}

// Flags registers the loader's flags (the agent registers --bpf-root,
// --direct-delivery and --datapath-attach-mode itself).
func (c *Config) Flags(fs *pflag.FlagSet) {}

// EndpointInfo is what the datapath needs to know of one endpoint.
type EndpointInfo struct {
	ID             uint16
	IfIndex        int
	IfName         string
	Addresses      []netip.Addr
	MAC            net.HardwareAddr
	HostMAC        net.HardwareAddr
	Identity       uint32
	EnforceIngress bool
	EnforceEgress  bool
	// AuditIngress and AuditEgress: an audited policy selects the
	// endpoint in that direction (what it would deny passes, reported).
	AuditIngress bool
	AuditEgress  bool
	// L7Ingress: an ingress allow names the HTTP proxy (EP_L7_INGRESS).
	L7Ingress bool
	// L7Egress: an egress allow names a proxy (EP2_L7_EGRESS).
	L7Egress bool
}

// Loader is the node's datapath.
type Loader struct {
	cfg Config
	log *slog.Logger

	mu   sync.Mutex
	objs bpf.LxcObjects
	// spec is the pod object as Start loaded it (its variables set), for
	// the programs loaded on demand (l7_hairpin).
	spec *ebpf.CollectionSpec
	// mountedBPFFS: Start found no bpffs at /sys/fs/bpf and mounted one.
	mountedBPFFS bool
	maps         *maps.Maps
	// nl is a netlink handle in the network namespace Start ran in (the
	// node's): tc qdiscs and filters, in either mode (a TCX run takes over
	// filters a tc run left).
	nl *netlink.Handle
	// netns is the network namespace Start ran in.
	netns netns.NsHandle
	// links are the TCX links this process holds, by attachment name
	// (linkName, also their pin's name); filters the tc filters it knows
	// of, by attachment name. An endpoint has one or the other, both only
	// for the moment of a switch.
	links   map[string]link.Link
	filters map[string]tcFilter
	// written is each endpoint's entry as last written by this process, so
	// a rewrite removes what the endpoint no longer has.
	written map[uint16]maps.Endpoint
	// reusedLinks counts attachments of an earlier run taken over at Start
	// (updated in place, or switched to this run's mode).
	reusedLinks int
	// pendingTCX are the endpoints attached by tc filters that wait to be
	// moved to TCX links (DeferTCX); lastAttach is when an endpoint was
	// last attached, and wake nudges RunTCXPromotion.
	pendingTCX map[uint16]struct{}
	lastAttach time.Time
	wake       chan struct{}
	// holds counts endpoint creations and removals under way
	// (HoldPromotions).
	holds int
}

// New returns a loader; nothing is loaded until Start.
func New(cfg Config, log *slog.Logger) *Loader {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.AttachMode == "" {
		cfg.AttachMode = AttachTCX
	}
	return &Loader{cfg: cfg, log: log, links: map[string]link.Link{}, filters: map[string]tcFilter{}, written: map[uint16]maps.Endpoint{},
		pendingTCX: map[uint16]struct{}{}, wake: make(chan struct{}, 1), netns: netns.None()}
}

func (l *Loader) linksDir() string { return filepath.Join(l.cfg.BPFRoot, "links") }

// Start opens or creates the pinned maps, carries the entries of maps of
// an earlier layout over, loads the programs and gives every endpoint an
// earlier run attached this run's programs, in this run's attach mode
// (takeOver: atomic, no packet sees no program).
func (l *Loader) Start() error {
	if err := l.cfg.AttachMode.validate(); err != nil {
		return err
	}
	mounted, err := bpffs.Prepare(l.cfg.BPFRoot)
	if err != nil {
		return err
	}
	if mounted {
		// In a container this mount is the container's own: the pinned
		// maps and links go with it, and a restarted agent starts over
		// (the pods lose their datapath state). Said at Warn and in the
		// status, not only here.
		l.log.Warn("bpffs was not mounted: mounted one; pinned maps and links last only as long as this mount (in a container, mount the node's /sys/fs/bpf into the pod)",
			"path", bpffs.DefaultMount)
		l.mu.Lock()
		l.mountedBPFFS = true
		l.mu.Unlock()
	}
	if err := os.MkdirAll(l.linksDir(), 0o750); err != nil {
		return fmt.Errorf("create BPF root %s: %w", l.cfg.BPFRoot, err)
	}
	spec, err := bpf.LoadLxc()
	if err != nil {
		return fmt.Errorf("load datapath spec: %w", err)
	}
	if l.cfg.PolicyVerdictEvents {
		if v, ok := spec.Variables["POLICY_VERDICT_EVENTS"]; ok {
			if err := v.Set(uint8(1)); err != nil {
				return fmt.Errorf("enable policy verdict events: %w", err)
			}
		}
	}
	if err := l.cfg.TraceEvents.set(spec); err != nil {
		return err
	}
	l.cfg.LBSizes.Apply(spec)
	legacy := l.openLegacy()
	defer legacy.close()
	resized := l.removeIncompatible(spec)
	loaded := false
	defer func() {
		for name, m := range resized {
			// A start that fails puts the old map back for the next one.
			if !loaded {
				if err := m.Pin(filepath.Join(l.cfg.BPFRoot, name)); err != nil {
					l.log.Warn("Cannot pin a map of another capacity back", "map", name, "error", err)
				}
			}
			m.Close()
		}
	}()
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: l.cfg.BPFRoot}}
	if err := loadObjects(spec, opts, &l.objs); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return fmt.Errorf("load datapath programs: %w\n%+v", err, verr)
		}
		return fmt.Errorf("load datapath: %w", err)
	}
	loaded = true
	l.spec = spec
	l.maps = maps.FromObjects(&l.objs.LxcMaps)
	l.carryResized(resized)
	l.migrateLegacy(legacy)
	// The array slots mirror the interface hash; a datapath of an earlier
	// layout had no arrays, and a crash may have left a slot behind.
	if err := l.maps.EndpointMap().RebuildSlots(); err != nil {
		l.log.Warn("Cannot rebuild the endpoint slots; the agent's regeneration rewrites them", "error", err)
	}
	// Only now, with the new datapath loaded and filled, do the pins of
	// other layouts go: a start that fails leaves them for the next one.
	// The old programs keep their maps until their links switch below.
	l.removeOtherLayouts(spec)
	// The handle belongs to the caller's network namespace, as the
	// interface indexes the agent passes in do.
	// The network namespace of this thread is the node's: TCX links attach
	// by interface index in the caller's namespace, so jobs on other
	// goroutines (RunTCXPromotion) enter it first.
	if l.netns, err = netns.Get(); err != nil {
		return fmt.Errorf("read the network namespace: %w", err)
	}
	if l.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return fmt.Errorf("open netlink handle: %w", err)
	}
	return l.takeOver()
}

// removeOtherLayouts deletes pinned maps this datapath does not use (other
// layout versions).
func (l *Loader) removeOtherLayouts(spec *ebpf.CollectionSpec) {
	l.removePinnedMaps(func(name string) bool {
		_, ours := spec.Maps[name]
		return !ours
	}, "Removed pinned map of another layout")
}

// removeIncompatible deletes pins that carry a current name but another
// shape (type, key or value size, capacity, flags): they are never read,
// the load creates them anew. Compatible pins are kept with their entries.
// A hash map that differs in capacity only (a size flag changed, or the
// defaults did) is held open and returned by name, for carryResized to
// copy its entries into the new map once loaded: the service maps keep
// their frontends, backends and IDs across a resize.
func (l *Loader) removeIncompatible(spec *ebpf.CollectionSpec) map[string]*ebpf.Map {
	resized := map[string]*ebpf.Map{}
	l.removePinnedMaps(func(name string) bool {
		ms, ours := spec.Maps[name]
		if !ours {
			return false
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(l.cfg.BPFRoot, name), nil)
		if err != nil {
			l.log.Warn("Cannot open pinned map; replacing it", "map", name, "error", err)
			return true
		}
		if err := ms.Compatible(m); err != nil {
			sized := ms.Copy()
			sized.MaxEntries = m.MaxEntries()
			if maps.Resizable(ms.Type) && sized.Compatible(m) == nil {
				l.log.Info("Pinned map has another capacity; carrying its entries over into a new map", "map", name,
					"capacity", m.MaxEntries(), "new-capacity", ms.MaxEntries)
				resized[name] = m
				return true
			}
			m.Close()
			l.log.Warn("Pinned map is incompatible with this datapath; replacing it", "map", name, "error", err)
			return true
		}
		m.Close()
		return false
	}, "Removed incompatible pinned map")
	return resized
}

// carryResized copies the entries of pins removed for their capacity
// (removeIncompatible) into the loaded maps of the same name, before the
// links switch to the new programs. The old programs keep the old maps
// until then; maps that only user space writes (the service maps) lose
// nothing.
func (l *Loader) carryResized(resized map[string]*ebpf.Map) {
	if len(resized) == 0 {
		return
	}
	loaded := loadedMaps(&l.objs.LxcMaps)
	for name, old := range resized {
		dst, ok := loaded[name]
		if !ok {
			continue
		}
		start := time.Now()
		res, err := maps.CopyEntries(old, dst)
		if err != nil {
			l.log.Warn("Cannot carry entries over into a map of another capacity", "map", name, "read", res.Read, "written", res.Written, "error", err)
			continue
		}
		l.log.Info("Carried entries over into a map of another capacity", "map", name, "entries", res.Written,
			"capacity", dst.MaxEntries(), "duration", time.Since(start))
	}
}

// loadedMaps names the loaded pod object's maps.
func loadedMaps(objs *bpf.LxcMaps) map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	mv := reflect.ValueOf(objs).Elem()
	for i := range mv.NumField() {
		name := mv.Type().Field(i).Tag.Get("ebpf")
		if m, ok := mv.Field(i).Interface().(*ebpf.Map); ok && name != "" && m != nil {
			out[name] = m
		}
	}
	return out
}

func (l *Loader) removePinnedMaps(match func(string) bool, msg string) {
	entries, _ := os.ReadDir(l.cfg.BPFRoot)
	for _, e := range entries {
		if e.IsDir() || !strings.HasPrefix(e.Name(), "tdr_") || !match(e.Name()) {
			continue
		}
		path := filepath.Join(l.cfg.BPFRoot, e.Name())
		if err := os.Remove(path); err != nil {
			l.log.Warn("Cannot remove pinned map", "path", path, "error", err)
		} else {
			l.log.Info(msg, "path", path)
		}
	}
}

func (l *Loader) progFor(dir string) *ebpf.Program {
	if dir == dirIngress {
		return l.objs.FromPod
	}
	return l.objs.ToPod
}

// Maps returns the datapath's maps (after Start).
func (l *Loader) Maps() *maps.Maps { return l.maps }

// endpoint turns ep into its endpoints map entry.
func (l *Loader) endpoint(ep EndpointInfo) (maps.Endpoint, error) {
	e := maps.Endpoint{ID: ep.ID, IfIndex: uint32(ep.IfIndex), Identity: ep.Identity, MAC: ep.MAC, HostMAC: ep.HostMAC}
	if ep.IfIndex <= 0 {
		return e, fmt.Errorf("endpoint %d has no host interface index", ep.ID)
	}
	for _, ip := range ep.Addresses {
		ip = ip.Unmap()
		slot := &e.IPv6
		if ip.Is4() {
			slot = &e.IPv4
		}
		if slot.IsValid() && *slot != ip {
			return e, fmt.Errorf("endpoint %d has two addresses of one family (%s, %s): the datapath holds one of each", ep.ID, *slot, ip)
		}
		*slot = ip
	}
	if ep.EnforceIngress {
		e.Flags |= maps.FlagEnforceIngress
	}
	if ep.EnforceEgress {
		e.Flags |= maps.FlagEnforceEgress
	}
	if ep.AuditIngress {
		e.Flags |= maps.FlagAuditIngress
	}
	if ep.AuditEgress {
		e.Flags |= maps.FlagAuditEgress
	}
	if ep.L7Ingress {
		e.Flags |= maps.FlagL7Ingress
	}
	if ep.L7Egress {
		e.Flags2 |= maps.Flag2L7Egress
	}
	// Direct delivery rewrites the frame as the host would route it, so it
	// needs both MACs of the destination's veth pair.
	if l.cfg.DirectDelivery && len(ep.MAC) == 6 && len(ep.HostMAC) == 6 {
		e.Flags |= maps.FlagDeliverDirect
	}
	return e, nil
}

// WriteEndpoint writes the endpoint's facts (identity, addresses,
// enforcement flags) without touching its programs: the light update after
// a policy change.
func (l *Loader) WriteEndpoint(ep EndpointInfo) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writeEndpointLocked(ep)
}

func (l *Loader) writeEndpointLocked(ep EndpointInfo) error {
	if l.maps == nil {
		return errors.New("datapath not started")
	}
	e, err := l.endpoint(ep)
	if err != nil {
		return err
	}
	em := l.maps.EndpointMap()
	if prev, ok := l.written[ep.ID]; ok {
		err = em.Replace(prev, e)
	} else {
		err = em.Upsert(e)
	}
	if err != nil {
		return err
	}
	l.written[ep.ID] = e
	return nil
}

// AttachEndpoint writes the endpoint's facts and attaches the programs to
// its host veth in the loader's attach mode, then removes an attachment of
// the other mode (new first, old after: no packet sees no program).
// Idempotent; the map entries are written before the programs attach, so
// the first packet already sees them. An endpoint already attached to
// this interface as it should be gets only its map entries written (a
// change of identity or flags): see attachedLocked.
func (l *Loader) AttachEndpoint(ep EndpointInfo) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.writeEndpointLocked(ep); err != nil {
		return err
	}
	if l.attachedLocked(ep) {
		return nil
	}
	return l.attachProgramsLocked(ep)
}

// CheckEndpoint is AttachEndpoint that believes the kernel rather than
// this process's record of ep's tc filters: someone may have deleted a
// filter or the clsact qdisc (a TCX link detached by someone else shows
// in its link info, which attachedLocked reads). Whatever is missing is
// attached again, and reattached says so. The map entries are written as
// by AttachEndpoint (an entry someone deleted comes back too). Two filter
// dumps on top of AttachEndpoint's cost: for a periodic check, not for
// every regeneration.
func (l *Loader) CheckEndpoint(ep EndpointInfo) (reattached bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.writeEndpointLocked(ep); err != nil {
		return false, err
	}
	if l.attachedLocked(ep) && !l.forgetVanishedTCFiltersLocked(ep.ID) {
		return false, nil
	}
	return true, l.attachProgramsLocked(ep)
}

// attachProgramsLocked attaches ep's programs in the loader's mode and
// removes those of the other mode.
func (l *Loader) attachProgramsLocked(ep EndpointInfo) error {
	if l.cfg.AttachMode == AttachTC {
		if err := l.attachTCLocked(ep); err != nil {
			return fmt.Errorf("attach tc filters of endpoint %d to %s: %w", ep.ID, ep.IfName, err)
		}
		return l.dropTCXLinksLocked(ep.ID)
	}
	if l.deferLocked(ep) {
		if err := l.attachTCLocked(ep); err != nil {
			return fmt.Errorf("attach tc filters of endpoint %d to %s (TCX links follow): %w", ep.ID, ep.IfName, err)
		}
		// A TCX link of a former interface under this ID must not stay.
		if err := l.dropTCXLinksLocked(ep.ID); err != nil {
			l.log.Warn("Cannot remove the TCX links of a former interface", "endpoint", ep.ID, "error", err)
		}
		l.markPendingLocked(ep.ID)
		return nil
	}
	if _, linked := l.links[linkName(ep.ID, dirIngress)]; !linked {
		// A new endpoint: the qdisc a later switch to tc needs, now,
		// before the pod's traffic (see addClsact).
		if _, err := l.addClsact(ep.IfIndex); err != nil {
			return fmt.Errorf("attach endpoint %d to %s: %w", ep.ID, ep.IfName, err)
		}
	}
	for _, dir := range directions {
		if err := l.attachTCXLocked(ep, dir); err != nil {
			return fmt.Errorf("attach %s program of endpoint %d to %s: %w", dir, ep.ID, ep.IfName, err)
		}
	}
	return l.dropTCFiltersLocked(ep.ID)
}

// attachedLocked reports whether ep's programs are attached to its
// interface as this run wants them: both TCX links (TCX mode), or both tc
// filters (tc mode, or TCX mode while the endpoint waits for its
// promotion), and none of the other kind. Every attachment this loader
// holds runs this run's programs (takeOver swapped them in at Start, and
// an attach installs them), so replacing them again would change nothing
// but cost time: two tc filter replaces are two rtnl round trips (36–42
// µs against 6–7 µs for the map entries alone,
// BenchmarkPrivilegedReattachEndpoint), and an endpoint waiting for its
// TCX links would put its promotion off (markPendingLocked).
func (l *Loader) attachedLocked(ep EndpointInfo) bool {
	tcx, tc := 0, 0
	for _, dir := range directions {
		name := linkName(ep.ID, dir)
		if lk, ok := l.links[name]; ok {
			if ifindex, err := TCXIfindex(lk); err != nil || ifindex != ep.IfIndex {
				return false
			}
			tcx++
		}
		if f, ok := l.filters[name]; ok {
			if f.ifindex != ep.IfIndex {
				return false
			}
			tc++
		}
	}
	n := len(directions)
	switch {
	case l.cfg.AttachMode == AttachTC:
		return tc == n && tcx == 0
	case tcx == n && tc == 0:
		return true
	default:
		_, pending := l.pendingTCX[ep.ID]
		return l.cfg.DeferTCX && pending && tc == n && tcx == 0
	}
}

// EndpointIDs lists the endpoint IDs that have an entry in the endpoint
// map, for the prune of endpoints no one backs.
func (l *Loader) EndpointIDs() ([]uint16, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.maps == nil {
		return nil, errors.New("datapath not started")
	}
	ids, err := l.maps.EndpointMap().IDs()
	if err != nil {
		return nil, err
	}
	out := make([]uint16, 0, len(ids))
	for id := range ids {
		out = append(out, id)
	}
	return out, nil
}

// PurgeEndpoint removes what the kernel holds of endpoint id, which
// nothing backs any more (an endpoint of a previous run that was not
// restored), whose addresses are not known: every endpoint map entry that
// names it, its policy map entries, and its programs, whichever mode attached them — unless they
// sit on an interface that still exists. That is a pod whose state was
// lost while its veth lives on (agentendpoints keeps its address reserved
// until the interface goes): its programs stay, find no endpoint entry and
// drop its traffic (REASON_UNKNOWN_INTERFACE), so the pod is cut off
// rather than left on a veth without programs, where no policy would hold.
// keptPrograms says so; a later prune removes them once the interface is
// gone.
func (l *Loader) PurgeEndpoint(id uint16) (keptPrograms bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	if l.maps != nil {
		// Its policy entries and DNS fallback names too: nothing
		// realizes them any more.
		errs = append(errs, l.maps.EndpointMap().Purge(id), l.maps.PolicyMap().DeleteEndpoint(id))
		if l.maps.DNSFallback != nil {
			errs = append(errs, l.maps.DNSFallbackMap().DeleteEndpoint(id))
		}
	}
	delete(l.written, id)
	if l.onLiveInterfaceLocked(id) {
		keptPrograms = true
	} else {
		delete(l.pendingTCX, id)
		errs = append(errs, l.dropTCXLinksLocked(id), l.dropTCFiltersLocked(id))
	}
	if err := errors.Join(errs...); err != nil {
		return keptPrograms, fmt.Errorf("purge endpoint %d: %w", id, err)
	}
	return keptPrograms, nil
}

// onLiveInterfaceLocked reports whether a TCX link or tc filter of
// endpoint id is attached to an interface that exists (a TCX link whose
// interface went reports interface 0).
func (l *Loader) onLiveInterfaceLocked(id uint16) bool {
	exists := func(ifindex int) bool {
		if ifindex == 0 {
			return false
		}
		_, err := l.nl.LinkByIndex(ifindex)
		return err == nil
	}
	for _, dir := range directions {
		name := linkName(id, dir)
		if lk, ok := l.links[name]; ok {
			if ifindex, err := TCXIfindex(lk); err == nil && exists(ifindex) {
				return true
			}
		}
		if f, ok := l.filters[name]; ok && exists(f.ifindex) {
			return true
		}
	}
	return false
}

// DetachEndpoint removes the endpoint's programs, whichever mode attached
// them, and its map entries.
func (l *Loader) DetachEndpoint(id uint16, addrs []netip.Addr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.pendingTCX, id)
	errs := []error{l.dropTCXLinksLocked(id), l.dropTCFiltersLocked(id)}
	if l.maps != nil {
		if prev, ok := l.written[id]; ok {
			addrs = append(addrs, prev.IPv4, prev.IPv6)
		}
		if err := l.maps.EndpointMap().DeleteID(id, addrs...); err != nil {
			errs = append(errs, err)
		}
	}
	delete(l.written, id)
	return errors.Join(errs...)
}

// Status is the datapath's state for `tendril status`.
type Status struct {
	BPFRoot string `json:"bpf-root"`
	// AttachMode is tcx or tc.
	AttachMode AttachMode `json:"attach-mode"`
	// Links counts attachments, one per endpoint and direction: TCX links
	// or tc filters (both, briefly, for an endpoint switching modes).
	Links int `json:"links"`
	// ReusedLinks counts attachments of an earlier run taken over at start.
	ReusedLinks int `json:"reused-links"`
	// PendingTCX counts endpoints attached by tc filters that wait to be
	// moved to TCX links (TCX mode with deferral).
	PendingTCX int `json:"pending-tcx"`
	// DeferTCX says new endpoints start on tc filters (TCX mode).
	DeferTCX    bool           `json:"defer-tcx"`
	MapEntries  map[string]int `json:"map-entries"`
	MapCapacity map[string]int `json:"map-capacity"`
	// MountedBPFFS says no bpffs was mounted at /sys/fs/bpf when the
	// datapath started, and the agent mounted one.
	MountedBPFFS bool `json:"mounted-bpffs,omitempty"`
}

// MountedBPFFS says Start found no bpffs at /sys/fs/bpf and mounted one.
func (l *Loader) MountedBPFFS() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mountedBPFFS
}

// Status counts links and map entries.
func (l *Loader) Status() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := Status{BPFRoot: l.cfg.BPFRoot, AttachMode: l.cfg.AttachMode, Links: len(l.links) + len(l.filters), ReusedLinks: l.reusedLinks, PendingTCX: len(l.pendingTCX),
		DeferTCX:   l.cfg.AttachMode == AttachTCX && l.cfg.DeferTCX,
		MapEntries: map[string]int{}, MapCapacity: map[string]int{}, MountedBPFFS: l.mountedBPFFS}
	if l.maps == nil {
		return st
	}
	type counted interface {
		Count() (int, error)
		Capacity() int
	}
	for name, m := range map[string]counted{
		"endpoints": l.maps.EndpointMap(), "ipcache": l.maps.IPCacheMap(), "policy": l.maps.PolicyMap(), "ct": l.maps.CTMap(),
	} {
		n, err := m.Count()
		if err != nil {
			l.log.Warn("Cannot count map entries", "map", name, "error", err)
		}
		st.MapEntries[name] = n
		st.MapCapacity[name] = m.Capacity()
	}
	return st
}

// AttachedEndpoints lists the endpoint IDs with programs attached (TCX
// links or tc filters).
func (l *Loader) AttachedEndpoints() []uint16 {
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := map[uint16]bool{}
	for name := range l.links {
		if id, _, ok := parseLinkName(name); ok {
			seen[id] = true
		}
	}
	for name := range l.filters {
		if id, _, ok := parseLinkName(name); ok {
			seen[id] = true
		}
	}
	var out []uint16
	for id := range seen {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// MapReplacements returns the loaded maps by name (after Start): another
// object loaded with them as ebpf.CollectionOptions.MapReplacements uses
// the same kernel maps (the host device programs, pkg/agent/hostdev).
func (l *Loader) MapReplacements() map[string]*ebpf.Map { return loadedMaps(&l.objs.LxcMaps) }

// Programs returns the loaded programs (tests run them with BPF_PROG_TEST_RUN).
func (l *Loader) Programs() (fromPod, toPod *ebpf.Program) { return l.objs.FromPod, l.objs.ToPod }

// Close releases this process's handles; pinned maps and links stay, and
// tc filters hold their programs in the kernel, so the datapath keeps
// working without the agent.
func (l *Loader) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, lk := range l.links {
		lk.Close()
		delete(l.links, name)
	}
	clear(l.filters)
	if l.nl != nil {
		l.nl.Close()
		l.nl = nil
	}
	if l.netns.IsOpen() {
		_ = l.netns.Close()
		l.netns = netns.None()
	}
	return l.objs.Close()
}

// Remove takes every program this loader knows of off its interface (tc
// filters are deleted; TCX links go with their pins) and unpins
// everything under the BPF root (lab teardown, tests).
func (l *Loader) Remove() error {
	l.mu.Lock()
	var errs []error
	for name := range l.filters {
		if id, _, ok := parseLinkName(name); ok {
			errs = append(errs, l.dropTCFiltersLocked(id))
		}
	}
	l.mu.Unlock()
	_ = l.Close()
	errs = append(errs, os.RemoveAll(l.cfg.BPFRoot))
	return errors.Join(errs...)
}

// loadObjects loads the datapath's maps, then each of its programs in a
// goroutine of its own. The kernel verifies a program in the thread that
// loads it, and verifying the pod programs is most of the agent's start
// (from_pod about twice to_pod): loaded side by side they verify on two
// CPUs at once. Each program is loaded from its own copy of the spec with
// the loaded maps as replacements, so both use the same maps (the
// constants' .rodata is the program's own, the same in both). The maps
// the kernel preallocates are created several at once first (createMaps):
// on a fresh node their creation was as long as the programs' load.
func loadObjects(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions, objs *bpf.LxcObjects) error {
	created, err := createMaps(spec, opts.Maps)
	if err != nil {
		return err
	}
	// LoadAndAssign clones the replacements into objs: these are closed
	// once it has, the clones hold the maps.
	defer closeMaps(created)
	mapOpts := *opts
	mapOpts.MapReplacements = make(map[string]*ebpf.Map, len(opts.MapReplacements)+len(created))
	for _, from := range []map[string]*ebpf.Map{opts.MapReplacements, created} {
		for name, m := range from {
			mapOpts.MapReplacements[name] = m
		}
	}
	if err := spec.LoadAndAssign(&objs.LxcMaps, &mapOpts); err != nil {
		return err
	}
	repl := loadedMaps(&objs.LxcMaps)
	progOpts := *opts
	progOpts.MapReplacements = repl
	var from struct {
		P *ebpf.Program `ebpf:"from_pod"`
	}
	var to struct {
		P *ebpf.Program `ebpf:"to_pod"`
	}
	var wg sync.WaitGroup
	var fromErr, toErr error
	wg.Add(2)
	go func() { defer wg.Done(); fromErr = spec.Copy().LoadAndAssign(&from, &progOpts) }()
	go func() { defer wg.Done(); toErr = spec.Copy().LoadAndAssign(&to, &progOpts) }()
	wg.Wait()
	if err := errors.Join(fromErr, toErr); err != nil {
		for _, p := range []*ebpf.Program{from.P, to.P} {
			if p != nil {
				p.Close()
			}
		}
		objs.LxcMaps.Close()
		return err
	}
	objs.FromPod, objs.ToPod = from.P, to.P
	return nil
}

// createMaps creates, or opens where a pin of the same shape is left (as
// LoadAndAssign does), the spec's maps that hold no other map or program
// and are not a data section, on as many goroutines as the runtime has
// CPUs. The kernel preallocates a hash map's elements (an LRU's lists, a
// per-CPU map's values on every CPU) in the thread that creates it: tens
// of milliseconds for the conntrack, service and audit maps, one after the
// other in LoadAndAssign. The rest (.rodata, .bss, the policy map of maps)
// is left to LoadAndAssign: cheap, and a data section takes the spec's
// variables there. On error every map created is closed; pins made stay,
// as LoadAndAssign leaves them.
func createMaps(spec *ebpf.CollectionSpec, opts ebpf.MapOptions) (map[string]*ebpf.Map, error) {
	var names []string
	for name, ms := range spec.Maps {
		if strings.HasPrefix(name, ".") || holdsObjects(ms.Type) {
			continue
		}
		names = append(names, name)
	}
	// The largest first, so that the last ones to finish are small: the
	// size is only a guess at the kernel's work.
	sort.Slice(names, func(i, j int) bool {
		si, sj := preallocGuess(spec.Maps[names[i]]), preallocGuess(spec.Maps[names[j]])
		if si != sj {
			return si > sj
		}
		return names[i] < names[j]
	})
	work := make(chan string, len(names))
	for _, name := range names {
		work <- name
	}
	close(work)
	var (
		mu      sync.Mutex
		created = make(map[string]*ebpf.Map, len(names))
		errs    []error
		wg      sync.WaitGroup
	)
	for range min(runtime.GOMAXPROCS(0), len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				m, err := ebpf.NewMapWithOptions(spec.Maps[name], opts)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("map %s: %w", name, err))
				} else {
					created[name] = m
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeMaps(created)
		return nil, err
	}
	return created, nil
}

// holdsObjects: a map of maps or of programs, filled by LoadAndAssign
// with objects of the collection.
func holdsObjects(t ebpf.MapType) bool {
	return t == ebpf.ArrayOfMaps || t == ebpf.HashOfMaps || t == ebpf.ProgramArray
}

// preallocGuess is what the kernel allocates for a map when it is created,
// roughly: its entries' keys and values, per CPU for a per-CPU map.
func preallocGuess(ms *ebpf.MapSpec) uint64 {
	size := uint64(ms.MaxEntries) * uint64(ms.KeySize+ms.ValueSize)
	switch ms.Type {
	case ebpf.PerCPUHash, ebpf.PerCPUArray, ebpf.LRUCPUHash:
		size *= uint64(runtime.NumCPU())
	}
	return size
}

func closeMaps(ms map[string]*ebpf.Map) {
	for _, m := range ms {
		m.Close()
	}
}
