// Package lifecycle starts an agent's modules in dependency order, stops them
// in reverse, rolls back the ones already started when a later start fails,
// and records how long each start step took (the bootstrap stats).
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Hook is one module's start and stop. Either may be nil.
type Hook struct {
	Name  string
	Start func(ctx context.Context) error
	Stop  func(ctx context.Context) error
}

// StepStat is the duration of one start step.
type StepStat struct {
	Name     string        `json:"name"`
	Duration time.Duration `json:"duration"`
	Error    string        `json:"error,omitempty"`
}

// Lifecycle is an ordered list of hooks. Append in start order.
type Lifecycle struct {
	log *slog.Logger

	mu      sync.Mutex
	hooks   []Hook
	started int // hooks[:started] have started and must be stopped
	stats   []StepStat
	total   time.Duration
}

// New returns an empty lifecycle that logs to log.
func New(log *slog.Logger) *Lifecycle {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Lifecycle{log: log}
}

// Append adds a hook after the ones already there.
func (l *Lifecycle) Append(h Hook) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hooks = append(l.hooks, h)
}

// Start runs every hook's Start in order. When one fails, the hooks already
// started are stopped in reverse order and the error names the failed step.
func (l *Lifecycle) Start(ctx context.Context) error {
	l.mu.Lock()
	hooks := append([]Hook(nil), l.hooks...)
	l.mu.Unlock()
	begin := time.Now()
	for i, h := range hooks {
		stepStart := time.Now()
		var err error
		if h.Start != nil {
			err = h.Start(ctx)
		}
		stat := StepStat{Name: h.Name, Duration: time.Since(stepStart)}
		if err != nil {
			stat.Error = err.Error()
		}
		l.mu.Lock()
		l.stats = append(l.stats, stat)
		if err == nil {
			l.started = i + 1
		}
		l.mu.Unlock()
		if err != nil {
			l.log.Error("Start step failed, stopping the modules already started", "step", h.Name, "error", err)
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if stopErr := l.Stop(stopCtx); stopErr != nil {
				l.log.Error("Rollback after failed start", "error", stopErr)
			}
			return fmt.Errorf("start %s: %w", h.Name, err)
		}
		l.log.Debug("Started", "step", h.Name, "duration", stat.Duration)
	}
	l.mu.Lock()
	l.total = time.Since(begin)
	l.mu.Unlock()
	return nil
}

// Stop runs the Stop of every started hook in reverse order. It goes on
// after an error and returns all errors joined.
func (l *Lifecycle) Stop(ctx context.Context) error {
	l.mu.Lock()
	hooks := append([]Hook(nil), l.hooks[:l.started]...)
	l.started = 0
	l.mu.Unlock()
	var errs []error
	for i := len(hooks) - 1; i >= 0; i-- {
		h := hooks[i]
		if h.Stop == nil {
			continue
		}
		if err := h.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", h.Name, err))
			l.log.Error("Stop step failed", "step", h.Name, "error", err)
		}
	}
	return errors.Join(errs...)
}

// Stats returns the bootstrap stats recorded so far and the total start time
// (zero until every step has started).
func (l *Lifecycle) Stats() ([]StepStat, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]StepStat(nil), l.stats...), l.total
}
