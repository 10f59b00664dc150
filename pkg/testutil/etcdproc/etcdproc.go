// Package etcdproc runs the real etcd binary (built into the tendril cache
// by hack/k8s-binaries.sh) as a child process of a test, and stops and
// restarts it on the same data directory and address: an etcd outage as a
// client sees it.
package etcdproc

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/freeport"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// Version is the etcd release the tests run.
const Version = "v3.6.16"

// Binary is where hack/k8s-binaries.sh puts etcd ($TENDRIL_CACHE, default
// ~/.cache/tendril, then bin/etcd-<Version>).
func Binary() string {
	cache := os.Getenv("TENDRIL_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "tendril")
	}
	return filepath.Join(cache, "bin", "etcd-"+Version)
}

// Server is one etcd process, killed at the end of the test.
type Server struct {
	bin, dir           string
	clientURL, peerURL string
	cmd                *exec.Cmd
	exited             chan struct{}
}

// Start runs etcd and waits until it listens. Without the binary the test
// skips (fails under CI=true).
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Binary()
	_, err := os.Stat(bin)
	testutil.Require(t, err == nil, "no etcd binary at "+bin+" (hack/k8s-binaries.sh builds it)")
	s := &Server{bin: bin, dir: t.TempDir()}
	client := freePort(t)
	s.clientURL = "http://127.0.0.1:" + strconv.Itoa(client)
	s.peerURL = "http://127.0.0.1:" + strconv.Itoa(freePort(t, client))
	s.Start(t)
	t.Cleanup(s.kill)
	return s
}

// freePort is outside the ephemeral range: etcd binds it again on every
// restart, and no outgoing connection may take it in between.
func freePort(t testing.TB, avoid ...int) int {
	p, err := freeport.Loopback(avoid...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Endpoints are the client URLs.
func (s *Server) Endpoints() []string { return []string{s.clientURL} }

// Running reports whether the process is up.
func (s *Server) Running() bool { return s.cmd != nil }

// Start (re)starts etcd on the server's data directory and address and
// waits until it accepts connections.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	s.cmd = exec.Command(s.bin, "--name", "default", "--data-dir", filepath.Join(s.dir, "data"),
		"--listen-client-urls", s.clientURL, "--advertise-client-urls", s.clientURL,
		"--listen-peer-urls", s.peerURL, "--initial-advertise-peer-urls", s.peerURL,
		"--initial-cluster", "default="+s.peerURL, "--log-level", "error")
	s.cmd.Stdout, s.cmd.Stderr = os.Stderr, os.Stderr
	// etcd dies with the test binary.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := testutil.StartPinned(s.cmd); err != nil {
		t.Fatalf("start %s: %v", s.bin, err)
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(s.cmd, s.exited)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := s.clientURL[len("http://"):]
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-s.exited:
			t.Fatalf("etcd exited during start")
		case <-ctx.Done():
			t.Fatalf("etcd does not listen on %s: %v", addr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop kills etcd with SIGKILL (an outage without goodbye) and waits for
// the process to end.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.kill()
}

func (s *Server) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}
