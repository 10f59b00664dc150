// Package agentl7 is the agent's L7 redirect cell: it runs the node's
// transparent DNS proxy (UDP and TCP) and HTTP proxy (pkg/l7redirect)
// once the datapath's maps are open, naming senders from the endpoint
// table, enforcing the L7 rules of each endpoint's resolved policy
// (agentpolicy.Module.L7Rules), putting what the DNS proxy learns into
// policy before answers are released (agentfqdn) and publishing both
// proxies' L7 flows into the observer.
package agentl7

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"

	"github.com/cilium/hive/cell"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/agent/agentdatapath"
	"github.com/tendril-net/tendril/pkg/agent/agentfqdn"
	"github.com/tendril-net/tendril/pkg/agent/agentpolicy"
	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/l7redirect"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/observer"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/policy"
)

// Cell runs the proxies the datapath redirects L7 ports to.
var Cell = cell.Module("l7redirect", "The DNS and HTTP proxies the datapath sends L7 ports to",
	cell.Provide(register),
)

type params struct {
	cell.In

	Agent     option.Agent
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Steps     *lifecycle.Steps
	// Datapath is nil with --enable-datapath=false: no redirect, no
	// proxies.
	Datapath  *agentdatapath.Module `optional:"true"`
	Endpoints agentpolicy.Endpoints
	Policy    *agentpolicy.Module
	FQDN      *agentfqdn.Manager
	Flows     observer.L7Sink `optional:"true"`
}

type proxies struct {
	p params
	r *l7redirect.Redirect
	// unhairpin detaches the L7 hairpin (nil: not attached).
	unhairpin func() error
}

func register(p params) lifecycle.Invoked {
	if p.Datapath != nil {
		x := &proxies{p: p}
		p.Steps.Append(p.Lifecycle, "l7-proxies", x.start, x.stop)
	}
	return lifecycle.Invoked{}
}

func (x *proxies) start(context.Context) error {
	p := x.p
	if p.Datapath.Maps() == nil {
		return nil
	}
	cfg := redirectConfig(p)
	r, err := l7redirect.Start(cfg)
	if err != nil {
		// Not fatal: without the proxies the datapath lets DNS pass as
		// its L4 allow says and keeps other L7 ports closed.
		p.Log.Warn("L7 proxies not running: DNS rules do not filter names and HTTP-rule ports stay closed", "error", err)
		return nil
	}
	x.r = r
	dnsPort, httpPort := r.Ports()
	p.Log.Info("L7 proxies listening", "dns-port", dnsPort, "http-port", httpPort)
	x.attachHairpin()
	return nil
}

// attachHairpin puts the datapath's L7 hairpin on the host device
// (docs/policy-l7.md, "The node as a source"): the node's own flows to a
// pod's port with ingress HTTP rules then reach the ingress proxy. Not
// fatal: without it those flows stay closed, as before.
func (x *proxies) attachHairpin() {
	p := x.p
	ld := p.Datapath.Loader()
	if ld == nil {
		return
	}
	dev, err := netlink.LinkByName(linux.HostDeviceName)
	if err != nil {
		p.Log.Warn("L7 hairpin not attached: the node's own flows to ports with ingress HTTP rules stay closed", "device", linux.HostDeviceName, "error", err)
		return
	}
	detach, err := ld.AttachL7Hairpin(dev.Attrs().Index)
	if err != nil {
		p.Log.Warn("L7 hairpin not attached: the node's own flows to ports with ingress HTTP rules stay closed", "device", linux.HostDeviceName, "error", err)
		return
	}
	x.unhairpin = detach
}

// redirectConfig is what the proxies get from the agent: senders from the
// endpoint table, rules from the resolved policy, the DNS proxy's port
// (--tofqdns-proxy-port) and hooks from the FQDN cell, flows into the
// observer.
func redirectConfig(p params) l7redirect.Config {
	cfg := l7redirect.Config{
		BPFRoot: p.Agent.BPFRoot,
		DNSPort: p.FQDN.ProxyPort(),
		Endpoint: func(addr netip.Addr) (l7redirect.Sender, bool) {
			mgr := p.Endpoints.Manager()
			if mgr == nil {
				return l7redirect.Sender{}, false
			}
			owner, ok := mgr.LookupAddr(addr)
			if !ok {
				return l7redirect.Sender{}, false
			}
			return l7redirect.Sender{EndpointID: owner.EndpointID, Identity: owner.Identity}, true
		},
		Rules: p.Policy.L7Rules,
		IngressRules: func(ep uint16, src uint32, srcAddr netip.Addr, port uint16) *policy.L7Rules {
			return p.Policy.L7IngressRules(ep, identity.NumericIdentity(src), srcAddr, port, unix.IPPROTO_TCP)
		},
		DNS: p.FQDN.ProxyConfig(),
		Log: p.Log,
	}
	if p.Flows != nil {
		cfg.HTTPFlow = p.Flows.PublishL7
	}
	return cfg
}

func (x *proxies) stop(context.Context) error {
	var errs []error
	if x.unhairpin != nil {
		errs = append(errs, x.unhairpin())
		x.unhairpin = nil
	}
	if x.r != nil {
		errs = append(errs, x.r.Close())
	}
	return errors.Join(errs...)
}
