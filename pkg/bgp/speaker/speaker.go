// Package speaker is the node's BGP speaker: gobgp's server in the
// agent's process (as Cilium runs it), driven by bgp.Desired. Apply
// brings the server's global config, peers and announced paths to the
// desired state, each path through the bgp.Allowed guard first; Peers and
// Routes read its state back in the shape of Cilium's v1 API. Routes
// learned from peers stay in gobgp's tables: nothing installs them in the
// kernel (gobgp does not by itself, and no zebra is configured), as in
// Cilium.
package speaker

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	gobgpapi "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/osrg/gobgp/v3/pkg/server"

	"github.com/tendril-net/tendril/pkg/bgp"
)

// Speaker is one gobgp server and what was applied to it.
type Speaker struct {
	log    *slog.Logger
	gl     *logger
	server *server.BgpServer

	mu       sync.Mutex
	started  bool
	asn      uint32
	routerID netip.Addr
	// listenPort is gobgp's: -1 listens nowhere (the node connects out).
	listenPort int32
	peers      map[netip.Addr]bgp.Peer
	paths      map[netip.Prefix]announced
}

// announced is a path the server announces and the attributes it was
// built with (a change of them announces it again).
type announced struct {
	path  *gobgpapi.Path
	attrs bgp.Attributes
}

// New builds the server and runs its loop until Stop.
func New(log *slog.Logger, listenPort int32) *Speaker {
	gl := newLogger(log)
	s := server.NewBgpServer(server.LoggerOption(gl))
	go s.Serve()
	return &Speaker{log: log, gl: gl, server: s, listenPort: listenPort,
		peers: map[netip.Addr]bgp.Peer{}, paths: map[netip.Prefix]announced{}}
}

// Stop stops BGP (sessions end with a notification) and the server.
func (s *Speaker) Stop(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		if err := s.server.StopBgp(ctx, &gobgpapi.StopBgpRequest{}); err != nil {
			s.log.Warn("Stop BGP", "error", err)
		}
		s.started = false
	}
	s.server.Stop()
}

// StopForRestart ends the speaker for a restart of the agent (a clean
// SIGTERM: a rolling upgrade, a restart of the pod). A peer with graceful
// restart is not told anything: its session ends when the process exits
// and the kernel closes the TCP connection, which the peer takes as the
// restart RFC 4724 provides for, keeping the node's routes (as stale)
// until the restarted agent's session sends End-of-RIB or the restart
// time passes, as after a kill -9. A NOTIFICATION would not do: gobgp
// sends a Cease "peer de-configured", which RFC 8538 makes a Hard Reset
// that flushes the routes. Peers without graceful restart get the Cease
// at once, so they stop using the node now rather than at their hold
// timer. The server's loop is left to the process's exit too. It returns
// the number of peers left to the process's exit.
func (s *Speaker) StopForRestart(ctx context.Context) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		s.server.Stop()
		return 0
	}
	left := 0
	for addr, p := range s.peers {
		if p.GracefulRestart {
			left++
			continue
		}
		if err := s.server.DeletePeer(ctx, &gobgpapi.DeletePeerRequest{Address: addr.String()}); err != nil {
			s.log.Warn("Delete a peer without graceful restart", "peer", addr, "error", err)
		}
		delete(s.peers, addr)
	}
	if left == 0 {
		if err := s.server.StopBgp(ctx, &gobgpapi.StopBgpRequest{}); err != nil {
			s.log.Warn("Stop BGP", "error", err)
		}
		s.started = false
		s.server.Stop()
		return 0
	}
	s.log.Info("BGP sessions with graceful restart left to the process's exit: the peers keep this node's routes until it is back",
		"peers", left)
	return left
}

// Applied counts what the speaker runs.
type Applied struct {
	Peers, Paths int
}

// Apply brings the server to d: it (re)starts BGP when the ASN or the
// router ID changed (or stops it when no config applies), deletes and
// adds peers that changed, and withdraws and announces paths. Every path
// passes allowed first; one that does not is not announced and makes
// Apply fail (the desired state's computation refuses it earlier, so
// reaching this is a defect). The other changes are still made.
func (s *Speaker) Apply(ctx context.Context, d bgp.Desired, routerID netip.Addr, allowed bgp.Allowed) (Applied, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.Config == "" || !routerID.IsValid() {
		return Applied{}, s.stopLocked(ctx)
	}
	if !routerID.Is4() {
		return Applied{}, fmt.Errorf("router ID %s: must be an IPv4 address", routerID)
	}
	if s.started && (s.asn != d.LocalASN || s.routerID != routerID) {
		if err := s.stopLocked(ctx); err != nil {
			return Applied{}, err
		}
	}
	if !s.started {
		err := s.server.StartBgp(ctx, &gobgpapi.StartBgpRequest{Global: &gobgpapi.Global{
			Asn: d.LocalASN, RouterId: routerID.String(), ListenPort: s.listenPort}})
		if err != nil {
			return Applied{}, fmt.Errorf("start BGP (ASN %d, router ID %s): %w", d.LocalASN, routerID, err)
		}
		s.started, s.asn, s.routerID = true, d.LocalASN, routerID
		s.log.Info("BGP started", "asn", d.LocalASN, "router-id", routerID, "config", d.Config)
	}
	var errs []error
	want := map[netip.Addr]bgp.Peer{}
	for _, p := range d.Peers {
		want[p.Address] = p
	}
	for addr, old := range s.peers {
		if p, ok := want[addr]; ok && p == old {
			continue
		}
		if err := s.server.DeletePeer(ctx, &gobgpapi.DeletePeerRequest{Address: addr.String()}); err != nil {
			errs = append(errs, fmt.Errorf("delete peer %s (%s): %w", old.Name, addr, err))
			continue
		}
		delete(s.peers, addr)
		s.gl.forget(addr.String())
	}
	for addr, p := range want {
		if _, ok := s.peers[addr]; ok {
			continue
		}
		if err := s.server.AddPeer(ctx, &gobgpapi.AddPeerRequest{Peer: gobgpPeer(p)}); err != nil {
			errs = append(errs, fmt.Errorf("add peer %s (%s): %w", p.Name, addr, err))
			continue
		}
		s.peers[addr] = p
	}

	wantPaths := map[netip.Prefix]bool{}
	for _, a := range d.Adverts {
		wantPaths[a.Prefix] = true
	}
	for prefix, ann := range s.paths {
		if wantPaths[prefix] {
			continue
		}
		if err := s.server.DeletePath(ctx, &gobgpapi.DeletePathRequest{Family: ann.path.Family, Path: ann.path}); err != nil {
			errs = append(errs, fmt.Errorf("withdraw %s: %w", prefix, err))
			continue
		}
		delete(s.paths, prefix)
	}
	for _, a := range d.Adverts {
		if ann, ok := s.paths[a.Prefix]; ok && ann.attrs.Equal(a.Attributes) {
			continue
		}
		if err := allowed.Admit(a.Prefix); err != nil {
			errs = append(errs, fmt.Errorf("refused to announce %s (%s): %w", a.Prefix, a.Source, err))
			continue
		}
		// A path of the same prefix from this server replaces the one
		// announced with other attributes (an implicit withdraw).
		path, err := newPath(a.Prefix, a.Attributes)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := s.server.AddPath(ctx, &gobgpapi.AddPathRequest{Path: path}); err != nil {
			errs = append(errs, fmt.Errorf("announce %s: %w", a.Prefix, err))
			continue
		}
		s.paths[a.Prefix] = announced{path: path, attrs: a.Attributes}
	}
	return Applied{Peers: len(s.peers), Paths: len(s.paths)}, errors.Join(errs...)
}

func (s *Speaker) stopLocked(ctx context.Context) error {
	if !s.started {
		return nil
	}
	if err := s.server.StopBgp(ctx, &gobgpapi.StopBgpRequest{}); err != nil {
		return fmt.Errorf("stop BGP: %w", err)
	}
	s.started, s.asn, s.routerID = false, 0, netip.Addr{}
	clear(s.peers)
	clear(s.paths)
	s.log.Info("BGP stopped: no TendrilBGPClusterConfig selects this node")
	return nil
}

// Announced are the prefixes the speaker announces, sorted.
func (s *Speaker) Announced() []netip.Prefix {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]netip.Prefix, 0, len(s.paths))
	for p := range s.paths {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

func family(a netip.Addr) *gobgpapi.Family {
	if a.Is4() {
		return &gobgpapi.Family{Afi: gobgpapi.Family_AFI_IP, Safi: gobgpapi.Family_SAFI_UNICAST}
	}
	return &gobgpapi.Family{Afi: gobgpapi.Family_AFI_IP6, Safi: gobgpapi.Family_SAFI_UNICAST}
}

// gobgpPeer is p as gobgp's peer: the family of its address, graceful
// restart as asked.
func gobgpPeer(p bgp.Peer) *gobgpapi.Peer {
	afi := &gobgpapi.AfiSafi{Config: &gobgpapi.AfiSafiConfig{Family: family(p.Address), Enabled: true}}
	out := &gobgpapi.Peer{
		Conf: &gobgpapi.PeerConf{NeighborAddress: p.Address.String(), PeerAsn: p.ASN, Description: p.Name, AuthPassword: p.Password},
		Timers: &gobgpapi.Timers{Config: &gobgpapi.TimersConfig{
			HoldTime: uint64(p.HoldTime), KeepaliveInterval: uint64(p.KeepAlive), ConnectRetry: uint64(p.ConnectRetry)}},
		Transport: &gobgpapi.Transport{RemotePort: uint32(p.Port)},
		AfiSafis:  []*gobgpapi.AfiSafi{afi},
	}
	if p.EBGPMultihop > 1 {
		out.EbgpMultihop = &gobgpapi.EbgpMultihop{Enabled: true, MultihopTtl: uint32(p.EBGPMultihop)}
	}
	if p.GracefulRestart {
		out.GracefulRestart = &gobgpapi.GracefulRestart{Enabled: true, RestartTime: p.RestartTime, NotificationEnabled: true}
		afi.MpGracefulRestart = &gobgpapi.MpGracefulRestart{Config: &gobgpapi.MpGracefulRestartConfig{Enabled: true}}
	}
	return out
}

// newPath is the path announcing prefix, with this node as next hop
// (0.0.0.0 and :: are replaced by the session's local address) and
// attrs' communities and local preference (gobgp sends LOCAL_PREF to
// iBGP peers only).
func newPath(prefix netip.Prefix, extra bgp.Attributes) (*gobgpapi.Path, error) {
	origin := gobgp.NewPathAttributeOrigin(gobgp.BGP_ORIGIN_ATTR_TYPE_IGP)
	var nlri gobgp.AddrPrefixInterface
	var attrs []gobgp.PathAttributeInterface
	if prefix.Addr().Is4() {
		nlri = gobgp.NewIPAddrPrefix(uint8(prefix.Bits()), prefix.Addr().String())
		attrs = []gobgp.PathAttributeInterface{origin, gobgp.NewPathAttributeNextHop("0.0.0.0")}
	} else {
		nlri = gobgp.NewIPv6AddrPrefix(uint8(prefix.Bits()), prefix.Addr().String())
		attrs = []gobgp.PathAttributeInterface{origin, gobgp.NewPathAttributeMpReachNLRI("::", []gobgp.AddrPrefixInterface{nlri})}
	}
	if len(extra.Communities) > 0 {
		attrs = append(attrs, gobgp.NewPathAttributeCommunities(extra.Communities))
	}
	if len(extra.LargeCommunities) > 0 {
		large := make([]*gobgp.LargeCommunity, 0, len(extra.LargeCommunities))
		for _, l := range extra.LargeCommunities {
			large = append(large, gobgp.NewLargeCommunity(l.GlobalAdmin, l.LocalData1, l.LocalData2))
		}
		attrs = append(attrs, gobgp.NewPathAttributeLargeCommunities(large))
	}
	if extra.LocalPreference != 0 {
		attrs = append(attrs, gobgp.NewPathAttributeLocalPref(extra.LocalPreference))
	}
	p, err := apiutil.NewPath(nlri, false, attrs, time.Now())
	if err != nil {
		return nil, fmt.Errorf("path for %s: %w", prefix, err)
	}
	return p, nil
}

// Peers is the sessions' state as Cilium's v1 API gives it (GET
// /v1/bgp/peers).
func (s *Speaker) Peers(ctx context.Context) ([]*models.BgpPeer, error) {
	s.mu.Lock()
	started, asn, cfg := s.started, s.asn, maps(s.peers)
	s.mu.Unlock()
	out := []*models.BgpPeer{}
	if !started {
		return out, nil
	}
	err := s.server.ListPeer(ctx, &gobgpapi.ListPeerRequest{EnableAdvertised: true}, func(p *gobgpapi.Peer) {
		out = append(out, toModel(p, asn, cfg))
	})
	if err != nil {
		return nil, fmt.Errorf("list BGP peers: %w", err)
	}
	slices.SortFunc(out, func(a, b *models.BgpPeer) int { return strings.Compare(a.PeerAddress, b.PeerAddress) })
	return out, nil
}

func maps(m map[netip.Addr]bgp.Peer) map[string]bgp.Peer {
	out := make(map[string]bgp.Peer, len(m))
	for a, p := range m {
		out[a.String()] = p
	}
	return out
}

// PeerState is one session's state and, when it is not established, the
// last problem gobgp logged about it.
type PeerState struct {
	Name, Address, State, Reason string
}

// PeerStates are the sessions by name.
func (s *Speaker) PeerStates(ctx context.Context) ([]PeerState, error) {
	ps, err := s.Peers(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	cfg := maps(s.peers)
	s.mu.Unlock()
	out := make([]PeerState, 0, len(ps))
	for _, p := range ps {
		st := PeerState{Name: cfg[p.PeerAddress].Name, Address: p.PeerAddress, State: p.SessionState}
		if st.State != "established" {
			st.Reason = s.gl.lastProblem(p.PeerAddress)
		}
		out = append(out, st)
	}
	return out, nil
}

func toModel(p *gobgpapi.Peer, asn uint32, cfg map[string]bgp.Peer) *models.BgpPeer {
	m := &models.BgpPeer{LocalAsn: int64(asn), Families: []*models.BgpPeerFamilies{}}
	if c := p.Conf; c != nil {
		m.PeerAddress, m.PeerAsn = c.NeighborAddress, int64(c.PeerAsn)
	}
	if st := p.State; st != nil {
		m.SessionState = strings.ToLower(gobgpapi.PeerState_SessionState_name[int32(st.SessionState)])
	}
	if c, ok := cfg[m.PeerAddress]; ok {
		// From the config: gobgp's state does not echo the password.
		m.PeerPort, m.TCPPasswordEnabled = int64(c.Port), c.Password != ""
	}
	if t := p.Transport; t != nil && t.RemotePort != 0 {
		m.PeerPort = int64(t.RemotePort)
	}
	if t := p.Timers; t != nil {
		if c := t.Config; c != nil {
			m.ConfiguredHoldTimeSeconds, m.ConfiguredKeepAliveTimeSeconds = int64(c.HoldTime), int64(c.KeepaliveInterval)
			m.ConnectRetryTimeSeconds = int64(c.ConnectRetry)
		}
		if st := t.State; st != nil {
			m.AppliedHoldTimeSeconds, m.AppliedKeepAliveTimeSeconds = int64(st.NegotiatedHoldTime), int64(st.KeepaliveInterval)
			if st.Uptime != nil && m.SessionState == "established" {
				m.UptimeNanoseconds = int64(time.Since(st.Uptime.AsTime()))
			}
		}
	}
	if e := p.EbgpMultihop; e != nil && e.Enabled {
		m.EbgpMultihopTTL = int64(e.MultihopTtl)
	} else {
		m.EbgpMultihopTTL = 1
	}
	if gr := p.GracefulRestart; gr != nil {
		m.GracefulRestart = &models.BgpGracefulRestart{Enabled: gr.Enabled, RestartTimeSeconds: int64(gr.RestartTime)}
	}
	for _, af := range p.AfiSafis {
		if af.State == nil || af.State.Family == nil {
			continue
		}
		m.Families = append(m.Families, &models.BgpPeerFamilies{
			Afi: afiName(af.State.Family.Afi), Safi: safiName(af.State.Family.Safi),
			Received: int64(af.State.Received), Accepted: int64(af.State.Accepted), Advertised: int64(af.State.Advertised)})
	}
	return m
}

func afiName(a gobgpapi.Family_Afi) string {
	switch a {
	case gobgpapi.Family_AFI_IP:
		return "ipv4"
	case gobgpapi.Family_AFI_IP6:
		return "ipv6"
	}
	return strings.ToLower(strings.TrimPrefix(a.String(), "AFI_"))
}

func safiName(s gobgpapi.Family_Safi) string {
	if s == gobgpapi.Family_SAFI_UNICAST {
		return "unicast"
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "SAFI_"))
}

// RouteQuery is GET /v1/bgp/routes's parameters.
type RouteQuery struct {
	// TableType is loc-rib, adj-rib-in or adj-rib-out.
	TableType string
	// AFI is ipv4 or ipv6, SAFI unicast.
	AFI, SAFI string
	// Neighbor is the peer's address (adj-rib-in and adj-rib-out only).
	Neighbor string
}

// ErrBadQuery marks a query the caller got wrong (a 400).
var ErrBadQuery = errors.New("bad query")

// Routes lists a table's routes as Cilium's v1 API gives them, each
// path's NLRI and attributes base64 of their wire format.
func (s *Speaker) Routes(ctx context.Context, q RouteQuery) ([]*models.BgpRoute, error) {
	req := &gobgpapi.ListPathRequest{}
	switch q.TableType {
	case "loc-rib":
		req.TableType = gobgpapi.TableType_GLOBAL
	case "adj-rib-in", "adj-rib-out":
		req.TableType = gobgpapi.TableType_ADJ_IN
		if q.TableType == "adj-rib-out" {
			req.TableType = gobgpapi.TableType_ADJ_OUT
		}
		if _, err := netip.ParseAddr(q.Neighbor); err != nil {
			return nil, fmt.Errorf("%w: table_type %s needs neighbor, a peer's address (%q)", ErrBadQuery, q.TableType, q.Neighbor)
		}
		req.Name = q.Neighbor
	default:
		return nil, fmt.Errorf("%w: table_type %q: want loc-rib, adj-rib-in or adj-rib-out", ErrBadQuery, q.TableType)
	}
	switch {
	case q.AFI == "ipv4" && q.SAFI == "unicast":
		req.Family = &gobgpapi.Family{Afi: gobgpapi.Family_AFI_IP, Safi: gobgpapi.Family_SAFI_UNICAST}
	case q.AFI == "ipv6" && q.SAFI == "unicast":
		req.Family = &gobgpapi.Family{Afi: gobgpapi.Family_AFI_IP6, Safi: gobgpapi.Family_SAFI_UNICAST}
	default:
		return nil, fmt.Errorf("%w: afi %q safi %q: want ipv4 or ipv6, unicast", ErrBadQuery, q.AFI, q.SAFI)
	}
	s.mu.Lock()
	started, asn := s.started, s.asn
	s.mu.Unlock()
	out := []*models.BgpRoute{}
	if !started {
		return out, nil
	}
	var convErr error
	err := s.server.ListPath(ctx, req, func(d *gobgpapi.Destination) {
		r := &models.BgpRoute{Prefix: d.Prefix, RouterAsn: int64(asn), Neighbor: req.Name, Paths: []*models.BgpPath{}}
		for _, p := range d.Paths {
			mp, err := pathModel(p)
			if err != nil {
				convErr = errors.Join(convErr, fmt.Errorf("route %s: %w", d.Prefix, err))
				continue
			}
			r.Paths = append(r.Paths, mp)
		}
		out = append(out, r)
	})
	if err != nil {
		return nil, fmt.Errorf("list BGP routes: %w", err)
	}
	slices.SortFunc(out, func(a, b *models.BgpRoute) int { return strings.Compare(a.Prefix, b.Prefix) })
	return out, convErr
}

func pathModel(p *gobgpapi.Path) (*models.BgpPath, error) {
	nlri, err := apiutil.GetNativeNlri(p)
	if err != nil {
		return nil, fmt.Errorf("nlri: %w", err)
	}
	nb, err := nlri.Serialize()
	if err != nil {
		return nil, fmt.Errorf("nlri: %w", err)
	}
	attrs, err := apiutil.GetNativePathAttributes(p)
	if err != nil {
		return nil, fmt.Errorf("attributes: %w", err)
	}
	m := &models.BgpPath{Best: p.Best, Stale: p.Stale, Nlri: &models.BgpNlri{Base64: base64.StdEncoding.EncodeToString(nb)},
		Family:         &models.BgpFamily{Afi: afiName(p.Family.Afi), Safi: safiName(p.Family.Safi)},
		PathAttributes: []*models.BgpPathAttribute{}}
	if p.Age != nil {
		m.AgeNanoseconds = int64(time.Since(p.Age.AsTime()))
	}
	for _, a := range attrs {
		b, err := a.Serialize()
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", a.GetType(), err)
		}
		m.PathAttributes = append(m.PathAttributes, &models.BgpPathAttribute{Base64: base64.StdEncoding.EncodeToString(b)})
	}
	return m, nil
}
