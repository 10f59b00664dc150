package cni

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	dplinux "github.com/tendril-net/tendril/pkg/datapath/linux"
)

// Config of the plugin process (not of the network: that is NetConf).
type Config struct {
	// Timeout bounds one command, including the agent's synchronous
	// endpoint build.
	Timeout time.Duration
	// Stdout receives the result of ADD (and VERSION, via skel).
	Stdout io.Writer
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Timeout: 2 * time.Minute, Stdout: os.Stdout}
}

// Plugin runs CNI commands in the node's network namespace (the one it was
// started in).
type Plugin struct {
	cfg Config
	log *slog.Logger
}

// New returns a plugin; log may be nil (the log-file of the network
// configuration then decides).
func New(cfg Config, log *slog.Logger) *Plugin {
	return &Plugin{cfg: cfg, log: log}
}

// Funcs are the plugin's commands for skel.PluginMainFuncs.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, Status: p.Status, GC: p.GC}
}

// env is what every command needs: config, logger, agent client, netlink.
type env struct {
	conf   *NetConf
	log    *slog.Logger
	agent  *agentClient
	nl     *netlink.Handle
	host   *dplinux.Host
	closer func()
}

func (p *Plugin) setup(stdin []byte, command string) (*env, error) {
	conf, err := ParseConfig(stdin)
	if err != nil {
		return nil, err
	}
	log, closeLog := p.logger(conf)
	log = log.With("command", command)
	agent, err := newAgentClient(conf.AgentSocket)
	if err != nil {
		closeLog()
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "agent-socket", err.Error())
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		closeLog()
		return nil, cniError(ErrLink, "open netlink", err)
	}
	return &env{
		conf: conf, log: log, agent: agent, nl: nl,
		host: dplinux.NewHost(nl, netns.None(), log),
		closer: func() {
			nl.Close()
			closeLog()
		},
	}, nil
}

func (p *Plugin) logger(conf *NetConf) (*slog.Logger, func()) {
	if p.log != nil {
		return p.log, func() {}
	}
	if conf.LogFile == "" {
		return slog.New(slog.DiscardHandler), func() {}
	}
	f, err := os.OpenFile(conf.LogFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
	if err != nil {
		// Logging must never fail a pod's network setup.
		return slog.New(slog.DiscardHandler), func() {}
	}
	return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug})).With("pid", os.Getpid()), func() { f.Close() }
}

func (p *Plugin) context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), p.cfg.Timeout)
}

// addresses are what the agent gave a pod.
type addresses struct {
	v4, v6           net.IP
	router4, router6 net.IP
	expire4, expire6 string
	allocated        []net.IP
}

// Add creates the pod's network (CNI ADD).
func (p *Plugin) Add(args *skel.CmdArgs) (retErr error) {
	e, err := p.setup(args.StdinData, "ADD")
	if err != nil {
		return err
	}
	defer e.closer()
	start := time.Now()
	log := e.log.With("container", args.ContainerID, "ifname", args.IfName, "netns", args.Netns)
	defer func() {
		if retErr != nil {
			log.Warn("ADD failed", "error", retErr)
		} else {
			log.Info("ADD done", "duration", time.Since(start))
		}
	}()
	if err := validateIfName(args.IfName); err != nil {
		return err
	}
	podArgs, err := ParseArgs(args.Args)
	if err != nil {
		return err
	}
	podNS, err := ns.GetNS(args.Netns)
	if err != nil {
		return netnsError(args.Netns, err)
	}
	defer podNS.Close()

	ctx, cancel := p.context()
	defer cancel()

	agentConf, err := e.agent.configGet(ctx)
	if err != nil {
		return cniError(ErrAgent, "read agent configuration", err)
	}
	mtu := e.conf.MTU
	if mtu == 0 && agentConf.Status != nil {
		mtu = int(agentConf.Status.DeviceMTU)
	}

	hostName := HostVethName(args.ContainerID, args.IfName)

	owner := podArgs.Owner(args.ContainerID)
	ipam, err := e.agent.ipamAllocate(ctx, owner)
	if err != nil {
		if agentUnreachable(err) {
			return cniError(ErrAllocation, "allocate pod address", err)
		}
		return types.NewError(ErrAllocation, fmt.Sprintf("allocate pod address for %s", owner), err.Error())
	}
	addrs, err := parseIPAM(ipam)
	// From here on every failure gives the addresses back and removes the
	// veth: a failed ADD leaves nothing behind.
	defer func() {
		if retErr == nil {
			return
		}
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer rcancel()
		for _, ip := range addrs.allocated {
			if err := e.agent.ipamRelease(rctx, ip.String()); err != nil && !isNotFound(err) {
				log.Warn("Rollback: release address", "ip", ip, "error", err)
			}
		}
		if err := deleteLink(e.nl, hostName); err != nil {
			log.Warn("Rollback: remove host veth", "interface", hostName, "error", err)
		}
	}()
	if err != nil {
		return types.NewError(ErrAgent, "agent's IPAM answer unusable", err.Error())
	}

	hostLink, pod, err := createVeth(e.nl, hostName, args.IfName, mtu, podNS, log)
	if err != nil {
		return cniError(ErrLink, "create veth pair", err)
	}
	if err := e.host.ConfigureHostVeth(hostName, nil); err != nil {
		return cniError(ErrLink, "configure host veth", err)
	}
	if err := e.nl.LinkSetUp(hostLink); err != nil {
		return cniError(ErrLink, "set host veth up", err)
	}
	if err := configurePod(podNS, args.IfName, addrs, hostLink.Attrs().HardwareAddr, pod); err != nil {
		return cniError(ErrLink, "configure pod interface", err)
	}
	// The agent installs the pod's routes too (it must, for plugins that do
	// not); doing it here as well makes the pod reachable as soon as ADD
	// returns, independent of the agent's ordering.
	for _, ip := range []net.IP{addrs.v4, addrs.v6} {
		if ip != nil {
			if err := e.host.UpsertEndpointRoute(ip, hostLink.Attrs().Index); err != nil {
				return cniError(ErrLink, "route pod address", err)
			}
		}
	}

	req := &endpointChangeRequest{
		ContainerID:            args.ContainerID,
		ContainerInterfaceName: args.IfName,
		InterfaceName:          hostName,
		InterfaceIndex:         int64(hostLink.Attrs().Index),
		HostMac:                hostLink.Attrs().HardwareAddr.String(),
		Mac:                    pod.mac.String(),
		K8sNamespace:           string(podArgs.K8S_POD_NAMESPACE),
		K8sPodName:             string(podArgs.K8S_POD_NAME),
		K8sUID:                 string(podArgs.K8S_POD_UID),
		Properties:             map[string]any{"netns-path": args.Netns},
		SyncBuildEndpoint:      true,
		State:                  "waiting-for-identity",
		Addressing: &addressPair{
			IPV4: ipString(addrs.v4), IPV4ExpirationUUID: addrs.expire4,
			IPV6: ipString(addrs.v6), IPV6ExpirationUUID: addrs.expire6,
		},
		DatapathConfiguration: &endpointDatapathConfiguration{
			InstallEndpointRoute: true,
		},
	}
	err = e.agent.endpointPut(ctx, "cilium-local:0", req)
	if apiCode(err) == http.StatusConflict {
		// The agent still has an endpoint for this attachment: an earlier
		// ADD whose DEL never came (the runtime retries ADD). Its veth was
		// replaced above, so it is dead; replace it.
		stale := "cni-attachment-id:" + AttachmentID(args.ContainerID, args.IfName)
		log.Info("Replacing stale endpoint of this attachment", "endpoint", stale)
		if derr := e.agent.endpointDelete(ctx, stale); derr != nil && !isNotFound(derr) {
			return cniError(ErrEndpoint, "delete stale endpoint "+stale, derr)
		}
		err = e.agent.endpointPut(ctx, "cilium-local:0", req)
	}
	if err != nil {
		if agentUnreachable(err) {
			return cniError(ErrEndpoint, "create endpoint", err)
		}
		return types.NewError(ErrEndpoint, "agent refused the endpoint", err.Error())
	}

	result := buildResult(args, hostLink, pod, addrs)
	versioned, err := result.GetAsVersion(e.conf.CNIVersion)
	if err != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, "convert result", err.Error())
	}
	if err := versioned.PrintTo(p.cfg.Stdout); err != nil {
		return types.NewError(types.ErrIOFailure, "write result", err.Error())
	}
	return nil
}

// parseIPAM reads the agent's allocation. The router address is the host
// addressing's IP (what cilium-cni uses as the gateway), else the gateway
// of the family's answer. allocated is filled first so a partial answer is
// still released on failure.
func parseIPAM(r *ipamResponse) (*addresses, error) {
	a := &addresses{}
	if r == nil || r.Address == nil {
		return a, errors.New("no address in the answer")
	}
	if r.Address.IPV4 != "" {
		if a.v4 = net.ParseIP(r.Address.IPV4).To4(); a.v4 == nil {
			return a, fmt.Errorf("ipv4 %q is not an IPv4 address", r.Address.IPV4)
		}
		a.allocated = append(a.allocated, a.v4)
	}
	if r.Address.IPV6 != "" {
		if a.v6 = net.ParseIP(r.Address.IPV6); a.v6 == nil || a.v6.To4() != nil {
			return a, fmt.Errorf("ipv6 %q is not an IPv6 address", r.Address.IPV6)
		}
		a.allocated = append(a.allocated, a.v6)
	}
	if a.v4 == nil && a.v6 == nil {
		return a, errors.New("the answer holds neither an IPv4 nor an IPv6 address")
	}
	a.expire4, a.expire6 = r.Address.IPV4ExpirationUUID, r.Address.IPV6ExpirationUUID
	router := func(host *nodeAddressingElement, fam *ipamAddressResponse) (net.IP, string) {
		var s string
		if host != nil && host.IP != "" {
			s = host.IP
		} else if fam != nil {
			s = fam.Gateway
		}
		return net.ParseIP(s), s
	}
	var h4, h6 *nodeAddressingElement
	if r.HostAddressing != nil {
		h4, h6 = r.HostAddressing.IPV4, r.HostAddressing.IPV6
	}
	if a.v4 != nil {
		var s string
		a.router4, s = router(h4, r.IPV4)
		if a.router4 == nil || a.router4.To4() == nil {
			return a, fmt.Errorf("no IPv4 router address (host-addressing.ipv4.ip %q)", s)
		}
		a.router4 = a.router4.To4()
		if r.IPV4 != nil && a.expire4 == "" {
			a.expire4 = r.IPV4.ExpirationUUID
		}
	}
	if a.v6 != nil {
		var s string
		a.router6, s = router(h6, r.IPV6)
		if a.router6 == nil || a.router6.To4() != nil {
			return a, fmt.Errorf("no IPv6 router address (host-addressing.ipv6.ip %q)", s)
		}
		if r.IPV6 != nil && a.expire6 == "" {
			a.expire6 = r.IPV6.ExpirationUUID
		}
	}
	return a, nil
}

func ipString(ip net.IP) string {
	if ip == nil {
		return ""
	}
	return ip.String()
}

func buildResult(args *skel.CmdArgs, host netlink.Link, pod *podLink, a *addresses) *current.Result {
	res := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: host.Attrs().Name, Mac: host.Attrs().HardwareAddr.String()},
			{Name: args.IfName, Mac: pod.mac.String(), Sandbox: args.Netns, Mtu: pod.mtu},
		},
	}
	podIdx := 1
	if a.v4 != nil {
		res.IPs = append(res.IPs, &current.IPConfig{Interface: &podIdx, Address: *dplinux.HostPrefix(a.v4), Gateway: a.router4})
		res.Routes = append(res.Routes, &types.Route{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, GW: a.router4})
	}
	if a.v6 != nil {
		res.IPs = append(res.IPs, &current.IPConfig{Interface: &podIdx, Address: *dplinux.HostPrefix(a.v6), Gateway: a.router6})
		res.Routes = append(res.Routes, &types.Route{Dst: net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, GW: a.router6})
	}
	return res
}

// Del removes the pod's network (CNI DEL). It is idempotent: a netns, veth
// or endpoint that is already gone is fine.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	e, err := p.setup(args.StdinData, "DEL")
	if err != nil {
		return err
	}
	defer e.closer()
	log := e.log.With("container", args.ContainerID, "ifname", args.IfName)
	ctx, cancel := p.context()
	defer cancel()

	// The veth goes first: it is local and cannot fail for lack of the
	// agent, and removing it also removes the pod's host routes.
	hostName := HostVethName(args.ContainerID, args.IfName)
	if err := deleteLink(e.nl, hostName); err != nil {
		return cniError(ErrLink, "remove host veth "+hostName, err)
	}
	// The agent releases the endpoint's addresses with it. Only this
	// attachment's endpoint goes: a container with two interfaces keeps
	// the other.
	attachment := "cni-attachment-id:" + args.ContainerID + ":" + args.IfName
	if err := e.agent.endpointDelete(ctx, attachment); err != nil && !isNotFound(err) {
		if agentUnreachable(err) {
			// The runtime retries DEL; the agent's restore also drops
			// endpoints whose interface is gone.
			return cniError(ErrEndpoint, "delete endpoint", err)
		}
		return types.NewError(ErrEndpoint, "delete endpoint of attachment "+args.ContainerID+":"+args.IfName, err.Error())
	}
	log.Info("DEL done")
	return nil
}

// Check verifies that the attachment is as ADD left it (CNI CHECK): the
// veth, the pod's interface, addresses and routes, and the endpoint's health.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	e, err := p.setup(args.StdinData, "CHECK")
	if err != nil {
		return err
	}
	defer e.closer()
	if e.conf.PrevResult == nil {
		return errorf(types.ErrInvalidNetworkConfig, "CHECK needs a prevResult")
	}
	prev, err := current.NewResultFromResult(e.conf.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "convert prevResult", err.Error())
	}
	hostName := HostVethName(args.ContainerID, args.IfName)
	if ok, err := e.host.LinkExists(hostName); err != nil {
		return cniError(ErrCheck, "look up host veth", err)
	} else if !ok {
		return errorf(ErrCheck, "host veth %s is missing", hostName)
	}
	podNS, err := ns.GetNS(args.Netns)
	if err != nil {
		return netnsError(args.Netns, err)
	}
	defer podNS.Close()
	if err := checkPod(podNS, args.IfName, prev); err != nil {
		return cniError(ErrCheck, "pod interface", err)
	}
	ctx, cancel := p.context()
	defer cancel()
	id := "cni-attachment-id:" + AttachmentID(args.ContainerID, args.IfName)
	health, err := e.agent.endpointHealthz(ctx, id)
	if err != nil {
		if agentUnreachable(err) {
			return cniError(ErrCheck, "endpoint health", err)
		}
		return types.NewError(ErrCheck, "endpoint "+id, err.Error())
	}
	if health.OverallHealth == "Failure" {
		return errorf(ErrCheck, "endpoint %s is unhealthy (bpf %s, policy %s)", id, health.Bpf, health.Policy)
	}
	return nil
}

// Status answers whether the plugin can serve ADD (CNI STATUS): the agent
// answers and has a pool to give addresses from.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	e, err := p.setup(args.StdinData, "STATUS")
	if err != nil {
		return err
	}
	defer e.closer()
	ctx, cancel := p.context()
	defer cancel()
	cfg, err := e.agent.configGet(ctx)
	if err != nil {
		return types.NewError(ErrPluginNotAvailable, "agent not reachable at "+e.agent.Socket(), err.Error())
	}
	if cfg.Status == nil || cfg.Status.Addressing == nil {
		return errorf(ErrPluginNotAvailable, "agent reports no addressing")
	}
	a := cfg.Status.Addressing
	v4 := a.IPV4 != nil && a.IPV4.Enabled && a.IPV4.AllocRange != ""
	v6 := a.IPV6 != nil && a.IPV6.Enabled && a.IPV6.AllocRange != ""
	if !v4 && !v6 {
		return errorf(ErrPluginNotAvailable, "agent has no pod address range yet")
	}
	return nil
}

// GC removes the endpoints (and their veths) of attachments that are not
// in cni.dev/valid-attachments (CNI GC).
func (p *Plugin) GC(args *skel.CmdArgs) error {
	e, err := p.setup(args.StdinData, "GC")
	if err != nil {
		return err
	}
	defer e.closer()
	ctx, cancel := p.context()
	defer cancel()
	valid, validCID := map[string]bool{}, map[string]bool{}
	for _, a := range e.conf.ValidAttachments {
		valid[AttachmentID(a.ContainerID, a.IfName)] = true
		validCID[a.ContainerID] = true
	}
	eps, err := e.agent.endpointList(ctx)
	if err != nil {
		return cniError(ErrEndpoint, "list endpoints", err)
	}
	var errs []error
	for _, ep := range eps {
		cid, ifname := endpointAttachment(ep)
		// An endpoint without an interface name is kept while any
		// attachment of its container is valid.
		if cid == "" || valid[AttachmentID(cid, ifname)] || (ifname == "" && validCID[cid]) {
			continue
		}
		e.log.Info("GC: removing stale attachment", "endpoint", ep.ID, "container", cid, "ifname", ifname)
		if err := e.agent.endpointDelete(ctx, strconv.FormatInt(ep.ID, 10)); err != nil && !isNotFound(err) {
			errs = append(errs, err)
		}
		if ifname != "" {
			if err := deleteLink(e.nl, HostVethName(cid, ifname)); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cniError(ErrEndpoint, "garbage-collect attachments", err)
	}
	return nil
}

// endpointAttachment returns an endpoint's container ID and interface name,
// empty for endpoints that are not CNI attachments (host, health).
func endpointAttachment(ep *endpoint) (string, string) {
	if ep == nil || ep.Status == nil {
		return "", ""
	}
	var cid, ifname string
	if ids := ep.Status.ExternalIdentifiers; ids != nil {
		cid = ids.ContainerID
	}
	if n := ep.Status.Networking; n != nil {
		ifname = n.ContainerInterfaceName
	}
	return cid, ifname
}

// deleteLink removes an interface of the node's namespace; a missing one is
// not an error.
func deleteLink(nl *netlink.Handle, name string) error {
	link, err := nl.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up %s: %w", name, err)
	}
	if err := nl.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// netnsError reports a netns path that cannot be opened. The spec (1.1) has
// no code of its own for it: 4, invalid environment variables, naming
// CNI_NETNS as the spec asks. (The Go library's code 8 is not in the spec.)
func netnsError(path string, err error) error {
	return types.NewError(types.ErrInvalidEnvironmentVariables,
		fmt.Sprintf("CNI_NETNS %q: cannot open the network namespace", path), err.Error())
}
