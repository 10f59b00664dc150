// Package operatortest holds what the tests of the operator's jobs share:
// the Tendril CRDs installed in the real API server of a package's tests,
// a quiet logger, and a poll for a condition.
package operatortest

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/k8s/crdinstall"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

// InstallCRDs installs the Tendril CRDs: the setup of a package's
// k8senv.Package (env.Main(m, opts, operatortest.InstallCRDs)).
func InstallCRDs(e *k8senv.Env) error {
	c, err := k8s.NewClientsForConfig(e.RESTConfig())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = crdinstall.Install(ctx, c.Dynamic, Quiet())
	return err
}

// Quiet is a logger that writes nothing.
func Quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// WaitFor polls cond every 50 ms until it holds, failing the test after
// timeout (a deadline that only keeps a broken test from hanging).
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
