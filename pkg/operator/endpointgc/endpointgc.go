// Package endpointgc deletes TendrilEndpoints whose pod is gone or has
// finished (Failed or Succeeded), on the leader, every
// --endpoint-gc-interval. A candidate from the cache is confirmed with a
// live read of the pod (the cache may not have seen a pod created a moment
// ago), and the delete is preconditioned on the endpoint's UID and
// resourceVersion so a concurrent republish by its agent is not lost.
package endpointgc

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/operator/apiserver"
	"github.com/tendril-net/tendril/pkg/operator/leader"
	"github.com/tendril-net/tendril/pkg/operator/periodic"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/operator/status"
)

// Config of the endpoint GC.
type Config struct {
	EndpointGCInterval time.Duration
}

// DefaultConfig runs every 5 minutes (Cilium's default).
func DefaultConfig() Config { return Config{EndpointGCInterval: 5 * time.Minute} }

// Flags registers the options.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Duration("endpoint-gc-interval", c.EndpointGCInterval, "Interval between TendrilEndpoint GC passes (0 disables it)")
}

// Result is what a pass did.
type Result struct {
	Endpoints int
	Deleted   int
	Kept      int // confirmed alive by the live read, or changed meanwhile
}

func (r Result) String() string {
	return fmt.Sprintf("%d endpoints: %d deleted, %d kept after a live check", r.Endpoints, r.Deleted, r.Kept)
}

// Collector is the TendrilEndpoint GC.
type Collector struct {
	log     *slog.Logger
	clients *k8s.Clients
	res     *resources.Resources
	deleted prometheus.Counter
}

// Cell registers the GC as a leader job.
var Cell = cell.Module("endpoint-gc", "TendrilEndpoint garbage collection",
	cell.Config(DefaultConfig()),
	cell.Provide(newCollector),
	cell.Invoke(func(*Collector) {}),
)

type params struct {
	cell.In
	Config    Config
	Log       *slog.Logger
	Clients   *k8s.Clients
	Resources *resources.Resources
	Elector   *leader.Elector
	Reports   *status.Reports
	Server    *apiserver.Server
}

func newCollector(p params) *Collector {
	c := New(p.Log, p.Clients, p.Resources)
	p.Server.Registry.MustRegister(c.deleted)
	periodic.Job{
		Name: "endpoint-gc", Interval: p.Config.EndpointGCInterval, Log: c.log, Reports: p.Reports,
		Pass:   func(ctx context.Context) (string, error) { r, err := c.Pass(ctx); return r.String(), err },
		Failed: "Endpoint GC pass failed",
	}.Register(p.Elector)
	return c
}

// New returns a collector.
func New(log *slog.Logger, clients *k8s.Clients, res *resources.Resources) *Collector {
	return &Collector{log: log, clients: clients, res: res, deleted: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tendril_operator_endpoint_gc_deleted_total", Help: "TendrilEndpoints deleted because their pod is gone or finished",
	})}
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
}

// Pass runs one collection.
func (c *Collector) Pass(ctx context.Context) (Result, error) {
	var r Result
	eps, err := c.res.Endpoints.List(labels.Everything())
	if err != nil {
		return r, fmt.Errorf("list TendrilEndpoints: %w", err)
	}
	r.Endpoints = len(eps)
	for _, ep := range eps {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		pod, err := c.res.Pods.Pods(ep.Namespace).Get(ep.Name)
		if err == nil && !finished(pod) {
			continue
		}
		// Confirm with the API server: the cache may lag a new pod.
		live, err := c.clients.Core.CoreV1().Pods(ep.Namespace).Get(ctx, ep.Name, metav1.GetOptions{})
		switch {
		case err == nil && !finished(live):
			r.Kept++
			continue
		case err != nil && !apierrors.IsNotFound(err):
			return r, fmt.Errorf("read pod %s/%s: %w", ep.Namespace, ep.Name, err)
		}
		reason := "pod gone"
		if err == nil {
			reason = "pod " + string(live.Status.Phase)
		}
		rv, uid := ep.ResourceVersion, ep.UID
		err = c.clients.Tendril.TendrilV1alpha1().TendrilEndpoints(ep.Namespace).Delete(ctx, ep.Name,
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv, UID: &uid}})
		switch {
		case err == nil:
			r.Deleted++
			c.deleted.Inc()
			c.log.Info("Deleted TendrilEndpoint", "namespace", ep.Namespace, "name", ep.Name, "reason", reason)
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			r.Kept++
		default:
			return r, fmt.Errorf("delete TendrilEndpoint %s/%s: %w", ep.Namespace, ep.Name, err)
		}
	}
	return r, nil
}
