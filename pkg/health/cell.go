package health

import (
	"github.com/cilium/hive/cell"
)

// Scope returns module's health as a hive cell.Health, for what reports
// through hive's interfaces (job groups): module's own level is set by its
// start step, so a sub-scope (a job, "job-<name>") is a module of its own,
// named "<module>/<scope>", which goes away when the scope closes.
func (r *Registry) Scope(module string) cell.Health {
	return &scope{registry: r, name: module}
}

type scope struct {
	registry *Registry
	name     string
}

var _ cell.Health = (*scope)(nil)

func (s *scope) OK(status string) { s.registry.set(s.name, LevelOK, status) }

func (s *scope) Degraded(reason string, err error) {
	msg := reason
	if err != nil {
		msg += ": " + err.Error()
	}
	s.registry.set(s.name, LevelDegraded, msg)
}

// Stopped removes the scope: what no longer runs has no health to show.
func (s *scope) Stopped(string) { s.Close() }

func (s *scope) NewScope(name string) cell.Health {
	return &scope{registry: s.registry, name: s.name + "/" + name}
}

func (s *scope) Close() {
	s.registry.mu.Lock()
	defer s.registry.mu.Unlock()
	delete(s.registry.modules, s.name)
}
