// Package periodic runs the operator's leader jobs that work in passes
// (the identity, endpoint and node GCs, cluster-pool and LB IPAM): a
// pass at the start of each leader term, then one an interval after the
// previous ended, or sooner when an event pokes it. Each pass's outcome
// is logged and reported to the operator's status; a failed pass is
// logged and the job goes on (the next pass retries it, after RetryAfter
// when set), since a GC that stopped after one API error would leave
// garbage forever.
//
// Leadership is the elector's: Register adds the job to it, which runs
// Run for each term and cancels it when the term ends.
package periodic

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/tendril-net/tendril/pkg/operator/leader"
)

// Reporter takes a job's summary of its last pass (*status.Reports).
type Reporter interface {
	Set(job, summary string)
}

// Elector runs a named job while this replica leads (*leader.Elector).
type Elector interface {
	Add(name string, run leader.Run)
}

// Job is a leader job made of passes.
type Job struct {
	// Name names the job at the elector and in the status reports.
	Name string
	// Interval is the pause between the end of a pass and the start of
	// the next; Register skips a job whose Interval is not positive (the
	// "0 disables it" of the GCs' flags).
	Interval time.Duration
	// Pass runs one pass and returns its summary (with an error, what it
	// did before it failed; it may be empty).
	Pass func(ctx context.Context) (summary string, err error)
	// Failed is the warning logged for a failed pass ("Node GC pass
	// failed"); the error and the partial summary are its fields.
	Failed string
	// Log receives the failures.
	Log *slog.Logger
	// Reports, when set, receives every pass's summary under Name; a
	// failed pass's names its error first.
	Reports Reporter
	// StartTerm, when set, runs before a term's first pass: what a job
	// remembers between passes is not carried over from an earlier term
	// (another replica may have led meanwhile).
	StartTerm func()
	// Trigger, when set, asks for a pass before the interval ends (the
	// informers' events).
	Trigger <-chan struct{}
	// RetryAfter, when positive and shorter than Interval, is the pause
	// after a failed pass instead.
	RetryAfter time.Duration

	// after is time.After unless a test drives the pauses.
	after func(time.Duration) <-chan time.Time
}

// Register adds the job to the elector and reports whether it did: a
// job without a positive Interval is disabled.
func (j Job) Register(e Elector) bool {
	if j.Interval <= 0 {
		return false
	}
	e.Add(j.Name, j.Run)
	return true
}

// Run runs passes until ctx ends (the end of the leader term). It
// returns an error only for a job it cannot run.
func (j Job) Run(ctx context.Context) error {
	if j.Interval <= 0 || j.Pass == nil {
		return fmt.Errorf("periodic job %q: needs a pass and a positive interval (%s)", j.Name, j.Interval)
	}
	after := j.after
	if after == nil {
		after = time.After
	}
	if j.StartTerm != nil {
		j.StartTerm()
	}
	for {
		summary, err := j.Pass(ctx)
		pause := j.Interval
		if err != nil && ctx.Err() == nil {
			if summary != "" {
				j.Log.Warn(j.Failed, "error", err, "partial", summary)
				summary = "last pass failed: " + err.Error() + "; " + summary
			} else {
				j.Log.Warn(j.Failed, "error", err)
				summary = "last pass failed: " + err.Error()
			}
			if j.RetryAfter > 0 && j.RetryAfter < pause {
				pause = j.RetryAfter
			}
		}
		if j.Reports != nil {
			j.Reports.Set(j.Name, summary)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-j.Trigger:
		case <-after(pause):
		}
	}
}
