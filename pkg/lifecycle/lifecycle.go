// Package lifecycle turns the agent's start steps into hooks of a hive
// lifecycle (github.com/cilium/hive/cell.Lifecycle) that record what
// `tendril status` shows of the start: how long each step took (the
// bootstrap stats) and each step's module health (starting, ok, failed).
// The hive decides the order (dependencies, then the order of the cells);
// this package only names and measures the steps.
package lifecycle

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/pkg/health"
)

// StepStat is the duration of one start step.
type StepStat struct {
	Name     string        `json:"name"`
	Duration time.Duration `json:"duration"`
	Error    string        `json:"error,omitempty"`
}

// Steps records the start steps appended through it.
type Steps struct {
	health *health.Registry

	mu      sync.Mutex
	names   []string
	started time.Time
	stats   []StepStat
	total   time.Duration
}

// NewSteps returns a recorder whose steps report their health to reg.
func NewSteps(reg *health.Registry) *Steps {
	return &Steps{health: reg}
}

// Append adds a named start step to lc: its start is timed into the
// bootstrap stats and its health is "starting" until it started, then ok,
// or failed with the error. start and stop may be nil. A start error comes
// back as "start <name>: <error>".
func (s *Steps) Append(lc cell.Lifecycle, name string, start, stop func(context.Context) error) {
	s.mu.Lock()
	s.names = append(s.names, name)
	s.mu.Unlock()
	lc.Append(&step{steps: s, name: name, rep: s.health.Reporter(name), start: start, stop: stop})
}

// Names are the steps appended so far, in the order appended: the order
// they start in.
func (s *Steps) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.names...)
}

// Stats returns the steps started so far, in start order, and the total
// start time (zero until SetTotal).
func (s *Steps) Stats() ([]StepStat, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]StepStat(nil), s.stats...), s.total
}

// Begin records when the start began.
func (s *Steps) Begin(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.started = t
}

// Started is when the start began (zero before Begin).
func (s *Steps) Started() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// SetTotal records the whole start's duration, once every step started.
func (s *Steps) SetTotal(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total = d
}

// step is one named start step: a cell.HookInterface.
type step struct {
	steps       *Steps
	name        string
	rep         *health.Reporter
	start, stop func(context.Context) error
}

var _ cell.HookDescriptiveInterface = (*step)(nil)

// HookInfo names the step in the hive's own log lines.
func (st *step) HookInfo() string { return st.name }

func (st *step) Start(ctx cell.HookContext) error {
	begin := time.Now()
	var err error
	if st.start != nil {
		err = st.start(ctx)
	}
	stat := StepStat{Name: st.name, Duration: time.Since(begin)}
	if err != nil {
		stat.Error = err.Error()
		st.rep.Failed(err.Error())
	} else {
		st.rep.OK("started")
	}
	st.steps.mu.Lock()
	st.steps.stats = append(st.steps.stats, stat)
	st.steps.mu.Unlock()
	if err != nil {
		return fmt.Errorf("start %s: %w", st.name, err)
	}
	return nil
}

func (st *step) Stop(ctx cell.HookContext) error {
	st.rep.Stopped()
	if st.stop == nil {
		return nil
	}
	if err := st.stop(ctx); err != nil {
		return fmt.Errorf("stop %s: %w", st.name, err)
	}
	return nil
}
