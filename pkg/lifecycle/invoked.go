package lifecycle

import "github.com/cilium/hive/cell"

// Invoked is a cell's share of the agent's one root Invoke: a constructor
// returning it runs when the hive is populated, though no other cell takes
// its value, as a cell.Invoke in the cell's module would, and in the same
// order (the group's providers run in the order the cells register them).
//
// Why not cell.Invoke in each module: dig checks the whole dependency graph
// for cycles at the first Invoke in each scope after a Provide, so every
// module with an Invoke cost one full check when the hive was populated;
// with one Invoke at the root the graph is checked once. A Provide is not
// checked (the hive defers the check to the Invokes).
type Invoked struct {
	cell.Out

	Value any `group:"invoked"`
}

// InvokedAll is what the root Invoke takes: building it runs every cell's
// Invoked constructor. A hive other than the agent's (a cell's tests) lists
// an Invoke of func(lifecycle.InvokedAll) {} first, so the cells' Invoked
// constructors run before its other Invokes, as they do in the agent.
type InvokedAll struct {
	cell.In

	Values []any `group:"invoked"`
}

// Build is the constructor that makes the hive build a cell's object of
// type T: the module provides lifecycle.Build[*Module].
func Build[T any](v T) Invoked { return Invoked{Value: v} }

// Check is the constructor that validates a cell's config when the hive is
// populated, before the constructors of the cells after it in the list:
// the module provides lifecycle.Check(Config.validate).
func Check[C any](validate func(C) error) func(C) (Invoked, error) {
	return func(c C) (Invoked, error) { return Invoked{}, validate(c) }
}
