package cniserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/ipam"
)

// addresses are what IPAM gave a pod.
type addresses struct {
	owner            string
	v4, v6           netip.Addr
	router4, router6 netip.Addr
}

// family is one address family of a pod's addresses.
type family struct {
	ip, router net.IP
	bits       int
	family     int
}

func (a *addresses) families() []family {
	var out []family
	if a.v4.IsValid() {
		out = append(out, family{ip: a.v4.AsSlice(), router: a.router4.AsSlice(), bits: 32, family: unix.AF_INET})
	}
	if a.v6.IsValid() {
		out = append(out, family{ip: a.v6.AsSlice(), router: a.router6.AsSlice(), bits: 128, family: unix.AF_INET6})
	}
	return out
}

// zero is the family's default destination.
func (f family) zero() *net.IPNet {
	if f.family == unix.AF_INET {
		return &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	}
	return &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
}

// allocate takes one address of every enabled family for owner, all or
// nothing. The allocations stay unclaimed until the endpoint claims them.
func (s *Server) allocate(owner string) (*addresses, *cni.Error) {
	a := &addresses{owner: owner}
	for _, f := range []ipam.Family{ipam.IPv4, ipam.IPv6} {
		if !s.deps.IPAM.Enabled(f) {
			continue
		}
		al, err := s.deps.IPAM.AllocateNext(f, owner)
		if err != nil {
			s.release(a)
			return nil, cni.NewError(cni.ErrAllocation, "allocate pod address for "+owner, err.Error())
		}
		if f == ipam.IPv4 {
			a.v4, a.router4 = al.IP, s.deps.IPAM.RouterIP(f)
		} else {
			a.v6, a.router6 = al.IP, s.deps.IPAM.RouterIP(f)
		}
	}
	if !a.v4.IsValid() && !a.v6.IsValid() {
		return nil, cni.Errorf(cni.ErrAllocation, "allocate pod address for %s: the agent has no address family enabled", owner)
	}
	return a, nil
}

// release gives back the addresses that are still the owner's unclaimed
// allocations (an endpoint that was created and deleted again released
// them itself).
func (s *Server) release(a *addresses) {
	for _, ip := range []netip.Addr{a.v4, a.v6} {
		if !ip.IsValid() {
			continue
		}
		if _, err := s.deps.IPAM.ReleaseUnclaimed(ip, a.owner); err != nil {
			s.log.Warn("Rollback: release address", "ip", ip, "error", err)
		}
	}
}

// add creates the pod's network (CNI ADD). Every step after the allocation
// is undone when a later one fails: the addresses go back, the veth is
// removed, the endpoint deleted.
func (s *Server) add(ctx context.Context, req *cni.Request) (_ []byte, retErr *cni.Error) {
	start := time.Now()
	conf, cerr := ParseConfig(req.Config)
	if cerr != nil {
		return nil, cerr
	}
	if err := validateIfName(req.IfName); err != nil {
		return nil, err
	}
	podArgs, cerr := ParseArgs(req.Args)
	if cerr != nil {
		return nil, cerr
	}
	if (podArgs.K8S_POD_NAME == "") != (podArgs.K8S_POD_NAMESPACE == "") {
		return nil, cni.Errorf(cni.ErrInvalidEnvironmentVariables, "CNI_ARGS: K8S_POD_NAMESPACE and K8S_POD_NAME must be given together")
	}
	if err := s.checkPluginNetNS(req.PluginNetNS); err != nil {
		return nil, err
	}
	podNS, err := ns.GetNS(req.Netns)
	if err != nil {
		return nil, netnsError(req.Netns, err)
	}
	defer podNS.Close()
	if id, err := netnsID(req.Netns); err == nil && id == s.netns {
		return nil, cni.Errorf(cni.ErrInvalidEnvironmentVariables, "CNI_NETNS %q is the node's own network namespace", req.Netns)
	}
	log := s.log.With("command", "ADD", "container", req.ContainerID, "ifname", req.IfName, "netns", req.Netns)
	owner := podArgs.Owner(req.ContainerID)
	defer s.lockOwner(owner)()

	attachment := "cni-attachment-id:" + cni.AttachmentID(req.ContainerID, req.IfName)
	if old, err := s.deps.Endpoints.Lookup(attachment); err == nil {
		// An earlier ADD of this attachment whose DEL never came (the
		// runtime retries ADD): its veth is replaced below, so its
		// endpoint is dead; it goes first, with its addresses.
		log.Info("Replacing the endpoint of an earlier ADD of this attachment", "endpoint", old.ID)
		if err := s.deps.Endpoints.Delete(ctx, old.ID); err != nil && !s.deps.Endpoints.IsNotFound(err) {
			log.Warn("Endpoint of the earlier ADD deleted with errors", "endpoint", old.ID, "error", err)
		}
	}
	// The first attachment of a container owns the pod's default route; a
	// second one (another interface of the same container) must not take
	// it over.
	_, otherErr := s.deps.Endpoints.Lookup("container-id:" + req.ContainerID)
	primary := otherErr != nil

	addrs, cerr := s.allocate(owner)
	if cerr != nil {
		return nil, cerr
	}
	hostName := HostVethName(req.ContainerID, req.IfName)
	var created *endpoint.Endpoint
	defer func() {
		if retErr == nil {
			return
		}
		rctx := context.WithoutCancel(ctx)
		if created != nil {
			if err := s.deps.Endpoints.Delete(rctx, created.ID); err != nil && !s.deps.Endpoints.IsNotFound(err) {
				log.Warn("Rollback: delete endpoint", "endpoint", created.ID, "error", err)
			}
		}
		s.release(addrs)
		if err := deleteLink(s.deps.Netlink, hostName); err != nil {
			log.Warn("Rollback: remove host veth", "interface", hostName, "error", err)
		}
		log.Warn("ADD failed; rolled back", "code", retErr.Code, "error", retErr.Error())
	}()

	ph, err := podHandle(podNS)
	if err != nil {
		return nil, cniError(cni.ErrLink, "open the pod's network namespace", err)
	}
	defer ph.Close()
	mtu := conf.MTU
	if mtu == 0 {
		mtu = s.deps.DeviceMTU
	}
	nl, err := s.commandNetlink()
	if err != nil {
		return nil, cniError(cni.ErrLink, "open a netlink socket in the node's namespace", err)
	}
	defer nl.Close()
	hostLink, pod, err := createVeth(nl, ph, hostName, req.IfName, mtu, podNS, log)
	if err != nil {
		return nil, cniError(cni.ErrLink, "create veth pair", err)
	}
	// Before the link goes up: DAD off, so its link-local address can send
	// neighbor solicitations for the pod at once.
	if err := s.deps.Host.ConfigureHostVeth(hostName, nil); err != nil {
		return nil, cniError(cni.ErrLink, "configure host veth", err)
	}
	if err := nl.LinkSetUp(hostLink); err != nil {
		return nil, cniError(cni.ErrLink, "set host veth up", err)
	}
	if err := configurePod(ph, req.IfName, addrs, hostLink.Attrs().HardwareAddr, pod, primary); err != nil {
		return nil, cniError(cni.ErrLink, "configure pod interface", err)
	}

	// The endpoint's synchronous build routes the pod's addresses to the
	// host veth and attaches the datapath; the pod is reachable and under
	// policy when this returns.
	ep := &endpoint.Endpoint{
		ContainerID: req.ContainerID, IfName: req.IfName,
		HostIfName: hostName, HostIfIndex: hostLink.Attrs().Index,
		MAC: pod.mac.String(), HostMAC: hostLink.Attrs().HardwareAddr.String(),
		IPv4: addrs.v4, IPv6: addrs.v6, NetNS: req.Netns,
		PodNamespace: string(podArgs.K8S_POD_NAMESPACE), PodName: string(podArgs.K8S_POD_NAME), K8sUID: string(podArgs.K8S_POD_UID),
		NetworkName: conf.Name,
	}
	created, err = s.deps.Endpoints.Create(ctx, ep)
	if err != nil {
		return nil, cniError(cni.ErrEndpoint, "create endpoint", err)
	}
	if ctx.Err() != nil {
		// The plugin is gone (the runtime gave up on it) and will never
		// print this result: the runtime counts the ADD as failed, so
		// nothing of it may stay.
		return nil, cni.NewError(cni.ErrTryAgainLater, "the plugin went away before the ADD finished", ctx.Err().Error())
	}

	result := buildResult(req, hostLink, pod, addrs, primary)
	versioned, err := result.GetAsVersion(conf.CNIVersion)
	if err != nil {
		return nil, cni.NewError(cni.ErrIncompatibleCNIVersion, "convert result", err.Error())
	}
	var out bytes.Buffer
	if err := versioned.PrintTo(&out); err != nil {
		return nil, cni.NewError(cni.ErrInternal, "encode result", err.Error())
	}
	log.Info("ADD done", "endpoint", created.ID, "ipv4", addrs.v4, "ipv6", addrs.v6, "duration", time.Since(start))
	return out.Bytes(), nil
}

func buildResult(req *cni.Request, host netlink.Link, pod *podLink, a *addresses, defaultRoute bool) *current.Result {
	res := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: host.Attrs().Name, Mac: host.Attrs().HardwareAddr.String()},
			{Name: req.IfName, Mac: pod.mac.String(), Sandbox: req.Netns, Mtu: pod.mtu},
		},
	}
	podIdx := 1
	for _, f := range a.families() {
		res.IPs = append(res.IPs, &current.IPConfig{Interface: &podIdx, Address: net.IPNet{IP: f.ip, Mask: net.CIDRMask(f.bits, f.bits)}, Gateway: f.router})
		if defaultRoute {
			res.Routes = append(res.Routes, &types.Route{Dst: *f.zero(), GW: f.router})
		}
	}
	return res
}

// del removes the pod's network (CNI DEL). It is idempotent: a netns, veth
// or endpoint that is already gone is fine.
func (s *Server) del(ctx context.Context, req *cni.Request) *cni.Error {
	if _, err := ParseConfig(req.Config); err != nil {
		return err
	}
	if err := validateIfName(req.IfName); err != nil {
		return err
	}
	if err := s.checkPluginNetNS(req.PluginNetNS); err != nil {
		return err
	}
	// DEL must not fail for malformed CNI_ARGS (the runtime would retry it
	// forever): they only name the owner whose commands DEL waits for.
	owner := req.ContainerID
	if podArgs, err := ParseArgs(req.Args); err == nil {
		owner = podArgs.Owner(req.ContainerID)
	}
	defer s.lockOwner(owner)()
	// The veth first: removing it removes the pod side and the node's
	// routes to the pod with it.
	hostName := HostVethName(req.ContainerID, req.IfName)
	nl, err := s.commandNetlink()
	if err != nil {
		return cniError(cni.ErrLink, "open a netlink socket in the node's namespace", err)
	}
	defer nl.Close()
	if err := deleteLink(nl, hostName); err != nil {
		return cniError(cni.ErrLink, "remove host veth "+hostName, err)
	}
	// Only this attachment's endpoint: a container with two interfaces
	// keeps the other. Its addresses go with it.
	id := "cni-attachment-id:" + cni.AttachmentID(req.ContainerID, req.IfName)
	ep, err := s.deps.Endpoints.Lookup(id)
	if err != nil {
		if s.deps.Endpoints.IsNotFound(err) {
			return nil
		}
		return cniError(cni.ErrEndpoint, "look up endpoint "+id, err)
	}
	if err := s.deps.Endpoints.Delete(ctx, ep.ID); err != nil && !s.deps.Endpoints.IsNotFound(err) {
		// The endpoint is gone; a teardown step failed (logged). DEL
		// succeeded as far as the runtime is concerned.
		s.log.Warn("Endpoint deleted with errors", "endpoint", ep.ID, "container", req.ContainerID, "error", err)
	}
	s.log.Info("DEL done", "endpoint", ep.ID, "container", req.ContainerID, "ifname", req.IfName)
	return nil
}

// check verifies that the attachment is as ADD left it (CNI CHECK): the
// veth, the pod's interface, addresses and routes, and the endpoint's
// health.
func (s *Server) check(req *cni.Request) *cni.Error {
	conf, cerr := ParseConfig(req.Config)
	if cerr != nil {
		return cerr
	}
	if err := validateIfName(req.IfName); err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return cni.Errorf(cni.ErrInvalidNetworkConfig, "CHECK needs a prevResult")
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return cni.NewError(cni.ErrDecodingFailure, "convert prevResult", err.Error())
	}
	hostName := HostVethName(req.ContainerID, req.IfName)
	if ok, err := s.deps.Host.LinkExists(hostName); err != nil {
		return cniError(cni.ErrCheck, "look up host veth", err)
	} else if !ok {
		return cni.Errorf(cni.ErrCheck, "host veth %s is missing", hostName)
	}
	podNS, err := ns.GetNS(req.Netns)
	if err != nil {
		return netnsError(req.Netns, err)
	}
	defer podNS.Close()
	ph, err := podHandle(podNS)
	if err != nil {
		return cniError(cni.ErrCheck, "open the pod's network namespace", err)
	}
	defer ph.Close()
	if err := checkPod(ph, req.IfName, prev); err != nil {
		return cniError(cni.ErrCheck, "pod interface", err)
	}
	id := "cni-attachment-id:" + cni.AttachmentID(req.ContainerID, req.IfName)
	ep, err := s.deps.Endpoints.Lookup(id)
	if err != nil {
		return cniError(cni.ErrCheck, "endpoint "+id, err)
	}
	if h := ep.Health(); h.OverallHealth == "Failure" {
		return cni.Errorf(cni.ErrCheck, "endpoint %d (%s) is unhealthy: %s", ep.ID, id, ep.LastRegenerationError)
	}
	return nil
}

// status answers whether ADD can be served (CNI STATUS): the agent has a
// pool to give addresses from. (An agent that does not answer is the
// plugin's to report.)
func (s *Server) status(req *cni.Request) *cni.Error {
	if _, err := ParseConfig(req.Config); err != nil {
		return err
	}
	for _, f := range []ipam.Family{ipam.IPv4, ipam.IPv6} {
		if s.deps.IPAM.Enabled(f) && s.deps.IPAM.CIDR(f).IsValid() {
			return nil
		}
	}
	return cni.Errorf(cni.ErrPluginNotAvailable, "agent has no pod address range yet")
}

// gc removes the endpoints (and their veths) of this network's
// attachments that are not in cni.dev/valid-attachments (CNI GC). Three
// things keep an endpoint whatever the list says:
//   - it is not this network's: GC of one network never touches another's,
//     nor endpoints without a recorded network (the REST API's, those
//     restored from an older agent's state) or without a container ID
//     (host, health);
//   - it is younger than the grace period, or was created after GC began:
//     its ADD may have finished after the runtime listed the valid
//     attachments, so the list cannot speak for it yet;
//   - the configuration has no list at all: the spec makes it GC's input,
//     and a GC without one is refused (code 7) rather than read as
//     "nothing is valid".
func (s *Server) gc(ctx context.Context, req *cni.Request) *cni.Error {
	start := s.now()
	conf, cerr := ParseConfig(req.Config)
	if cerr != nil {
		return cerr
	}
	if err := requireValidAttachments(req.Config); err != nil {
		return err
	}
	if conf.Name == "" {
		return cni.Errorf(cni.ErrInvalidNetworkConfig, "GC: network configuration has no name")
	}
	grace := s.deps.GCGracePeriod
	valid := map[string]bool{}
	for _, a := range conf.ValidAttachments {
		valid[cni.AttachmentID(a.ContainerID, a.IfName)] = true
	}
	var errs []error
	for _, ep := range s.deps.Endpoints.List() {
		if !s.gcCandidate(ep, conf.Name, valid, start.Add(-grace)) {
			continue
		}
		if err := s.gcEndpoint(ctx, ep, conf.Name, valid, start.Add(-grace)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cni.NewError(cni.ErrEndpoint, "garbage-collect attachments", err.Error())
	}
	return nil
}

// DefaultGCGracePeriod is how young an endpoint GC keeps by default: the
// plugin's whole ADD timeout, so an ADD the runtime has not recorded yet
// when it lists the valid attachments is not collected.
const DefaultGCGracePeriod = 2 * time.Minute

// gcCandidate reports whether GC of network may remove ep: a CNI
// attachment of that network, created before cutoff, not in valid.
func (s *Server) gcCandidate(ep *endpoint.Endpoint, network string, valid map[string]bool, cutoff time.Time) bool {
	return ep.ContainerID != "" && ep.IfName != "" && ep.NetworkName == network &&
		!valid[cni.AttachmentID(ep.ContainerID, ep.IfName)] && ep.Created.Before(cutoff)
}

// gcEndpoint removes one stale attachment under its owner's lock, after
// looking it up again: an ADD of the same attachment that ran since the
// listing replaced the endpoint, and the new one is not this GC's.
func (s *Server) gcEndpoint(ctx context.Context, listed *endpoint.Endpoint, network string, valid map[string]bool, cutoff time.Time) error {
	defer s.lockOwner(listed.IPAMOwner())()
	ep, err := s.deps.Endpoints.Lookup("cni-attachment-id:" + listed.AttachmentID())
	if err != nil {
		if s.deps.Endpoints.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("look up endpoint %d: %w", listed.ID, err)
	}
	if ep.ID != listed.ID || !ep.Created.Equal(listed.Created) || !s.gcCandidate(ep, network, valid, cutoff) {
		return nil
	}
	s.log.Info("GC: removing stale attachment", "network", network, "endpoint", ep.ID, "container", ep.ContainerID, "ifname", ep.IfName, "created", ep.Created)
	var errs []error
	if err := s.deps.Endpoints.Delete(ctx, ep.ID); err != nil && !s.deps.Endpoints.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("endpoint %d: %w", ep.ID, err))
	}
	if err := deleteLink(s.deps.Netlink, HostVethName(ep.ContainerID, ep.IfName)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// requireValidAttachments refuses a GC configuration without a
// cni.dev/valid-attachments list (absent or null). An empty list is an
// answer (nothing of this network is valid); no list is not.
func requireValidAttachments(config []byte) *cni.Error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(config, &keys); err != nil {
		return cni.NewError(cni.ErrDecodingFailure, "decode network configuration", err.Error())
	}
	if raw, ok := keys[ValidAttachmentsKey]; !ok || string(bytes.TrimSpace(raw)) == "null" {
		return cni.Errorf(cni.ErrInvalidNetworkConfig,
			"GC needs %s in the network configuration (the spec requires it); without it nothing is collected", ValidAttachmentsKey)
	}
	return nil
}

// ValidAttachmentsKey is the configuration key of GC's valid attachments.
const ValidAttachmentsKey = "cni.dev/valid-attachments"

// netnsError reports a CNI_NETNS that cannot be opened: code 4, naming
// CNI_NETNS (the spec has no code of its own for it).
func netnsError(path string, err error) *cni.Error {
	return cni.NewError(cni.ErrInvalidEnvironmentVariables,
		fmt.Sprintf("CNI_NETNS %q: cannot open the network namespace", path), err.Error())
}
