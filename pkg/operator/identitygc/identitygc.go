// Package identitygc deletes security identities no endpoint has used for
// a grace period (--identity-heartbeat-timeout), at most
// --identity-gc-rate-limit per --identity-gc-rate-interval, on the leader.
//
// CRD mode (TendrilIdentity objects): an identity is in use while a
// TendrilEndpoint refers to it or an existing TendrilNode lists it in
// crdalloc.AnnotationIdentitiesInUse (its agent's endpoints hold it: an
// endpoint without a pod, or whose TendrilEndpoint cannot be written,
// publishes nothing else; a TendrilNode lives as long as its Node, so the
// evidence of a node whose agent is down, whose endpoints still forward,
// stays). A pass marks an unused identity with
// crdalloc.AnnotationUnusedSince, clears the mark of one used again, and
// deletes one marked longer than the grace period, after re-checking the
// endpoints' index, with a delete preconditioned on the UID and the
// resourceVersion it read. An agent that starts using a marked identity
// removes the mark first (crdalloc's claim), which changes the
// resourceVersion: the GC's delete then fails and the identity stays.
// If the GC's delete wins, the agent's claim finds the object gone and
// allocates it again. Either way no endpoint keeps an identity without
// its object.
//
// kvstore mode (master keys, see pkg/identity/kvalloc): an identity is in
// use while any node's value key for its label set exists (value keys live
// on the agents' session leases: a dead node's references expire with its
// lease, which is the heartbeat). An identity seen unused for the grace
// period is deleted with its index key in one transaction that requires
// both keys unchanged and no value key; agents write a value key only in a
// transaction that requires the master key. One of the two always sees
// the other.
package identitygc

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/tendril-net/tendril/pkg/identity/crdalloc"
	"github.com/tendril-net/tendril/pkg/identity/kvalloc"
	"github.com/tendril-net/tendril/pkg/k8s"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/kvstore"
	"github.com/tendril-net/tendril/pkg/operator/apiserver"
	"github.com/tendril-net/tendril/pkg/operator/kvstoreclient"
	"github.com/tendril-net/tendril/pkg/operator/leader"
	"github.com/tendril-net/tendril/pkg/operator/periodic"
	"github.com/tendril-net/tendril/pkg/operator/resources"
	"github.com/tendril-net/tendril/pkg/operator/status"
)

// Config of the identity GC (Cilium's defaults).
type Config struct {
	IdentityAllocationMode   string
	IdentityGCInterval       time.Duration
	IdentityHeartbeatTimeout time.Duration
	IdentityGCRateInterval   time.Duration
	IdentityGCRateLimit      int
}

// DefaultConfig: a pass every 15 minutes, 30 minutes of grace, at most
// 2,500 deletions a minute.
func DefaultConfig() Config {
	return Config{
		IdentityAllocationMode:   "crd",
		IdentityGCInterval:       15 * time.Minute,
		IdentityHeartbeatTimeout: 30 * time.Minute,
		IdentityGCRateInterval:   time.Minute,
		IdentityGCRateLimit:      2500,
	}
}

// Flags registers the options.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("identity-allocation-mode", c.IdentityAllocationMode, "Where identities live: crd (TendrilIdentity objects) or kvstore (needs --kvstore)")
	fs.Duration("identity-gc-interval", c.IdentityGCInterval, "Interval between identity GC passes (0 disables the GC)")
	fs.Duration("identity-heartbeat-timeout", c.IdentityHeartbeatTimeout, "How long an identity must stay unused before it is deleted")
	fs.Duration("identity-gc-rate-interval", c.IdentityGCRateInterval, "Interval over which --identity-gc-rate-limit applies")
	fs.Int("identity-gc-rate-limit", c.IdentityGCRateLimit, "Identities deleted at most per --identity-gc-rate-interval")
}

// Validate checks the values.
func (c Config) Validate() error {
	if c.IdentityAllocationMode != "crd" && c.IdentityAllocationMode != "kvstore" {
		return fmt.Errorf("identity-allocation-mode: %q is neither crd nor kvstore", c.IdentityAllocationMode)
	}
	if c.IdentityGCInterval < 0 || c.IdentityHeartbeatTimeout < 0 {
		return fmt.Errorf("identity GC: negative interval or heartbeat timeout")
	}
	if c.IdentityGCRateLimit <= 0 || c.IdentityGCRateInterval <= 0 {
		return fmt.Errorf("identity-gc-rate-limit and identity-gc-rate-interval must be positive")
	}
	return nil
}

// Result is what one pass did.
type Result struct {
	Identities int
	Marked     int
	Unmarked   int
	Deleted    int
	// Kept counts deletions refused by the store: the identity changed
	// (an agent claimed it) or gained a reference meanwhile.
	Kept int
}

func (r Result) String() string {
	return fmt.Sprintf("%d identities: %d deleted, %d marked unused, %d used again, %d kept by a concurrent change",
		r.Identities, r.Deleted, r.Marked, r.Unmarked, r.Kept)
}

// Collector is the identity GC of one mode.
type Collector struct {
	cfg     Config
	log     *slog.Logger
	limiter flowcontrol.RateLimiter
	now     func() time.Time

	clients *k8s.Clients
	res     *resources.Resources
	kv      *kvstoreclient.Client
	// unusedSince remembers, in kvstore mode, when a master key was first
	// seen unreferenced (a new leader starts afresh: it only delays).
	unusedSince map[string]time.Time

	deleted prometheus.Counter
}

// Cell registers the GC as a leader job.
var Cell = cell.Module("identity-gc", "Identity garbage collection",
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
	KVStore   *kvstoreclient.Client
	Elector   *leader.Elector
	Reports   *status.Reports
	Server    *apiserver.Server
}

func newCollector(p params) (*Collector, error) {
	if err := p.Config.Validate(); err != nil {
		return nil, err
	}
	if p.Config.IdentityAllocationMode == "kvstore" && !p.KVStore.Enabled() {
		return nil, fmt.Errorf("identity-allocation-mode kvstore needs --kvstore")
	}
	c := New(p.Config, p.Log, p.Clients, p.Resources, p.KVStore)
	p.Server.Registry.MustRegister(c.deleted)
	if p.Config.IdentityGCInterval == 0 {
		p.Log.Info("Identity GC disabled (--identity-gc-interval=0)")
		return c, nil
	}
	c.Job(p.Reports).Register(p.Elector)
	return c, nil
}

// New returns a collector (tests and benchmarks call Pass directly).
func New(cfg Config, log *slog.Logger, clients *k8s.Clients, res *resources.Resources, kv *kvstoreclient.Client) *Collector {
	perSecond := float32(float64(cfg.IdentityGCRateLimit) / cfg.IdentityGCRateInterval.Seconds())
	return &Collector{
		cfg: cfg, log: log, clients: clients, res: res, kv: kv,
		// Burst 1: deletions are spread evenly over the interval.
		limiter:     flowcontrol.NewTokenBucketRateLimiter(perSecond, 1),
		now:         time.Now,
		unusedSince: map[string]time.Time{},
		deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tendril_operator_identity_gc_deleted_total", Help: "Identities deleted by the identity GC",
		}),
	}
}

// Job is the GC as a leader job: a pass at the start of each term and
// then every --identity-gc-interval, each logged and reported.
func (c *Collector) Job(reports periodic.Reporter) periodic.Job {
	return periodic.Job{
		Name: "identity-gc", Interval: c.cfg.IdentityGCInterval, Log: c.log, Reports: reports,
		Failed: "Identity GC pass failed",
		Pass: func(ctx context.Context) (string, error) {
			r, err := c.Pass(ctx)
			if err == nil && ctx.Err() == nil {
				c.log.Info("Identity GC pass", "identities", r.Identities, "deleted", r.Deleted, "marked", r.Marked, "unmarked", r.Unmarked, "kept", r.Kept)
			}
			return r.String(), err
		},
	}
}

// Pass runs one collection in the configured mode.
func (c *Collector) Pass(ctx context.Context) (Result, error) {
	if c.cfg.IdentityAllocationMode == "kvstore" {
		return c.passKVStore(ctx)
	}
	return c.passCRD(ctx)
}

// used reports whether a TendrilEndpoint or a node's published list
// (inUse, nil: read the TendrilNodes now) holds the identity.
func (c *Collector) used(name string, inUse map[string]bool) bool {
	eps, err := c.res.EndpointsByIdentity.ByIndex(resources.IdentityIndex, name)
	if err != nil || len(eps) > 0 { // an index error keeps the identity
		return true
	}
	if inUse == nil {
		if inUse, err = c.nodesInUse(); err != nil {
			return true
		}
	}
	return inUse[name]
}

// nodesInUse is every identity the existing TendrilNodes list as in use
// by their agents' endpoints. An entry that is not a cluster identity
// number is skipped (logged): it can only keep an identity, never free
// one.
func (c *Collector) nodesInUse() (map[string]bool, error) {
	nodes, err := c.res.TNodes.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list TendrilNodes: %w", err)
	}
	out := map[string]bool{}
	for _, n := range nodes {
		v, ok := n.Annotations[crdalloc.AnnotationIdentitiesInUse]
		if !ok {
			continue
		}
		ids, bad := crdalloc.ParseIdentitiesInUse(v)
		if bad > 0 {
			c.log.Warn("Skipping malformed entries of a node's identities in use", "node", n.Name, "malformed", bad)
		}
		for _, id := range ids {
			out[strconv.Itoa(int(id))] = true
		}
	}
	return out, nil
}

func (c *Collector) passCRD(ctx context.Context) (Result, error) {
	var r Result
	all, err := c.res.Identities.List(labels.Everything())
	if err != nil {
		return r, fmt.Errorf("list identities: %w", err)
	}
	r.Identities = len(all)
	inUse, err := c.nodesInUse()
	if err != nil {
		return r, err
	}
	ids := c.clients.Tendril.TendrilV1alpha1().TendrilIdentities()
	now := c.now()
	for _, obj := range all {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		mark, marked := obj.Annotations[crdalloc.AnnotationUnusedSince]
		since, perr := time.Parse(time.RFC3339, mark)
		switch {
		case c.used(obj.Name, inUse):
			if marked {
				if err := c.setMark(ctx, obj, ""); err != nil {
					return r, err
				}
				r.Unmarked++
			}
		case !marked || perr != nil:
			if err := c.setMark(ctx, obj, now.UTC().Format(time.RFC3339)); err != nil {
				return r, err
			}
			r.Marked++
		case now.Sub(since) >= c.cfg.IdentityHeartbeatTimeout:
			if err := c.limiter.Wait(ctx); err != nil {
				return r, err
			}
			// Re-check: an endpoint (or a node's list) may have appeared
			// since the listing.
			if c.used(obj.Name, nil) {
				continue
			}
			rv, uid := obj.ResourceVersion, obj.UID
			err := ids.Delete(ctx, obj.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv, UID: &uid}})
			switch {
			case err == nil:
				r.Deleted++
				c.deleted.Inc()
				c.log.Info("Deleted unused identity", "identity", obj.Name, "unused-since", mark)
			case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
				r.Kept++ // claimed (or changed) since we read it
			default:
				return r, fmt.Errorf("delete identity %s: %w", obj.Name, err)
			}
		}
	}
	return r, nil
}

// setMark sets (mark != "") or clears the unused mark; a conflict means
// the object changed, which the next pass sees.
func (c *Collector) setMark(ctx context.Context, obj *v1alpha1.TendrilIdentity, mark string) error {
	obj = obj.DeepCopy()
	if mark == "" {
		delete(obj.Annotations, crdalloc.AnnotationUnusedSince)
	} else {
		if obj.Annotations == nil {
			obj.Annotations = map[string]string{}
		}
		obj.Annotations[crdalloc.AnnotationUnusedSince] = mark
	}
	_, err := c.clients.Tendril.TendrilV1alpha1().TendrilIdentities().Update(ctx, obj, metav1.UpdateOptions{})
	if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return fmt.Errorf("mark identity %s: %w", obj.Name, err)
	}
	return nil
}

func (c *Collector) passKVStore(ctx context.Context) (Result, error) {
	var r Result
	kv := c.kv.KV()
	if kv == nil {
		return r, fmt.Errorf("kvstore not connected")
	}
	masters, _, err := kv.GetPrefix(ctx, kvalloc.IDPrefix)
	if err != nil {
		return r, err
	}
	values, _, err := kv.GetPrefix(ctx, kvalloc.ValuePrefix)
	if err != nil {
		return r, err
	}
	indexes, _, err := kv.GetPrefix(ctx, kvalloc.LabelsPrefix)
	if err != nil {
		return r, err
	}
	referenced := map[string]bool{}
	for _, v := range values {
		hash, _, _ := strings.Cut(strings.TrimPrefix(v.Key, kvalloc.ValuePrefix), "/")
		referenced[hash] = true
	}
	index := map[string]kvstore.KeyValue{}
	for _, x := range indexes {
		index[strings.TrimPrefix(x.Key, kvalloc.LabelsPrefix)] = x
	}
	r.Identities = len(masters)
	now := c.now()
	seen := map[string]bool{}
	for _, m := range masters {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		id := strings.TrimPrefix(m.Key, kvalloc.IDPrefix)
		seen[id] = true
		hash := kvalloc.LabelsHash(string(m.Value))
		if referenced[hash] {
			if _, was := c.unusedSince[id]; was {
				r.Unmarked++
				delete(c.unusedSince, id)
			}
			continue
		}
		since, was := c.unusedSince[id]
		if !was {
			c.unusedSince[id] = now
			r.Marked++
			continue
		}
		if now.Sub(since) < c.cfg.IdentityHeartbeatTimeout {
			continue
		}
		if err := c.limiter.Wait(ctx); err != nil {
			return r, err
		}
		revs := map[string]int64{m.Key: m.ModRevision}
		if x, ok := index[hash]; ok && string(x.Value) == id {
			revs[x.Key] = x.ModRevision
		}
		ok, err := kv.DeleteIfUnchangedAndEmpty(ctx, revs, kvalloc.ValuePrefix+hash+"/")
		if err != nil {
			return r, fmt.Errorf("delete identity %s: %w", id, err)
		}
		delete(c.unusedSince, id)
		if !ok {
			r.Kept++
			continue
		}
		r.Deleted++
		c.deleted.Inc()
		c.log.Info("Deleted unused identity", "identity", id, "labels", string(m.Value))
	}
	for id := range c.unusedSince {
		if !seen[id] {
			delete(c.unusedSince, id)
		}
	}
	return r, nil
}

// SetClock replaces the clock (tests move time past the grace period).
func (c *Collector) SetClock(now func() time.Time) { c.now = now }
