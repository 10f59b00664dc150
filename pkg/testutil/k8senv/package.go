package k8senv

import (
	"context"
	"fmt"
	"testing"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// Package is the one control plane a test package shares: Main runs in
// TestMain, Need at the start of each test that uses it.
type Package struct {
	env *Env
	err error
}

// Main starts the control plane (then setup, if any), runs the tests,
// stops it and returns the exit code for os.Exit. A failed start does not
// stop the run: each test's Need reports it (and fails under CI=true).
func (p *Package) Main(m interface{ Run() int }, opts Options, setup func(*Env) error) int {
	p.env, p.err = Start(context.Background(), opts)
	if p.err == nil && setup != nil {
		p.err = setup(p.env)
	}
	code := m.Run()
	if p.env != nil {
		p.env.Stop()
	}
	return code
}

// Need returns the control plane, or ends the test when there is none.
func (p *Package) Need(t testing.TB) *Env {
	t.Helper()
	testutil.Require(t, p.err == nil, fmt.Sprintf("no control plane: %v", p.err))
	return p.env
}
