// Package l7redirect is the node's side of the datapath's L7 redirect:
// the transparent listeners of the DNS proxy (UDP and TCP) and of the HTTP
// proxy, their sockets in the datapath's tdr_proxy_sockets_v1 (from_pod
// assigns a redirected flow's packets to them, bpf/lib/proxy.h), and the
// policy routing rule that delivers those packets locally whatever their
// destination. Packets keep their addresses: a listener reads the flow's
// original destination from the socket (IP_TRANSPARENT: an accepted
// connection's local address, a datagram's IP_ORIGDSTADDR) and answers
// from it, so the pod sees its peer answer.
//
// Both families: each listener is one dual-stack socket (bound to [::]
// without IPV6_V6ONLY, IPV6_TRANSPARENT), which takes IPv4 flows as
// IPv4-mapped addresses too, so the datapath has one socket per proxy and
// protocol to assign either family's packets to; the routing rule is
// installed for both. On a node without IPv6 the sockets are IPv4 only
// (the datapath then assigns no IPv6 packet to them).
//
// The proxies name the sender by its source address through the endpoint
// table. That address is the pod's own: from_pod drops any packet whose
// source is not its endpoint's address (anti-spoofing) before it redirects
// anything, and only packets of from_pod reach these sockets (the mark and
// the assignment are the datapath's).
//
// Ingress: a third listener takes the flows the datapath sent to the HTTP
// proxy for their destination's ingress rules (PROXY_HTTP_INGRESS). Its
// peer is the endpoint the flow's conntrack entry names as the one whose
// from_pod admitted and redirected it (the datapath's view, checked against
// the address's owner), or for a source on another node the identity the
// entry holds (from_netdev or from_overlay recorded it); the rules are the destination endpoint's ingress
// rules for that peer's identity; the upstream connection carries
// PROXY_MARK_UPSTREAM, so the pod's to_pod does not ask its ingress policy
// again (it would see the node) nor send it back to the proxy.
package l7redirect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/ebpf"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/fqdn"
	"github.com/tendril-net/tendril/pkg/l7proxy"
	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

// Sender is the local endpoint a redirected flow came from.
type Sender struct {
	EndpointID uint16
	Identity   uint32
}

// Config is what the redirect asks of the agent.
type Config struct {
	// BPFRoot is the node's BPF root, where tdr_proxy_sockets_v1 is
	// pinned.
	BPFRoot string
	// DNSPort and HTTPPort are the proxies' ports (0: any free one).
	DNSPort, HTTPPort uint16
	// Endpoint names the local endpoint sending from addr.
	Endpoint func(addr netip.Addr) (Sender, bool)
	// Rules are the L7 rules of the sender's egress entry that sent a
	// flow to dst over proto to the proxy (nil: none, everything is
	// refused).
	Rules func(ep uint16, dst netip.AddrPort, proto uint8) *policy.L7Rules
	// IngressRules are the HTTP rules of local endpoint ep's ingress
	// entry for peer src (its identity, its address) at port (nil: none,
	// everything is refused).
	IngressRules func(ep uint16, src uint32, srcAddr netip.Addr, port uint16) *policy.L7Rules
	// DNS is the DNS proxy's configuration as the FQDN cell gives it
	// (Learned, Flow, Log); the rest is filled here.
	DNS fqdn.ProxyConfig
	// HTTPFlow receives the HTTP proxy's L7 flows (nil: none).
	HTTPFlow func(*flowpb.Flow)
	// InNodeNS runs fn where the proxies' own sockets (upstream
	// connections, UDP answers) must be made: in the node's network
	// namespace. Nil: the calling thread's (the agent runs in the node's).
	InNodeNS func(fn func() error) error
	Log      *slog.Logger
}

// Redirect is the running listeners.
type Redirect struct {
	cfg      Config
	log      *slog.Logger
	sockets  *ebpf.Map
	ports    *ebpf.Map
	dnsUDP   *net.UDPConn
	dnsTCP   net.Listener
	http     net.Listener
	httpIn   net.Listener
	ct       maps.CTMap
	ctMaps   []*ebpf.Map
	dnsSrv   *dns.Server
	dnsProxy *fqdn.Proxy
	httpPx   *l7proxy.HTTPProxy
	httpInPx *l7proxy.HTTPProxy
	wg       sync.WaitGroup
}

// Start opens the listeners in the calling thread's network namespace
// (the node's), installs the routing rule, puts the sockets in the
// datapath's map and serves until Close.
func Start(cfg Config) (*Redirect, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.InNodeNS == nil {
		cfg.InNodeNS = func(fn func() error) error { return fn() }
	}
	r := &Redirect{cfg: cfg, log: cfg.Log}
	var err error
	r.sockets, err = ebpf.LoadPinnedMap(filepath.Join(cfg.BPFRoot, bpf.LxcMapTdrProxySocketsV1), nil)
	if err != nil {
		return nil, fmt.Errorf("open the proxies' socket map under %s: %w", cfg.BPFRoot, err)
	}
	if err := r.listen(); err != nil {
		r.Close()
		return nil, err
	}
	if err := InstallRoute(); err != nil {
		r.Close()
		return nil, err
	}
	if err := r.putSocket(maps.ProxyDns, unix.IPPROTO_UDP, r.dnsUDP); err != nil {
		r.Close()
		return nil, err
	}
	// TCP listeners are found by their port (bpf/lib/proxy.h).
	r.ports, err = ebpf.LoadPinnedMap(filepath.Join(cfg.BPFRoot, bpf.LxcMapTdrProxyPortsV1), nil)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("open the proxies' port map under %s: %w", cfg.BPFRoot, err)
	}
	// The ingress listener names its peer from the flow's conntrack
	// entry.
	for _, name := range []string{bpf.LxcMapTdrCt4V2, bpf.LxcMapTdrCt6V2} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(cfg.BPFRoot, name), nil)
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("open the conntrack map %s under %s: %w", name, cfg.BPFRoot, err)
		}
		r.ctMaps = append(r.ctMaps, m)
	}
	r.ct = maps.CTMapOf(r.ctMaps[0], r.ctMaps[1])
	for proxy, l := range map[uint8]net.Listener{maps.ProxyDns: r.dnsTCP, maps.ProxyHttp: r.http, maps.ProxyHttpIngress: r.httpIn} {
		if err := r.ports.Update(uint32(proxy), uint32(l.Addr().(*net.TCPAddr).Port), ebpf.UpdateAny); err != nil {
			r.Close()
			return nil, fmt.Errorf("put the TCP port of proxy %d in the datapath's map: %w", proxy, err)
		}
	}
	r.serve()
	return r, nil
}

// SocketKey is the datapath's PROXY_SOCKET_KEY.
func SocketKey(proxy, proto uint8) uint32 {
	k := uint32(proxy) * 2
	if proto == unix.IPPROTO_UDP {
		k++
	}
	return k
}

func (r *Redirect) putSocket(proxy, proto uint8, c syscall.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var uerr error
	if err := raw.Control(func(fd uintptr) {
		uerr = r.sockets.Update(SocketKey(proxy, proto), uint64(fd), ebpf.UpdateAny)
	}); err != nil {
		return err
	}
	if uerr != nil {
		return fmt.Errorf("put the socket of proxy %d (protocol %d) in the datapath's map: %w", proxy, proto, uerr)
	}
	return nil
}

// transparent lets a socket take packets for any address and answer
// from it (IP_TRANSPARENT, IPV6_TRANSPARENT for an IPv6 socket: the same
// flag), and a datagram socket read each packet's original destination
// (a dual-stack socket gets IP_ORIGDSTADDR for an IPv4 datagram and
// IPV6_ORIGDSTADDR for an IPv6 one, so it asks for both). network is
// the socket's as Go made it ("tcp6" for a dual-stack one).
func transparent(network string, udp bool) func(string, string, syscall.RawConn) error {
	return func(ctlNetwork, _ string, c syscall.RawConn) error {
		v6 := strings.HasSuffix(ctlNetwork, "6")
		var serr error
		err := c.Control(func(fd uintptr) {
			if v6 {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
			}
			if serr == nil && udp {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_RECVORIGDSTADDR, 1)
			}
			if serr == nil && udp && v6 {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_RECVORIGDSTADDR, 1)
			}
		})
		if err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("transparent %s socket: %w", network, serr)
		}
		return nil
	}
}

// listen opens the listeners on the wildcard address: Go makes each a
// dual-stack IPv6 socket (IPV6_V6ONLY off) where the node has IPv6, an
// IPv4 one where it has not.
func (r *Redirect) listen() error {
	ctx := context.Background()
	udp := net.ListenConfig{Control: transparent("udp", true)}
	tcp := net.ListenConfig{Control: transparent("tcp", false)}
	pc, err := udp.ListenPacket(ctx, "udp", fmt.Sprintf(":%d", r.cfg.DNSPort))
	if err != nil {
		return fmt.Errorf("DNS proxy UDP listener: %w", err)
	}
	r.dnsUDP = pc.(*net.UDPConn)
	if r.dnsTCP, err = tcp.Listen(ctx, "tcp", fmt.Sprintf(":%d", r.cfg.DNSPort)); err != nil {
		return fmt.Errorf("DNS proxy TCP listener: %w", err)
	}
	if r.http, err = tcp.Listen(ctx, "tcp", fmt.Sprintf(":%d", r.cfg.HTTPPort)); err != nil {
		return fmt.Errorf("HTTP proxy listener: %w", err)
	}
	if r.httpIn, err = tcp.Listen(ctx, "tcp", ":0"); err != nil {
		return fmt.Errorf("ingress HTTP proxy listener: %w", err)
	}
	return nil
}

// Ports are the proxies' listening ports.
func (r *Redirect) Ports() (dnsPort, httpPort uint16) {
	return uint16(r.dnsUDP.LocalAddr().(*net.UDPAddr).Port), uint16(r.http.Addr().(*net.TCPAddr).Port)
}

// InstallRoute makes packets with the datapath's proxy mark local
// deliveries, in both families: a rule to PROXY_MARK_TABLE, whose default
// route (0.0.0.0/0, ::/0) is local. A node without IPv6 (the kernel
// refuses the family, or IPv6 is disabled on the loopback: EACCES) gets
// the IPv4 ones only. The loopback is set up
// when it is down (a bare network namespace's is): the kernel refuses an
// IPv6 route through a device that is down (ENETDOWN), where it takes the
// IPv4 one. Idempotent.
func InstallRoute() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("proxy route: %w", err)
	}
	if lo.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("proxy route: set the loopback up: %w", err)
		}
	}
	for _, fam := range []struct {
		family int
		all    string
	}{{unix.AF_INET, "0.0.0.0/0"}, {unix.AF_INET6, "::/0"}} {
		_, all, _ := net.ParseCIDR(fam.all)
		rt := &netlink.Route{Dst: all, LinkIndex: lo.Attrs().Index, Table: int(maps.ProxyMarkTable), Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST}
		if err := netlink.RouteReplace(rt); err != nil {
			if fam.family == unix.AF_INET6 && (errors.Is(err, unix.EAFNOSUPPORT) || errors.Is(err, unix.EACCES)) {
				return nil
			}
			return fmt.Errorf("proxy route %s in table %d: %w", fam.all, maps.ProxyMarkTable, err)
		}
		rule := netlink.NewRule()
		rule.Family = fam.family
		rule.Mark = maps.ProxyMarkValue
		mask := maps.ProxyMarkMask
		rule.Mask = &mask
		rule.Table = int(maps.ProxyMarkTable)
		rule.Priority = 9
		if err := netlink.RuleAdd(rule); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("proxy routing rule (family %d): %w", fam.family, err)
		}
	}
	return nil
}

func (r *Redirect) sender(addr netip.Addr) (Sender, bool) { return r.cfg.Endpoint(addr.Unmap()) }

func (r *Redirect) serve() {
	dcfg := r.cfg.DNS
	if dcfg.Log == nil {
		dcfg.Log = r.log
	}
	dcfg.Endpoint = func(a netip.Addr) (fqdn.Source, bool) {
		s, ok := r.sender(a)
		return fqdn.Source{EndpointID: s.EndpointID, Identity: s.Identity}, ok
	}
	dcfg.Rules = func(ep uint16, dst netip.AddrPort) []api.PortRuleDNS {
		var out []api.PortRuleDNS
		for _, proto := range []uint8{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			rules := r.cfg.Rules(ep, dst, proto)
			if rules == nil {
				continue
			}
			if rules.AllowAll {
				return []api.PortRuleDNS{{MatchPattern: "*"}}
			}
			out = append(out, rules.DNS...)
		}
		return out
	}
	dcfg.OrigDst = func(w dns.ResponseWriter) netip.AddrPort {
		if u, ok := w.(*udpWriter); ok {
			return u.orig
		}
		return addrPort(w.LocalAddr())
	}
	dcfg.Dial = r.dial
	r.dnsProxy = fqdn.NewProxy(dcfg)
	r.httpPx = l7proxy.NewHTTP(l7proxy.Config{
		Rules: func(src l7proxy.Source, dst netip.AddrPort) []api.PortRuleHTTP {
			rules := r.cfg.Rules(src.EndpointID, dst, unix.IPPROTO_TCP)
			if rules == nil {
				return nil
			}
			if rules.AllowAll {
				return []api.PortRuleHTTP{{}}
			}
			return rules.HTTP
		},
		Dial: r.dialAs,
		Flow: r.cfg.HTTPFlow,
		Log:  r.log,
	})
	r.httpInPx = l7proxy.NewHTTP(l7proxy.Config{
		Rules: func(src l7proxy.Source, dst netip.AddrPort) []api.PortRuleHTTP {
			to, ok := r.sender(dst.Addr())
			if !ok || r.cfg.IngressRules == nil {
				return nil
			}
			rules := r.cfg.IngressRules(to.EndpointID, src.Identity, src.Addr, dst.Port())
			if rules == nil {
				return nil
			}
			if rules.AllowAll {
				return []api.PortRuleHTTP{{}}
			}
			return rules.HTTP
		},
		Dial:    func(_, dst netip.AddrPort) (net.Conn, error) { return r.dialUpstream(dst) },
		Flow:    r.cfg.HTTPFlow,
		Ingress: true,
		Log:     r.log,
	})
	tcpPort := uint16(r.dnsTCP.Addr().(*net.TCPAddr).Port)
	r.dnsSrv = &dns.Server{Listener: r.dnsTCP, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		if addrPort(w.LocalAddr()).Port() == tcpPort {
			// Sent to the listener directly (see direct).
			_ = w.Close()
			return
		}
		r.dnsProxy.ServeDNS(w, req)
	})}
	r.wg.Add(4)
	go func() {
		defer r.wg.Done()
		r.serveHTTPIngress()
	}()
	go func() {
		defer r.wg.Done()
		if err := r.dnsSrv.ActivateAndServe(); err != nil && !errors.Is(err, net.ErrClosed) {
			r.log.Debug("DNS proxy TCP server stopped", "error", err)
		}
	}()
	go func() {
		defer r.wg.Done()
		r.serveUDP()
	}()
	go func() {
		defer r.wg.Done()
		r.serveHTTP()
	}()
}

// dial opens an upstream connection from the node's namespace.
func (r *Redirect) dial(network, addr string) (c net.Conn, err error) {
	err = r.cfg.InNodeNS(func() error {
		c, err = net.DialTimeout(network, addr, 5*time.Second)
		return err
	})
	return c, err
}

// dialAs opens the HTTP proxy's upstream connection for a pod's
// redirected connection from client (the pod's address and port) to dst,
// from the pod's own address and port: the same tuple as the pod's flow.
// The destination (its node's ipcache, the tunnel key to_overlay sets from
// the local endpoint, a local pod's to_pod) sees the pod and its identity,
// not the node, and the flow's conntrack entry is the pod's: its replies
// are steered to this socket by the datapath (bpf/lib/proxy.h).
//
// The socket is IP_TRANSPARENT (bound to an address the node does not
// have), SO_REUSEADDR (a pod's kernel gives one port to connections to
// different destinations, and their upstream sockets must each bind it)
// and marked PROXY_MARK_EGRESS_UPSTREAM: a local destination's to_pod
// delivers its packets under the client's flow without letting them close
// or replace it.
// The pod's tuple cannot collide with another of the pod's flows (its own
// kernel made it unique) nor with the accepted socket of the pod's
// connection (whose local side is dst: the node's table keys it the other
// way round). It can still be taken here: a redial while the closed
// upstream connection's TIME_WAIT holds the tuple. Then the connection
// leaves from the node's address, as before the pod's address was kept
// (another port of the pod's address would be a tuple without the pod's
// conntrack entry, whose replies the datapath would not find the socket
// for), and it is logged.
func (r *Redirect) dialAs(client, dst netip.AddrPort) (net.Conn, error) {
	if !client.Addr().Is4() || client.Port() == 0 {
		return r.dial("tcp", dst.String())
	}
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(client), Control: func(_, _ string, raw syscall.RawConn) error {
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
			}
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(maps.ProxyMarkEgressUpstream))
			}
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("transparent upstream socket: %w", serr)
		}
		return nil
	}}
	var c net.Conn
	err := r.cfg.InNodeNS(func() (err error) {
		c, err = d.Dial("tcp4", dst.String())
		return err
	})
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, unix.EADDRINUSE) && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return nil, fmt.Errorf("upstream connection from %s to %s: %w", client, dst, err)
	}
	r.log.Info("HTTP proxy: the client's tuple is taken upstream; connecting from the node's address", "client", client, "dst", dst, "error", err)
	return r.dial("tcp", dst.String())
}

// dialUpstream opens the ingress proxy's connection to the pod it serves
// (or the egress proxy's to a local pod whose ingress HTTP rules it applies
// too, see egressOptions), from the node's namespace, marked
// PROXY_MARK_UPSTREAM (SO_MARK): the pod's to_pod admits it without its
// ingress policy.
func (r *Redirect) dialUpstream(dst netip.AddrPort) (c net.Conn, err error) {
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, raw syscall.RawConn) error {
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(maps.ProxyMarkUpstream))
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("mark the ingress proxy's upstream socket: %w", serr)
		}
		return nil
	}}
	err = r.cfg.InNodeNS(func() error {
		c, err = d.Dial("tcp", dst.String())
		return err
	})
	return c, err
}

// ingressPeer names the peer of a connection the datapath sent to the
// ingress listener, from the flow's conntrack entry, which must name the
// ingress proxy, the connecting side as the flow's source and, as the
// destination, the local endpoint that still owns dst and admitted it:
//
//   - a local source (its from_pod redirected the flow): the endpoint the
//     entry names on its side, which must still own the address; its
//     identity is the endpoint's;
//   - a source on another node (from_netdev or from_overlay redirected
//     it, bpf/lib/l7ingress.h): the entry marks the source not local and
//     holds the identity the datapath gave it (the ipcache's, checked
//     against the tunnel's node in tunnel mode); no local endpoint may own
//     the address. The identity is never derived from the address here.
//
// False for anything else (a connection made to the listener directly, a
// flow no redirect recorded).
func (r *Redirect) ingressPeer(src, dst netip.AddrPort) (Sender, bool) {
	e, ok, err := r.ct.Lookup(maps.CTEntry{Proto: unix.IPPROTO_TCP, Src: src.Addr(), SrcPort: src.Port(), Dst: dst.Addr(), DstPort: dst.Port()})
	if err != nil || !ok {
		return Sender{}, false
	}
	if e.Proxy != maps.ProxyHttpIngress || e.Src != src.Addr() || e.SrcPort != src.Port() || e.DstEndpoint == 0 {
		return Sender{}, false
	}
	if to, ok := r.sender(dst.Addr()); !ok || to.EndpointID != e.DstEndpoint {
		return Sender{}, false
	}
	from, local := r.sender(src.Addr())
	if e.SrcEndpoint == 0 {
		if local || e.Flags&maps.CTFlagSrcNotLocal == 0 || e.SrcIdentity == 0 {
			return Sender{}, false
		}
		return Sender{Identity: e.SrcIdentity}, true
	}
	if !local || from.EndpointID != e.SrcEndpoint {
		return Sender{}, false
	}
	return from, true
}

// egressOptions are what the egress HTTP proxy needs for a flow from
// local endpoint from (at src) to dst beyond the source's egress rules,
// from the flow's conntrack entry (the datapath's record of what it
// decided in the source's from_pod, bpf/bpf_lxc.c from_pod_flow): when
// the entry names the local endpoint that owns dst as having admitted the
// flow (its ingress policy allowed the source's identity at L3/L4) and
// says that the destination's ingress entry named the HTTP proxy too
// (PROXY_HTTP_BOTH), the destination's ingress HTTP rules for the source's
// identity apply as well (a request passes only when both allow it; nil
// rules allow nothing), and the upstream connection leaves from the node
// marked PROXY_MARK_UPSTREAM, as the ingress proxy's: the destination's
// to_pod does not decide it again for the node.
//
// Anything else: the source's egress rules alone, and the upstream
// connection from the pod's own address and port (dialAs), which the
// destination's policy decides for the pod's identity.
func (r *Redirect) egressOptions(src netip.AddrPort, from Sender, dst netip.AddrPort) l7proxy.ConnOptions {
	to, ok := r.sender(dst.Addr())
	if !ok {
		return l7proxy.ConnOptions{}
	}
	e, ok, err := r.ct.Lookup(maps.CTEntry{Proto: unix.IPPROTO_TCP, Src: src.Addr(), SrcPort: src.Port(), Dst: dst.Addr(), DstPort: dst.Port()})
	if err != nil || !ok || e.Src != src.Addr() || e.SrcPort != src.Port() ||
		e.SrcEndpoint != from.EndpointID || e.DstEndpoint != to.EndpointID {
		return l7proxy.ConnOptions{}
	}
	switch e.Proxy {
	case maps.ProxyHttpBoth:
		both := &l7proxy.Both{}
		if r.cfg.IngressRules != nil {
			if rules := r.cfg.IngressRules(to.EndpointID, from.Identity, src.Addr(), dst.Port()); rules != nil {
				both.IngressRules = rules.HTTP
				if rules.AllowAll {
					both.IngressRules = []api.PortRuleHTTP{{}}
				}
			}
		}
		return l7proxy.ConnOptions{Both: both, Dial: func(_, dst netip.AddrPort) (net.Conn, error) { return r.dialUpstream(dst) }}
	}
	return l7proxy.ConnOptions{}
}

func (r *Redirect) serveHTTPIngress() {
	for {
		c, err := r.httpIn.Accept()
		if err != nil {
			return
		}
		go func() {
			src := addrPort(c.RemoteAddr())
			src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
			dst := addrPort(c.LocalAddr())
			dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
			peer, ok := r.ingressPeer(src, dst)
			if !ok {
				r.log.Debug("Ingress HTTP proxy: a connection the datapath did not redirect", "src", src, "dst", dst)
				c.Close()
				return
			}
			r.httpInPx.ServeConn(c, l7proxy.Source{EndpointID: peer.EndpointID, Identity: peer.Identity, Addr: src.Addr()}, dst)
		}()
	}
}

// addrPort is a socket address with an IPv4-mapped address unmapped (a
// dual-stack socket's IPv4 peers and local addresses are mapped).
func addrPort(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func (r *Redirect) serveHTTP() {
	for {
		c, err := r.http.Accept()
		if err != nil {
			return
		}
		go func() {
			src, ok := r.sender(addrPort(c.RemoteAddr()).Addr())
			if !ok {
				// Not a local endpoint's: nothing here may proxy it.
				r.log.Debug("HTTP proxy: connection from no local endpoint", "src", c.RemoteAddr())
				c.Close()
				return
			}
			// The accepted socket's local address is the flow's
			// original destination (IP_TRANSPARENT).
			dst := addrPort(c.LocalAddr())
			dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
			if r.direct(dst, r.http) {
				r.log.Debug("HTTP proxy: a connection to the proxy itself, not redirected", "src", c.RemoteAddr())
				c.Close()
				return
			}
			from := addrPort(c.RemoteAddr())
			from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
			r.httpPx.ServeConnWith(c, l7proxy.Source{EndpointID: src.EndpointID, Identity: src.Identity}, dst, r.egressOptions(from, src, dst))
		}()
	}
}

// serveUDP reads redirected queries; each carries its original
// destination (IP_ORIGDSTADDR), where it is forwarded and whence the
// answer is sent.
func (r *Redirect) serveUDP() {
	buf := make([]byte, dns.MaxMsgSize)
	oob := make([]byte, 256)
	for {
		n, oobn, _, from, err := r.dnsUDP.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		orig, ok := origDst(oob[:oobn])
		if !ok || r.direct(orig, nil) {
			r.log.Debug("DNS proxy: a datagram not redirected by the datapath", "src", from)
			continue
		}
		req := new(dns.Msg)
		if err := req.Unpack(buf[:n]); err != nil {
			continue
		}
		w := &udpWriter{orig: orig, from: netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), inNS: r.cfg.InNodeNS}
		go r.dnsProxy.ServeDNS(w, req)
	}
}

// direct reports whether a flow's original destination is the proxy's
// own port (the DNS proxy's when l is nil): the datapath redirects flows
// to their policy's port, so this one was sent to the listener directly
// (from anywhere that reaches the node's address, not through a pod's
// from_pod and its anti-spoofing) and is not served.
func (r *Redirect) direct(dst netip.AddrPort, l net.Listener) bool {
	dnsPort, httpPort := r.Ports()
	if l != nil {
		return dst.Port() == httpPort
	}
	return dst.Port() == dnsPort
}

// origDst reads IP_ORIGDSTADDR (an IPv4 datagram) or IPV6_ORIGDSTADDR
// (an IPv6 one) from a datagram's control messages: a sockaddr_in or
// sockaddr_in6, the port in network order at offset 2.
func origDst(oob []byte) (netip.AddrPort, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.AddrPort{}, false
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.SOL_IP && m.Header.Type == unix.IP_ORIGDSTADDR && len(m.Data) >= unix.SizeofSockaddrInet4:
			port := uint16(m.Data[2])<<8 | uint16(m.Data[3])
			a := netip.AddrFrom4([4]byte(m.Data[4:8]))
			return netip.AddrPortFrom(a, port), true
		case m.Header.Level == unix.SOL_IPV6 && m.Header.Type == unix.IPV6_ORIGDSTADDR && len(m.Data) >= unix.SizeofSockaddrInet6:
			port := uint16(m.Data[2])<<8 | uint16(m.Data[3])
			a := netip.AddrFrom16([16]byte(m.Data[8:24])).Unmap()
			return netip.AddrPortFrom(a, port), true
		}
	}
	return netip.AddrPort{}, false
}

// udpWriter answers one redirected query from its original destination:
// a transparent socket bound to that address and port, so the pod's
// socket (connected to the server) takes the answer.
type udpWriter struct {
	orig, from netip.AddrPort
	inNS       func(func() error) error
}

func (w *udpWriter) LocalAddr() net.Addr  { return net.UDPAddrFromAddrPort(w.orig) }
func (w *udpWriter) RemoteAddr() net.Addr { return net.UDPAddrFromAddrPort(w.from) }
func (w *udpWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func (w *udpWriter) Write(b []byte) (int, error) {
	v4 := w.orig.Addr().Is4()
	if v4 != w.from.Addr().Is4() {
		return 0, fmt.Errorf("answer %s from %s: the families differ", w.from, w.orig)
	}
	family, level, opt := unix.AF_INET6, unix.SOL_IPV6, unix.IPV6_TRANSPARENT
	var local, peer unix.Sockaddr
	if v4 {
		family, level, opt = unix.AF_INET, unix.SOL_IP, unix.IP_TRANSPARENT
		local = &unix.SockaddrInet4{Port: int(w.orig.Port()), Addr: w.orig.Addr().As4()}
		peer = &unix.SockaddrInet4{Port: int(w.from.Port()), Addr: w.from.Addr().As4()}
	} else {
		local = &unix.SockaddrInet6{Port: int(w.orig.Port()), Addr: w.orig.Addr().As16()}
		peer = &unix.SockaddrInet6{Port: int(w.from.Port()), Addr: w.from.Addr().As16()}
	}
	var fd int
	err := w.inNS(func() (err error) {
		fd, err = unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("answer socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, level, opt, 1); err != nil {
		return 0, fmt.Errorf("answer socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return 0, fmt.Errorf("answer socket: %w", err)
	}
	if err := unix.Bind(fd, local); err != nil {
		return 0, fmt.Errorf("bind the answer to %s: %w", w.orig, err)
	}
	if err := unix.Sendto(fd, b, 0, peer); err != nil {
		return 0, fmt.Errorf("answer %s: %w", w.from, err)
	}
	return len(b), nil
}

func (w *udpWriter) Close() error        { return nil }
func (w *udpWriter) TsigStatus() error   { return nil }
func (w *udpWriter) TsigTimersOnly(bool) {}
func (w *udpWriter) Hijack()             {}

// Close stops the listeners: their sockets leave the datapath's map as
// they close (the datapath then falls back, see bpf_lxc.c's to_proxy).
func (r *Redirect) Close() error {
	var errs []error
	if r.dnsSrv != nil {
		_ = r.dnsSrv.Shutdown()
	} else if r.dnsTCP != nil {
		errs = append(errs, r.dnsTCP.Close())
	}
	for _, c := range []interface{ Close() error }{r.dnsUDP, r.http, r.httpIn} {
		if c != nil && !isNil(c) {
			errs = append(errs, c.Close())
		}
	}
	r.wg.Wait()
	if r.ports != nil {
		// No listener: the datapath falls back (a kill leaves the ports,
		// and the datapath then finds no listener on them).
		for _, proxy := range []uint8{maps.ProxyDns, maps.ProxyHttp, maps.ProxyHttpIngress} {
			errs = append(errs, r.ports.Update(uint32(proxy), uint32(0), ebpf.UpdateAny))
		}
		r.ports.Close()
	}
	if r.sockets != nil {
		r.sockets.Close()
	}
	for _, m := range r.ctMaps {
		m.Close()
	}
	return errors.Join(errs...)
}

func isNil(c interface{ Close() error }) bool {
	switch v := c.(type) {
	case *net.UDPConn:
		return v == nil
	case net.Listener:
		return v == nil
	}
	return false
}
