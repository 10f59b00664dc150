// Package health collects the health that every agent module reports (ok,
// degraded or failure, with a message and the time it entered that level)
// and aggregates it for /v1/healthz and `tendril status`.
package health

import (
	"sort"
	"sync"
	"time"
)

// Level is a module's health level.
type Level string

const (
	LevelOK       Level = "Ok"
	LevelDegraded Level = "Degraded"
	LevelFailure  Level = "Failure"
)

// rank orders levels from best to worst.
func (l Level) rank() int {
	switch l {
	case LevelOK:
		return 0
	case LevelDegraded:
		return 1
	default:
		return 2
	}
}

// ModuleStatus is one module's current health.
type ModuleStatus struct {
	Module  string    `json:"module"`
	Level   Level     `json:"level"`
	Message string    `json:"message,omitempty"`
	Since   time.Time `json:"since"`
	Updated time.Time `json:"updated"`
}

// Registry holds the health of all modules.
type Registry struct {
	now func() time.Time

	mu      sync.Mutex
	modules map[string]*ModuleStatus
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{now: time.Now, modules: map[string]*ModuleStatus{}}
}

// Reporter is the handle through which one module reports its health.
type Reporter struct {
	registry *Registry
	module   string
}

// Reporter returns the reporter of module; a module registered this way starts
// as degraded ("starting") until it reports OK.
func (r *Registry) Reporter(module string) *Reporter {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.modules[module]; !ok {
		now := r.now()
		r.modules[module] = &ModuleStatus{Module: module, Level: LevelDegraded, Message: "starting", Since: now, Updated: now}
	}
	return &Reporter{registry: r, module: module}
}

// OK reports the module healthy.
func (p *Reporter) OK(msg string) { p.registry.set(p.module, LevelOK, msg) }

// Degraded reports the module working with a problem.
func (p *Reporter) Degraded(msg string) { p.registry.set(p.module, LevelDegraded, msg) }

// Failed reports the module not working.
func (p *Reporter) Failed(msg string) { p.registry.set(p.module, LevelFailure, msg) }

// Stopped removes the module from the registry (it no longer runs).
func (p *Reporter) Stopped() {
	p.registry.mu.Lock()
	defer p.registry.mu.Unlock()
	delete(p.registry.modules, p.module)
}

func (r *Registry) set(module string, level Level, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	st, ok := r.modules[module]
	if !ok {
		st = &ModuleStatus{Module: module, Since: now}
		r.modules[module] = st
	}
	if st.Level != level {
		st.Since = now
	}
	st.Level, st.Message, st.Updated = level, msg, now
}

// All returns every module's status sorted by name.
func (r *Registry) All() []ModuleStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ModuleStatus, 0, len(r.modules))
	for _, st := range r.modules {
		out = append(out, *st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Module < out[j].Module })
	return out
}

// Overall is the worst level of all modules and a message naming the modules
// at that level; with no module it is OK.
func (r *Registry) Overall() (Level, string) {
	worst := LevelOK
	var names []string
	for _, st := range r.All() {
		switch {
		case st.Level.rank() > worst.rank():
			worst, names = st.Level, []string{st.Module + ": " + st.Message}
		case st.Level == worst && worst != LevelOK:
			names = append(names, st.Module+": "+st.Message)
		}
	}
	msg := ""
	for i, n := range names {
		if i > 0 {
			msg += "; "
		}
		msg += n
	}
	return worst, msg
}
