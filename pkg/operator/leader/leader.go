// Package leader elects one operator replica on a coordination.k8s.io
// Lease (client-go's leaderelection) and runs the cluster-wide jobs only
// on it. Cells register their jobs with Add while the hive is built; the
// elector starts them all when it acquires the lease and, when it loses
// the lease (a renewal that did not succeed within the renew deadline) or
// stops, cancels their context and joins every one of them before it
// campaigns again or releases the lease, so two replicas never run a job
// at once as long as the lease's timing holds.
package leader

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/operator/apiserver"
)

// Config is the election's timing and the Lease it runs on.
type Config struct {
	LeaderElectionNamespace     string
	LeaderElectionLeaseName     string
	LeaderElectionLeaseDuration time.Duration
	LeaderElectionRenewDeadline time.Duration
	LeaderElectionRetryPeriod   time.Duration
	OperatorID                  string
}

// DefaultConfig: 15 s lease, 10 s renew deadline, 2 s retry (Cilium's and
// client-go's defaults).
func DefaultConfig() Config {
	return Config{
		LeaderElectionNamespace:     "kube-system",
		LeaderElectionLeaseName:     "tendril-operator-resource-lock",
		LeaderElectionLeaseDuration: 15 * time.Second,
		LeaderElectionRenewDeadline: 10 * time.Second,
		LeaderElectionRetryPeriod:   2 * time.Second,
	}
}

// Flags registers the options.
func (c Config) Flags(fs *pflag.FlagSet) {
	fs.String("leader-election-namespace", c.LeaderElectionNamespace, "Namespace of the leader election Lease")
	fs.String("leader-election-lease-name", c.LeaderElectionLeaseName, "Name of the leader election Lease")
	fs.Duration("leader-election-lease-duration", c.LeaderElectionLeaseDuration, "How long a lease holds without renewal; a follower takes over after it")
	fs.Duration("leader-election-renew-deadline", c.LeaderElectionRenewDeadline, "How long the leader keeps trying to renew before it stops its jobs")
	fs.Duration("leader-election-retry-period", c.LeaderElectionRetryPeriod, "Interval between attempts to acquire or renew the lease")
	fs.String("operator-id", c.OperatorID, "This replica's identity in the Lease (default: host name and a random suffix)")
}

// Validate checks the timing as client-go requires it.
func (c Config) Validate() error {
	if c.LeaderElectionLeaseDuration <= c.LeaderElectionRenewDeadline {
		return fmt.Errorf("leader-election-lease-duration (%s) must be longer than leader-election-renew-deadline (%s)", c.LeaderElectionLeaseDuration, c.LeaderElectionRenewDeadline)
	}
	if c.LeaderElectionRenewDeadline <= c.LeaderElectionRetryPeriod {
		return fmt.Errorf("leader-election-renew-deadline (%s) must be longer than leader-election-retry-period (%s)", c.LeaderElectionRenewDeadline, c.LeaderElectionRetryPeriod)
	}
	if c.LeaderElectionNamespace == "" || c.LeaderElectionLeaseName == "" {
		return fmt.Errorf("leader election: namespace and lease name must be set")
	}
	return nil
}

// Run is a leader job: it runs until ctx ends (leadership lost or stop).
// An error is logged and the job restarted after a pause while leading.
type Run func(ctx context.Context) error

type namedJob struct {
	name string
	run  Run
}

// Elector campaigns for the Lease and runs the registered jobs while it
// holds it.
type Elector struct {
	cfg     Config
	log     *slog.Logger
	clients *k8s.Clients
	id      string

	jobs []namedJob

	leading     atomic.Bool
	since       atomic.Int64 // unix nanos of the current leadership
	gauge       prometheus.Gauge
	acquired    prometheus.Counter
	stopGen     sync.Mutex // serializes starting and joining one term's jobs
	termJobs    sync.WaitGroup
	termRunning bool
}

// Cell provides *Elector; its campaign is a hive job.
var Cell = cell.Module("leader-election", "Leader election on a Lease",
	cell.Config(DefaultConfig()),
	cell.Provide(newElector),
	cell.Invoke(func(*Elector) {}),
)

type params struct {
	cell.In
	Config  Config
	Log     *slog.Logger
	Clients *k8s.Clients
	Server  *apiserver.Server
}

func newElector(p params) (*Elector, error) {
	if err := p.Config.Validate(); err != nil {
		return nil, err
	}
	e, err := New(p.Config, p.Clients, p.Log)
	if err != nil {
		return nil, err
	}
	p.Server.Registry.MustRegister(e.gauge, e.acquired)
	return e, nil
}

// CampaignCell starts the campaign as a hive job. List it after every
// other cell: a job's start hook goes where it is added, so the campaign
// then starts after every other start hook (the kvstore connected, the
// caches synced) and stops before them.
var CampaignCell = cell.Invoke(func(e *Elector, jobs job.Group) {
	jobs.Add(job.OneShot("leader-election", func(ctx context.Context, _ cell.Health) error {
		e.Campaign(ctx)
		return nil
	}))
})

// New returns an elector (tests build one outside a hive).
func New(cfg Config, clients *k8s.Clients, log *slog.Logger) (*Elector, error) {
	id := cfg.OperatorID
	if id == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("operator-id not set and host name unknown: %w", err)
		}
		var b [3]byte
		_, _ = rand.Read(b[:])
		id = host + "-" + hex.EncodeToString(b[:])
	}
	return &Elector{
		cfg: cfg, log: log.With("operator-id", id), clients: clients, id: id,
		gauge:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "tendril_operator_is_leader", Help: "1 while this replica holds the leader lease"}),
		acquired: prometheus.NewCounter(prometheus.CounterOpts{Name: "tendril_operator_leader_acquired_total", Help: "Times this replica acquired the leader lease"}),
	}, nil
}

// Add registers a job run only on the leader. Call it while the hive is
// built, before Campaign.
func (e *Elector) Add(name string, run Run) {
	e.jobs = append(e.jobs, namedJob{name: name, run: run})
}

// ID is this replica's identity in the Lease.
func (e *Elector) ID() string { return e.id }

// IsLeader reports whether this replica holds the lease and runs the jobs.
func (e *Elector) IsLeader() bool { return e.leading.Load() }

// LeadingSince is when the current term began (zero when not leading).
func (e *Elector) LeadingSince() time.Time {
	if !e.IsLeader() {
		return time.Time{}
	}
	return time.Unix(0, e.since.Load())
}

// Campaign runs elections until ctx ends. On the end of ctx the jobs are
// cancelled and joined first, and only then is the lease released, so the
// next leader never overlaps with this one's jobs.
func (e *Elector) Campaign(ctx context.Context) {
	// electCtx outlives ctx until the jobs are joined.
	electCtx, cancelElect := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelElect()
	jobsCtx, cancelJobs := context.WithCancel(ctx)
	defer cancelJobs()
	go func() {
		<-ctx.Done()
		cancelJobs()
		e.joinTerm()
		cancelElect()
	}()
	for electCtx.Err() == nil {
		lock := &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: e.cfg.LeaderElectionNamespace, Name: e.cfg.LeaderElectionLeaseName},
			Client:     e.clients.Core.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: e.id},
		}
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   e.cfg.LeaderElectionLeaseDuration,
			RenewDeadline:   e.cfg.LeaderElectionRenewDeadline,
			RetryPeriod:     e.cfg.LeaderElectionRetryPeriod,
			ReleaseOnCancel: true,
			Name:            "tendril-operator",
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(termCtx context.Context) { e.startTerm(termCtx, jobsCtx) },
				OnStoppedLeading: e.endTerm,
				OnNewLeader: func(id string) {
					if id != e.id {
						e.log.Info("Leader is another replica", "leader", id)
					}
				},
			},
		})
		if err != nil {
			e.log.Error("Leader election config", "error", err)
			return
		}
		le.Run(electCtx)
		if electCtx.Err() == nil {
			e.log.Info("Campaigning again after losing the lease")
		}
	}
}

// startTerm starts every job under a context that ends with the term
// (termCtx: lease lost) or with the operator (jobsCtx: stop).
func (e *Elector) startTerm(termCtx, jobsCtx context.Context) {
	e.stopGen.Lock()
	defer e.stopGen.Unlock()
	if termCtx.Err() != nil || jobsCtx.Err() != nil {
		return // the term ended before it began
	}
	ctx, cancel := context.WithCancel(termCtx)
	stop := context.AfterFunc(jobsCtx, cancel)
	e.since.Store(time.Now().UnixNano())
	e.leading.Store(true)
	e.gauge.Set(1)
	e.acquired.Inc()
	e.termRunning = true
	e.log.Info("Became leader, starting jobs", "jobs", len(e.jobs))
	var wg sync.WaitGroup
	for _, j := range e.jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.runJob(ctx, j)
		}()
	}
	e.termJobs.Add(1)
	go func() {
		defer e.termJobs.Done()
		wg.Wait()
		stop()
		cancel()
	}()
}

func (e *Elector) runJob(ctx context.Context, j namedJob) {
	pause := time.Second
	for ctx.Err() == nil {
		err := j.run(ctx)
		if ctx.Err() != nil {
			return
		}
		e.log.Error("Leader job failed, restarting it", "job", j.name, "error", err, "after", pause)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 30*time.Second)
	}
}

// endTerm runs once the term's context is cancelled (lease lost or
// stop): it waits until every job has returned.
func (e *Elector) endTerm() {
	e.joinTerm()
}

func (e *Elector) joinTerm() {
	e.stopGen.Lock()
	defer e.stopGen.Unlock()
	if !e.termRunning {
		return
	}
	e.termJobs.Wait()
	e.termRunning = false
	e.leading.Store(false)
	e.gauge.Set(0)
	e.log.Info("Stopped leading, jobs joined")
}
