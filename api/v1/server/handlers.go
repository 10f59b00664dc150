package server

import "github.com/cilium/hive/cell"

// Registrar registers one subsystem's handlers on the API server.
type Registrar func(*Server)

// HandlersOut is what a subsystem cell provides to serve its part of the
// API: its registrars go into the "api-handlers" value group, which the
// agent registers before it serves, so no single place knows every
// subsystem's handlers.
type HandlersOut struct {
	cell.Out
	Handlers []Registrar `group:"api-handlers,flatten"`
}

// HandlersIn are every subsystem's registrars.
type HandlersIn struct {
	cell.In
	Handlers []Registrar `group:"api-handlers"`
}

// Handlers returns HandlersOut holding r.
func Handlers(r ...Registrar) HandlersOut { return HandlersOut{Handlers: r} }

// RegisterAll registers every registrar's handlers on s.
func (in HandlersIn) RegisterAll(s *Server) {
	for _, r := range in.Handlers {
		r(s)
	}
}
