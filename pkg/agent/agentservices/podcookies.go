package agentservices

import (
	"log/slog"
	"sync"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/pkg/endpointmanager"
	"github.com/tendril-net/tendril/pkg/lifecycle"
	"github.com/tendril-net/tendril/pkg/loadbalancer/lrpsource"
	"github.com/tendril-net/tendril/pkg/namedns"
)

// registerPodCookies has the local redirect source told each pod
// endpoint's network namespace cookie (skipRedirectFromBackend names the
// backend pods by it). Without Kubernetes or endpoints, nothing.
func registerPodCookies(p podCookieParams) lifecycle.Invoked {
	if p.Module.lrp != nil && p.Endpoints != nil {
		p.Endpoints.Subscribe(newPodCookies(p.Module.lrp, p.Log).onEndpoint)
	}
	return lifecycle.Invoked{}
}

type podCookieParams struct {
	cell.In

	Module    *Module
	Endpoints Endpoints `optional:"true"`
	Log       *slog.Logger
}

// podCookies tells the local redirect source each pod endpoint's network
// namespace cookie (skipRedirectFromBackend). The cookie is read once per
// endpoint and namespace path: endpoint events come at every
// regeneration, and reading it enters the namespace.
type podCookies struct {
	lrp *lrpsource.Source
	log *slog.Logger

	mu   sync.Mutex
	byEP map[uint16]podCookie
}

type podCookie struct {
	pod, netns string
	cookie     uint64
}

func newPodCookies(lrp *lrpsource.Source, log *slog.Logger) *podCookies {
	return &podCookies{lrp: lrp, log: log, byEP: map[uint16]podCookie{}}
}

func (c *podCookies) onEndpoint(ev endpointmanager.Event) {
	ep := ev.Endpoint
	if ep == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old, had := c.byEP[ep.ID]
	if ev.Kind == endpointmanager.EventDelete || ep.PodName == "" || ep.NetNS == "" {
		if had {
			delete(c.byEP, ep.ID)
			c.lrp.SetNetnsCookie(old.pod, 0)
		}
		return
	}
	pod := ep.PodNamespace + "/" + ep.PodName
	if had && old.pod == pod && old.netns == ep.NetNS {
		return
	}
	cookie, err := namedns.NetnsCookie(ep.NetNS)
	if err != nil {
		// The pod is then redirected as any other client.
		c.log.Warn("No network namespace cookie for a pod: skipRedirectFromBackend does not apply to it", "pod", pod, "endpoint", ep.ID, "error", err)
		return
	}
	if had && old.pod != pod {
		c.lrp.SetNetnsCookie(old.pod, 0)
	}
	c.byEP[ep.ID] = podCookie{pod: pod, netns: ep.NetNS, cookie: cookie}
	c.lrp.SetNetnsCookie(pod, cookie)
}
