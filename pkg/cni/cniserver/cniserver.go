// Package cniserver is the agent's side of tendril-cni: it runs the CNI
// commands the plugin forwards (POST /v1/cni/{command}) inside the agent.
// ADD allocates the pod's addresses from the agent's IPAM, creates the veth
// pair (the peer directly inside the pod's namespace), configures the pod's
// addresses, neighbor entries and routes through a netlink handle at the
// pod's namespace, and creates the endpoint, whose synchronous build adds
// the node's routes and the datapath; any failure undoes what was done.
// DEL, CHECK, STATUS and GC work on the same state.
//
// Doing this in the agent rather than in the plugin process keeps the
// plugin small (a node starts one per attachment) and lets the work share
// the agent's long-lived netlink handles, IPAM and endpoint manager
// instead of going through the REST API step by step.
package cniserver

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/datapath/linux"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/ipam"
)

// Endpoints is what the server needs of the agent's endpoint manager.
type Endpoints interface {
	// Create adds the endpoint and returns once its datapath is built
	// (the synchronous build of the Cilium API's PUT /endpoint). A failure
	// leaves no endpoint behind.
	Create(ctx context.Context, ep *endpoint.Endpoint) (*endpoint.Endpoint, error)
	// Lookup finds an endpoint by an ID of the Cilium API ("N",
	// "cni-attachment-id:CID:IF", "container-id:CID", ...).
	Lookup(id string) (*endpoint.Endpoint, error)
	// Delete removes an endpoint and releases its addresses.
	Delete(ctx context.Context, id uint16) error
	// List returns every endpoint.
	List() []*endpoint.Endpoint
	// IsNotFound reports whether err means no such endpoint.
	IsNotFound(err error) bool
}

// Deps are the agent's parts the server works with.
type Deps struct {
	Log       *slog.Logger
	IPAM      *ipam.IPAM
	Endpoints Endpoints
	// Netlink is a routing-netlink handle of the agent's (the node's)
	// network namespace, where the host sides of the veths live. ADD and
	// DEL open a socket of their own there instead (commandNetlink): one
	// handle serializes its requests on a lock, and 50 concurrent ADDs
	// queued on it (25 s of blocking in a profile of 40 bursts).
	Netlink *netlink.Handle
	// Host is the node's host networking in the same namespace.
	Host *linux.Host
	// DeviceMTU is the pods' MTU unless the configuration sets "mtu".
	DeviceMTU int
	// GCGracePeriod is how young an endpoint GC keeps although the
	// runtime's valid attachments do not name it (DefaultGCGracePeriod
	// unless configured; 0 keeps only endpoints created after GC began).
	GCGracePeriod time.Duration
}

// Server runs CNI commands.
type Server struct {
	deps Deps
	log  *slog.Logger
	// netns identifies the agent's network namespace ("device:inode").
	netns string
	// nodeNS is the agent's network namespace, for commandNetlink.
	nodeNS netns.NsHandle
	// now is the clock GC compares endpoints' creation times with.
	now func() time.Time

	mu sync.Mutex
	// owners serializes the commands of one IPAM owner (a pod): its
	// allocation stays unclaimed until the endpoint exists, and a second
	// command of the same pod in that window would be handed the same
	// address.
	owners map[string]*ownerLock
}

type ownerLock struct {
	mu   sync.Mutex
	refs int
}

// New returns a server working in the caller's network namespace.
func New(deps Deps) (*Server, error) {
	if deps.IPAM == nil || deps.Endpoints == nil || deps.Netlink == nil || deps.Host == nil {
		return nil, fmt.Errorf("cni server: IPAM, endpoints, netlink handle and host networking are required")
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	self, err := netnsID("/proc/self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("cni server: identify own network namespace: %w", err)
	}
	nodeNS, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("cni server: open own network namespace: %w", err)
	}
	return &Server{deps: deps, log: deps.Log, netns: self, nodeNS: nodeNS, now: time.Now, owners: map[string]*ownerLock{}}, nil
}

// commandNetlink opens a routing-netlink socket in the node's namespace
// for one command; the caller closes it.
func (s *Server) commandNetlink() (*netlink.Handle, error) {
	return netlink.NewHandleAt(s.nodeNS, unix.NETLINK_ROUTE)
}

// Serve runs one CNI command. ADD answers the result in the
// configuration's cniVersion, the other commands nil.
func (s *Server) Serve(ctx context.Context, command string, req *cni.Request) ([]byte, *cni.Error) {
	switch command {
	case cni.CommandAdd:
		return s.add(ctx, req)
	case cni.CommandDel:
		return nil, s.del(ctx, req)
	case cni.CommandCheck:
		return nil, s.check(req)
	case cni.CommandStatus:
		return nil, s.status(req)
	case cni.CommandGC:
		return nil, s.gc(ctx, req)
	}
	return nil, cni.Errorf(cni.ErrInvalidEnvironmentVariables, "unknown CNI command %q", command)
}

// lockOwner serializes commands of one IPAM owner; the returned func
// unlocks.
func (s *Server) lockOwner(owner string) func() {
	s.mu.Lock()
	l, ok := s.owners[owner]
	if !ok {
		l = &ownerLock{}
		s.owners[owner] = l
	}
	l.refs++
	s.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(s.owners, owner)
		}
		s.mu.Unlock()
	}
}

// checkPluginNetNS refuses a plugin that runs in another network namespace
// than the agent: the host side of the veth would be created in the
// agent's, not the node the runtime meant (a socket of another node's
// agent in the configuration).
func (s *Server) checkPluginNetNS(pluginNetNS string) *cni.Error {
	if pluginNetNS == "" || pluginNetNS == s.netns {
		return nil
	}
	return cni.Errorf(cni.ErrInvalidNetworkConfig,
		"the plugin runs in network namespace %s, the agent behind agent-socket in %s: the socket belongs to another node's agent", pluginNetNS, s.netns)
}

// netnsID is "device:inode" of a network namespace file.
func netnsID(path string) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil
}

// cniError keeps a *cni.Error and gives anything else code.
func cniError(code uint, msg string, err error) *cni.Error {
	if e, ok := err.(*cni.Error); ok {
		return e
	}
	return cni.NewError(code, msg, err.Error())
}
