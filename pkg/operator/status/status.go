// Package status publishes the leader's view of the operator: a ConfigMap
// (tendril-operator-status, in the leader election namespace) that the
// leader rewrites every --operator-status-interval with its identity, a
// per-term write sequence and each job's last report. It is how a person
// (kubectl get cm -o yaml) and the tests see which replica is doing the
// work: every write names its writer.
package status

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/operator/leader"
)

// ConfigMapName is the status object's name.
const ConfigMapName = "tendril-operator-status"

// Keys of the ConfigMap's data.
const (
	KeyHolder = "holder"
	KeySince  = "leading-since"
	KeySeq    = "sequence"
	KeyTime   = "written"
	// KeyJobPrefix prefixes each job's last report.
	KeyJobPrefix = "job."
)

// Config is the write interval.
type Config struct {
	OperatorStatusInterval time.Duration
}

// DefaultConfig writes every 10 s.
func DefaultConfig() Config { return Config{OperatorStatusInterval: 10 * time.Second} }

// Flags registers the options.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.Duration("operator-status-interval", c.OperatorStatusInterval, "How often the leader rewrites the "+ConfigMapName+" ConfigMap")
}

// Reports collects the jobs' last results; jobs call Set. The zero
// value is ready to use.
type Reports struct {
	mu   sync.Mutex
	jobs map[string]string
}

// Set records a job's last result.
func (r *Reports) Set(job, report string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.jobs == nil {
		r.jobs = map[string]string{}
	}
	r.jobs[job] = report
}

func (r *Reports) snapshot() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.jobs)
}

// Cell provides *Reports and registers the status writer as a leader job.
var Cell = cell.Module("operator-status", "The leader status ConfigMap",
	cell.Config(DefaultConfig()),
	cell.Provide(newReports),
	cell.Invoke(func(*Reports) {}),
)

type params struct {
	cell.In
	Config    Config
	LeaderCfg leader.Config
	Log       *slog.Logger
	Clients   *k8s.Clients
	Elector   *leader.Elector
}

func newReports(p params) *Reports {
	r := &Reports{jobs: map[string]string{}}
	w := &writer{cfg: p.Config, ns: p.LeaderCfg.LeaderElectionNamespace, log: p.Log, clients: p.Clients, elector: p.Elector, reports: r}
	p.Elector.Add("status", w.run)
	return r
}

type writer struct {
	cfg     Config
	ns      string
	log     *slog.Logger
	clients *k8s.Clients
	elector *leader.Elector
	reports *Reports
}

// run writes the ConfigMap at once and then every interval, for one term.
func (w *writer) run(ctx context.Context) error {
	var seq int64
	tick := time.NewTicker(w.cfg.OperatorStatusInterval)
	defer tick.Stop()
	for {
		seq++
		if err := w.write(ctx, seq); err != nil && ctx.Err() == nil {
			w.log.Warn("Writing the operator status", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (w *writer) write(ctx context.Context, seq int64) error {
	data := map[string]string{
		KeyHolder: w.elector.ID(),
		KeySince:  w.elector.LeadingSince().UTC().Format(time.RFC3339Nano),
		KeySeq:    strconv.FormatInt(seq, 10),
		KeyTime:   time.Now().UTC().Format(time.RFC3339Nano),
	}
	for job, rep := range w.reports.snapshot() {
		data[KeyJobPrefix+job] = rep
	}
	cms := w.clients.Core.CoreV1().ConfigMaps(w.ns)
	cur, err := cms.Get(ctx, ConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: w.ns}, Data: data}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create %s/%s: %w", w.ns, ConfigMapName, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s/%s: %w", w.ns, ConfigMapName, err)
	}
	cur = cur.DeepCopy()
	cur.Data = data
	// The update carries the resourceVersion read: a concurrent writer
	// makes it conflict instead of being overwritten unseen.
	if _, err := cms.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update %s/%s: %w", w.ns, ConfigMapName, err)
	}
	return nil
}
