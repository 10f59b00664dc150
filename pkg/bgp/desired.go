package bgp

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// Defaults of a session whose TendrilBGPPeerConfig leaves them out
// (RFC 4271's suggested timers; Cilium's restart time).
const (
	DefaultHoldTime     = 90
	DefaultKeepAlive    = 30
	DefaultConnectRetry = 120
	DefaultRestartTime  = 120
	DefaultPort         = 179
)

// Peer is one session the speaker runs.
type Peer struct {
	Name    string
	Address netip.Addr
	ASN     uint32
	Port    uint16
	// Timers in seconds.
	HoldTime, KeepAlive, ConnectRetry uint32
	GracefulRestart                   bool
	RestartTime                       uint32
	// EBGPMultihop is the TTL (0: directly connected).
	EBGPMultihop uint8
	// Password is the TCP MD5 password ("": none). Never logged or shown:
	// String leaves it out.
	Password string
}

// String is the peer without its password (what %v and %+v print).
func (p Peer) String() string {
	auth := ""
	if p.Password != "" {
		auth = " md5"
	}
	return fmt.Sprintf("%s %s AS%d port %d%s", p.Name, p.Address, p.ASN, p.Port, auth)
}

// Advert is one prefix to announce and what asked for it.
type Advert struct {
	Prefix netip.Prefix
	// Source is "pod CIDR" or "service <namespace>/<name>".
	Source string
	// Attributes are those of every advertisement entry that selected the
	// prefix, merged.
	Attributes Attributes
}

// Refusal is a prefix an advertisement asked for that is not announced.
type Refusal struct {
	Prefix netip.Prefix
	Source string
	Reason string
}

func (r Refusal) String() string { return fmt.Sprintf("%s (%s): %s", r.Prefix, r.Source, r.Reason) }

// Desired is what this node's speaker runs; Config "" (and nothing else
// set) when no TendrilBGPClusterConfig selects the node.
type Desired struct {
	// Config is the TendrilBGPClusterConfig applied.
	Config   string
	LocalASN uint32
	Peers    []Peer
	// Adverts are sorted by prefix, one per prefix.
	Adverts []Advert
	Refused []Refusal
	// Errors are the problems of the configuration that keep part of it
	// from applying: another config selecting the node, a peer refused.
	Errors []string
}

// Input is everything the desired state is computed from.
type Input struct {
	NodeName   string
	NodeLabels map[string]string
	// PodCIDRs are the node's own (its IPAM's).
	PodCIDRs       []netip.Prefix
	ClusterConfigs []*v1alpha1.TendrilBGPClusterConfig
	PeerConfigs    []*v1alpha1.TendrilBGPPeerConfig
	Adverts        []*v1alpha1.TendrilBGPAdvertisement
	Services       []*loadbalancer.Service
	// LocalReady says whether the service has a ready backend on this
	// node (for externalTrafficPolicy Local).
	LocalReady func(loadbalancer.ServiceName) bool
	// Allowed is the guard every prefix passes.
	Allowed Allowed
	// Passwords are the "password" keys of the Secrets in the BGP secrets
	// namespace, by Secret name (a Secret without the key is absent).
	Passwords map[string]string
	// SecretsNamespace is that namespace, for messages.
	SecretsNamespace string
}

// Compute is the node's desired state. Every advert passes in.Allowed;
// what does not is in Refused with the reason.
func Compute(in Input) Desired {
	var d Desired
	configs := slices.Clone(in.ClusterConfigs)
	slices.SortFunc(configs, func(a, b *v1alpha1.TendrilBGPClusterConfig) int { return strings.Compare(a.Name, b.Name) })
	var cc *v1alpha1.TendrilBGPClusterConfig
	for _, c := range configs {
		sel, err := selector(c.Spec.NodeSelector)
		if err != nil {
			d.Errors = append(d.Errors, fmt.Sprintf("TendrilBGPClusterConfig %s: nodeSelector: %v", c.Name, err))
			continue
		}
		if !sel.Matches(labels.Set(in.NodeLabels)) {
			continue
		}
		if cc != nil {
			d.Errors = append(d.Errors, fmt.Sprintf("TendrilBGPClusterConfig %s also selects the node: ignored (%s applies, the first by name)", c.Name, cc.Name))
			continue
		}
		cc = c
	}
	if cc == nil {
		return d
	}
	if cc.Spec.LocalASN < 1 || cc.Spec.LocalASN > 1<<32-1 {
		d.Errors = append(d.Errors, fmt.Sprintf("TendrilBGPClusterConfig %s: localASN %d out of range", cc.Name, cc.Spec.LocalASN))
		return d
	}
	d.Config, d.LocalASN = cc.Name, uint32(cc.Spec.LocalASN)
	pcs := map[string]*v1alpha1.TendrilBGPPeerConfig{}
	for _, pc := range in.PeerConfigs {
		pcs[pc.Name] = pc
	}
	seen := map[netip.Addr]string{}
	for _, p := range cc.Spec.Peers {
		peer, err := parsePeer(p, pcs, in)
		if err == nil && seen[peer.Address] != "" {
			err = fmt.Errorf("address %s is peer %s's too", peer.Address, seen[peer.Address])
		}
		if err != nil {
			d.Errors = append(d.Errors, fmt.Sprintf("peer %s: %v", p.Name, err))
			continue
		}
		seen[peer.Address] = peer.Name
		d.Peers = append(d.Peers, peer)
	}

	advSel, err := selector(cc.Spec.AdvertisementSelector)
	if cc.Spec.AdvertisementSelector == nil {
		advSel = labels.Nothing()
	}
	if err != nil {
		d.Errors = append(d.Errors, fmt.Sprintf("advertisementSelector: %v", err))
		return d
	}
	want := map[netip.Prefix]Advert{}
	var attrs Attributes // the entry's being added
	add := func(p netip.Prefix, source string) {
		if a, dup := want[p]; dup {
			a.Attributes = a.Attributes.Merge(attrs)
			want[p] = a
			return
		}
		if err := in.Allowed.Admit(p); err != nil {
			d.Refused = append(d.Refused, Refusal{Prefix: p, Source: source, Reason: err.Error()})
			return
		}
		want[p] = Advert{Prefix: p, Source: source, Attributes: attrs}
	}
	adverts := slices.Clone(in.Adverts)
	slices.SortFunc(adverts, func(a, b *v1alpha1.TendrilBGPAdvertisement) int { return strings.Compare(a.Name, b.Name) })
	for _, a := range adverts {
		if !advSel.Matches(labels.Set(a.Labels)) {
			continue
		}
		for i, e := range a.Spec.Advertisements {
			var err error
			if attrs, err = ParseAttributes(e.Attributes); err != nil {
				// Not announced at all: without the attributes asked for
				// (a no-export, say) the prefixes could go where they
				// must not.
				d.Errors = append(d.Errors, fmt.Sprintf("TendrilBGPAdvertisement %s: advertisement %d: attributes: %v (not announced)", a.Name, i, err))
				continue
			}
			switch e.AdvertisementType {
			case v1alpha1.BGPAdvertPodCIDR:
				for _, c := range in.PodCIDRs {
					add(c.Masked(), "pod CIDR")
				}
			case v1alpha1.BGPAdvertService:
				if e.Service == nil {
					d.Errors = append(d.Errors, fmt.Sprintf("TendrilBGPAdvertisement %s: advertisement %d: Service without service", a.Name, i))
					continue
				}
				if bad := unknownAddressKinds(e.Service.Addresses); len(bad) > 0 {
					d.Errors = append(d.Errors, fmt.Sprintf("TendrilBGPAdvertisement %s: advertisement %d: unknown address kinds %q", a.Name, i, bad))
					continue
				}
				svcSel, err := selector(e.Service.Selector)
				if err != nil {
					d.Errors = append(d.Errors, fmt.Sprintf("TendrilBGPAdvertisement %s: advertisement %d: selector: %v", a.Name, i, err))
					continue
				}
				for _, s := range in.Services {
					if !svcSel.Matches(labels.Set(s.Labels)) {
						continue
					}
					d.serviceAdverts(in, s, e.Service.Addresses, add)
				}
			default:
				d.Errors = append(d.Errors, fmt.Sprintf("TendrilBGPAdvertisement %s: advertisement %d: unknown type %q", a.Name, i, e.AdvertisementType))
			}
		}
	}
	for _, a := range want {
		d.Adverts = append(d.Adverts, a)
	}
	slices.SortFunc(d.Adverts, func(a, b Advert) int { return comparePrefix(a.Prefix, b.Prefix) })
	slices.SortFunc(d.Refused, func(a, b Refusal) int {
		return cmp.Or(comparePrefix(a.Prefix, b.Prefix), strings.Compare(a.Source, b.Source))
	})
	d.Refused = slices.Compact(d.Refused)
	return d
}

// serviceAdverts adds a Service's addresses of the kinds asked for.
// Load-balancer and external addresses must lie in a pool that serves
// the Service (external IPs are whatever the Service's writer put there:
// CVE-2020-8554), and with externalTrafficPolicy Local are announced only
// while the node has a ready backend of it; cluster IPs must lie in the
// cluster's service CIDRs, and with internalTrafficPolicy Local follow the
// same rule.
func (d *Desired) serviceAdverts(in Input, s *loadbalancer.Service, kinds []string, add func(netip.Prefix, string)) {
	source := "service " + s.Name.String()
	local := in.LocalReady != nil && in.LocalReady(s.Name)
	each := func(addrs []netip.Addr, admit func(netip.Addr) error) {
		for _, a := range addrs {
			a = a.Unmap()
			p := netip.PrefixFrom(a, a.BitLen())
			if err := admit(a); err != nil {
				d.Refused = append(d.Refused, Refusal{Prefix: p, Source: source, Reason: err.Error()})
				continue
			}
			add(p, source)
		}
	}
	inPool := func(a netip.Addr) error { return in.Allowed.admitService(a, s.Labels) }
	externalOK := s.ExternalTrafficPolicy != "Local" || local
	if slices.Contains(kinds, v1alpha1.BGPServiceAddressLoadBalancerIP) && externalOK {
		each(s.LoadBalancerIPs, inPool)
	}
	if slices.Contains(kinds, v1alpha1.BGPServiceAddressExternalIP) && externalOK {
		each(s.ExternalIPs, inPool)
	}
	if slices.Contains(kinds, v1alpha1.BGPServiceAddressClusterIP) && (s.InternalTrafficPolicy != "Local" || local) {
		each(s.Addresses, in.Allowed.admitClusterIP)
	}
}

// unknownAddressKinds are the kinds in kinds that are none of the three.
func unknownAddressKinds(kinds []string) []string {
	var bad []string
	for _, k := range kinds {
		switch k {
		case v1alpha1.BGPServiceAddressLoadBalancerIP, v1alpha1.BGPServiceAddressExternalIP, v1alpha1.BGPServiceAddressClusterIP:
		default:
			bad = append(bad, k)
		}
	}
	return bad
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// parsePeer checks a peer and fills in its session from its peer config.
func parsePeer(p v1alpha1.BGPPeer, pcs map[string]*v1alpha1.TendrilBGPPeerConfig, in Input) (Peer, error) {
	addr, err := netip.ParseAddr(p.PeerAddress)
	if err != nil {
		return Peer{}, fmt.Errorf("peerAddress: %w", err)
	}
	addr = addr.Unmap()
	if addr.IsUnspecified() || addr.IsMulticast() || addr.IsLoopback() {
		return Peer{}, fmt.Errorf("peerAddress %s: not a unicast address", addr)
	}
	if p.PeerASN < 1 || p.PeerASN > 1<<32-1 {
		return Peer{}, fmt.Errorf("peerASN %d out of range", p.PeerASN)
	}
	out := Peer{Name: p.Name, Address: addr, ASN: uint32(p.PeerASN), Port: DefaultPort,
		HoldTime: DefaultHoldTime, KeepAlive: DefaultKeepAlive, ConnectRetry: DefaultConnectRetry}
	if p.PeerConfigRef == "" {
		return out, nil
	}
	pc, ok := pcs[p.PeerConfigRef]
	if !ok {
		return Peer{}, fmt.Errorf("TendrilBGPPeerConfig %s not found", p.PeerConfigRef)
	}
	s := pc.Spec
	if t := s.Timers; t != nil {
		set := func(dst *uint32, v *int32, name string, lo int32) error {
			if v == nil {
				return nil
			}
			if *v < lo || *v > 65535 {
				return fmt.Errorf("TendrilBGPPeerConfig %s: %s %d out of range", pc.Name, name, *v)
			}
			*dst = uint32(*v)
			return nil
		}
		if err := cmp.Or(set(&out.HoldTime, t.HoldTimeSeconds, "holdTimeSeconds", 3),
			set(&out.KeepAlive, t.KeepAliveTimeSeconds, "keepAliveTimeSeconds", 1),
			set(&out.ConnectRetry, t.ConnectRetryTimeSeconds, "connectRetryTimeSeconds", 1)); err != nil {
			return Peer{}, err
		}
		if out.KeepAlive >= out.HoldTime {
			return Peer{}, fmt.Errorf("TendrilBGPPeerConfig %s: keepalive %ds not below hold time %ds", pc.Name, out.KeepAlive, out.HoldTime)
		}
	}
	if gr := s.GracefulRestart; gr != nil && gr.Enabled {
		out.GracefulRestart, out.RestartTime = true, DefaultRestartTime
		if gr.RestartTimeSeconds != nil {
			if *gr.RestartTimeSeconds < 1 || *gr.RestartTimeSeconds > 4095 {
				return Peer{}, fmt.Errorf("TendrilBGPPeerConfig %s: restartTimeSeconds %d out of range", pc.Name, *gr.RestartTimeSeconds)
			}
			out.RestartTime = uint32(*gr.RestartTimeSeconds)
		}
	}
	if s.EBGPMultihop != nil {
		if *s.EBGPMultihop < 1 || *s.EBGPMultihop > 255 {
			return Peer{}, fmt.Errorf("TendrilBGPPeerConfig %s: ebgpMultihop %d out of range", pc.Name, *s.EBGPMultihop)
		}
		out.EBGPMultihop = uint8(*s.EBGPMultihop)
	}
	if s.PeerPort != nil {
		if *s.PeerPort < 1 || *s.PeerPort > 65535 {
			return Peer{}, fmt.Errorf("TendrilBGPPeerConfig %s: peerPort %d out of range", pc.Name, *s.PeerPort)
		}
		out.Port = uint16(*s.PeerPort)
	}
	if ref := s.AuthSecretRef; ref != nil {
		// No session without the password asked for: the router would
		// refuse it anyway, and a session that quietly drops its
		// authentication is worse than one that is down and says why.
		pw, ok := in.Passwords[*ref]
		switch {
		case !ok:
			return Peer{}, fmt.Errorf("TendrilBGPPeerConfig %s: authSecretRef: Secret %s/%s not found or without a %q key", pc.Name, in.SecretsNamespace, *ref, "password")
		case pw == "" || len(pw) > MaxPasswordLen:
			return Peer{}, fmt.Errorf("TendrilBGPPeerConfig %s: authSecretRef: Secret %s/%s: the password must be 1-%d bytes", pc.Name, in.SecretsNamespace, *ref, MaxPasswordLen)
		}
		out.Password = pw
	}
	return out, nil
}

// MaxPasswordLen is the longest TCP MD5 key the kernel takes
// (TCP_MD5SIG_MAXKEYLEN).
const MaxPasswordLen = 80
