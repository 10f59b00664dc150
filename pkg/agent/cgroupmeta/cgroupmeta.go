// Package cgroupmeta is the agent's cell for the pods' cgroups: it maps a
// cgroup ID (what the socket load-balancer's events carry for the
// connecting process) to the local endpoint of the pod whose cgroup it is,
// finding the pods' cgroups under --cgroup-root as the kubelet lays them
// out (pod<uid>, kubepods-…-pod<uid>.slice) and the endpoints by their pod
// UID; the flows of socket-LB connections name their client pod with it
// (pkg/agent/agentflows), and GET /v1/cgroup-dump-metadata serves it as
// the Cilium v1 API defines.
package cgroupmeta

import (
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/api/v1/server"
	"github.com/tendril-net/tendril/pkg/agent/agentendpoints"
	"github.com/tendril-net/tendril/pkg/agent/agentservices"
	"github.com/tendril-net/tendril/pkg/cgroups"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/observer"
)

// Cell provides the *Resolver (nil without --cgroup-root) and its API.
var Cell = cell.Module("cgroup-metadata", "Pods by cgroup ID for socket load-balancer flows",
	cell.Provide(newResolver, apiHandlers),
)

// Endpoints lists the local endpoints.
type Endpoints interface {
	ListForAPI() ([]*endpoint.Endpoint, error)
}

// Resolver maps cgroup IDs to the local endpoints of their pods.
type Resolver struct {
	root string
	eps  Endpoints
	log  *slog.Logger
	now  func() time.Time

	mu sync.Mutex
	// byID is the last scan's cgroups by ID; scanned is when it ran.
	byID    map[uint64]cgroups.Cgroup
	scanned time.Time
}

// rescanEvery bounds how often a lookup of an unknown cgroup scans the
// hierarchy again (a new pod's cgroup appears after the last scan).
const rescanEvery = time.Second

type params struct {
	cell.In

	Services agentservices.Config
	Log      *slog.Logger
	// Endpoints is nil without the endpoints module.
	Endpoints *agentendpoints.Module `optional:"true"`
}

func newResolver(p params) *Resolver {
	if p.Services.CgroupRoot == "" || p.Endpoints == nil {
		return nil
	}
	return New(p.Services.CgroupRoot, p.Endpoints, p.Log)
}

// New is a resolver of the cgroups under root.
func New(root string, eps Endpoints, log *slog.Logger) *Resolver {
	return &Resolver{root: root, eps: eps, log: log, now: time.Now, byID: map[uint64]cgroups.Cgroup{}}
}

func (r *Resolver) scanLocked() {
	cgs, err := cgroups.Scan(r.root)
	r.scanned = r.now()
	if err != nil {
		r.log.Warn("Cannot scan the pods' cgroups", "root", r.root, "error", err)
		return
	}
	r.byID = make(map[uint64]cgroups.Cgroup, len(cgs))
	for _, c := range cgs {
		r.byID[c.ID] = c
	}
}

// cgroup finds a cgroup, scanning again if it is unknown and the last
// scan is old enough.
func (r *Resolver) cgroup(id uint64) (cgroups.Cgroup, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.byID[id]
	if !ok && r.now().Sub(r.scanned) >= rescanEvery {
		r.scanLocked()
		c, ok = r.byID[id]
	}
	return c, ok
}

func (r *Resolver) endpointOf(uid string) (*endpoint.Endpoint, bool) {
	eps, err := r.eps.ListForAPI()
	if err != nil {
		return nil, false
	}
	for _, ep := range eps {
		if ep.K8sUID != "" && ep.K8sUID == uid {
			return ep, true
		}
	}
	return nil, false
}

// EndpointByCgroup is the local endpoint of the pod cgroup id belongs to.
func (r *Resolver) EndpointByCgroup(id uint64) (observer.Endpoint, bool) {
	if r == nil {
		return observer.Endpoint{}, false
	}
	c, ok := r.cgroup(id)
	if !ok {
		return observer.Endpoint{}, false
	}
	ep, ok := r.endpointOf(c.PodUID)
	if !ok {
		return observer.Endpoint{}, false
	}
	return observer.Endpoint{ID: uint32(ep.ID), Identity: ep.Identity, Namespace: ep.PodNamespace, PodName: ep.PodName, Labels: ep.Labels}, true
}

// Dump is the Cilium v1 CgroupDumpMetadata: every local pod whose cgroups
// were found, with its containers' cgroups and its addresses.
func (r *Resolver) Dump() (*models.CgroupDumpMetadata, error) {
	r.mu.Lock()
	r.scanLocked()
	cgs := make([]cgroups.Cgroup, 0, len(r.byID))
	for _, c := range r.byID {
		cgs = append(cgs, c)
	}
	r.mu.Unlock()
	eps, err := r.eps.ListForAPI()
	if err != nil {
		return nil, err
	}
	byUID := map[string]*endpoint.Endpoint{}
	for _, ep := range eps {
		if ep.K8sUID != "" {
			byUID[ep.K8sUID] = ep
		}
	}
	pods := map[string]*models.CgroupPodMetadata{}
	for _, c := range cgs {
		ep, ok := byUID[c.PodUID]
		if !ok {
			continue
		}
		pm, ok := pods[c.PodUID]
		if !ok {
			pm = &models.CgroupPodMetadata{Name: ep.PodName, Namespace: ep.PodNamespace, Containers: []*models.CgroupContainerMetadata{}, Ips: []string{}}
			for _, a := range ep.Addresses() {
				pm.Ips = append(pm.Ips, a.String())
			}
			pods[c.PodUID] = pm
		}
		if c.Container {
			pm.Containers = append(pm.Containers, &models.CgroupContainerMetadata{CgroupID: c.ID, CgroupPath: c.Path})
		}
	}
	out := &models.CgroupDumpMetadata{PodMetadatas: []*models.CgroupPodMetadata{}}
	for _, pm := range pods {
		sort.Slice(pm.Containers, func(i, j int) bool { return pm.Containers[i].CgroupPath < pm.Containers[j].CgroupPath })
		out.PodMetadatas = append(out.PodMetadatas, pm)
	}
	sort.Slice(out.PodMetadatas, func(i, j int) bool {
		a, b := out.PodMetadatas[i], out.PodMetadatas[j]
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	return out, nil
}

// apiHandlers serves GET /v1/cgroup-dump-metadata: with no --cgroup-root
// (no socket load-balancer), an empty dump.
func apiHandlers(r *Resolver) server.HandlersOut {
	return server.Handlers(func(api *server.Server) {
		api.Handle(http.MethodGet, "/v1/cgroup-dump-metadata", func(w http.ResponseWriter, _ *http.Request) error {
			if r == nil {
				server.WriteJSON(w, http.StatusOK, &models.CgroupDumpMetadata{PodMetadatas: []*models.CgroupPodMetadata{}})
				return nil
			}
			d, err := r.Dump()
			if err != nil {
				return server.Errorf(http.StatusInternalServerError, "cgroup metadata: %v", err)
			}
			server.WriteJSON(w, http.StatusOK, d)
			return nil
		})
	})
}
