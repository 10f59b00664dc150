package hubble

import (
	"bufio"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"

	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	"github.com/tendril-net/tendril/pkg/observer"
)

// startServer serves an observer of the given events on a unix socket
// and a TCP port.
func startServer(t *testing.T, evs []loader.Event) (*observer.Observer, *Server, string) {
	t.Helper()
	obs := observer.New(observer.Config{}, hubbletest.Node{Name: "node-a"}, nil)
	for _, ev := range evs {
		if err := obs.Observe(ev); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(t.TempDir(), "hubble.sock")
	srv := New(Config{SocketPath: sock, TCPAddress: "127.0.0.1:0", Version: "tendril-test"}, obs, nil)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return obs, srv, "unix://" + sock
}

// hubble runs the stock CLI against server.
func hubble(t *testing.T, bin, server string, args ...string) string {
	t.Helper()
	return hubbletest.RunCLI(t, bin, server, args...)
}

// jsonFlows parses `hubble observe -o json` output.
func jsonFlows(t *testing.T, out string) []*flowpb.Flow {
	t.Helper()
	return hubbletest.JSONFlows(t, out)
}

// TestPrivilegedStockHubbleCLI drives the stock hubble CLI against the
// server, fed with flows decoded from the real datapath's events.
func TestPrivilegedStockHubbleCLI(t *testing.T) {
	bin := hubbletest.HubbleCLI(t)
	evs := hubbletest.DatapathEvents(t, hubbletest.Scenario())
	// Hold the last (the UDP reply) back for --follow.
	if len(evs) < 6 {
		t.Fatalf("only %d events from the datapath: %v", len(evs), evs)
	}
	for _, ev := range evs {
		t.Log(ev)
	}
	held := evs[len(evs)-1:]
	obs, srv, sock := startServer(t, evs[:len(evs)-1])
	stored := len(evs) - 1

	t.Run("status", func(t *testing.T) {
		out := hubble(t, bin, sock, "status")
		if !strings.Contains(out, "Healthcheck (via unix://") || !strings.Contains(out, ": Ok") {
			t.Fatalf("status:\n%s", out)
		}
		if !strings.Contains(out, "Current/Max Flows:") || !strings.Contains(out, "/4,095") {
			t.Fatalf("status lacks the ring:\n%s", out)
		}
	})
	t.Run("status over TCP", func(t *testing.T) {
		out := hubble(t, bin, srv.TCPAddr().String(), "status")
		if !strings.Contains(out, ": Ok") {
			t.Fatalf("status:\n%s", out)
		}
	})
	t.Run("list nodes", func(t *testing.T) {
		out := hubble(t, bin, sock, "list", "nodes")
		if !strings.Contains(out, "node-a") || !strings.Contains(out, "Connected") {
			t.Fatalf("list nodes:\n%s", out)
		}
	})
	t.Run("observe last 100", func(t *testing.T) {
		flows := jsonFlows(t, hubble(t, bin, sock, "observe", "--last", "100", "-o", "json"))
		if len(flows) != stored {
			t.Fatalf("%d flows, want %d", len(flows), stored)
		}
		compact := hubble(t, bin, sock, "observe", "--last", "100")
		if !strings.Contains(compact, "shop/web-7d9f:40000 (ID:1000) -> data/db-0:5432 (ID:1001)") ||
			!strings.Contains(compact, "DROPPED") || !strings.Contains(compact, "Policy denied") {
			t.Fatalf("compact output:\n%s", compact)
		}
	})
	cases := []struct {
		name  string
		args  []string
		check func(*flowpb.Flow) bool
		min   int
	}{
		{"pod", []string{"--pod", "data/db-0"}, func(f *flowpb.Flow) bool {
			return f.GetSource().GetPodName() == "db-0" || f.GetDestination().GetPodName() == "db-0"
		}, 6},
		{"namespace", []string{"--namespace", "shop"}, func(f *flowpb.Flow) bool {
			return f.GetSource().GetNamespace() == "shop" || f.GetDestination().GetNamespace() == "shop"
		}, 6},
		{"verdict dropped", []string{"--verdict", "DROPPED"}, func(f *flowpb.Flow) bool {
			return f.GetVerdict() == flowpb.Verdict_DROPPED
		}, 2},
		{"label", []string{"--label", "app=db"}, func(f *flowpb.Flow) bool {
			return hasLabel(f.GetSource(), "k8s:app=db") || hasLabel(f.GetDestination(), "k8s:app=db")
		}, 6},
		{"port", []string{"--port", "22"}, func(f *flowpb.Flow) bool {
			return f.GetL4().GetTCP().GetDestinationPort() == 22 || f.GetL4().GetTCP().GetSourcePort() == 22
		}, 1},
		{"protocol", []string{"--protocol", "tcp"}, func(f *flowpb.Flow) bool { return f.GetL4().GetTCP() != nil }, 6},
		{"dropped by policy name", []string{"--verdict", "DROPPED", "--to-pod", "data/db-0", "--port", "22"}, func(f *flowpb.Flow) bool {
			p := f.GetIngressDeniedBy()
			return f.GetDropReasonDesc() == flowpb.DropReason_POLICY_DENY && len(p) == 1 && p[0].GetName() == "db-deny-ssh" && p[0].GetNamespace() == "data"
		}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			flows := jsonFlows(t, hubble(t, bin, sock, append([]string{"observe", "--last", "100", "-o", "json"}, c.args...)...))
			if len(flows) < c.min {
				t.Fatalf("%d flows, want at least %d", len(flows), c.min)
			}
			for _, f := range flows {
				if !c.check(f) {
					t.Errorf("flow does not match %v: %v", c.args, f)
				}
			}
			if len(flows) == stored {
				t.Errorf("filter %v selected every flow", c.args)
			}
		})
	}

	t.Run("follow", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "observe", "--follow", "-o", "json", "--protocol", "udp", "--pod", "shop/web", "--server", sock)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); _ = cmd.Wait() }()
		lines := make(chan string)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		// Wait until the stream is open: the follow starts at "now".
		deadline := time.Now().Add(10 * time.Second)
		for !following(obs) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		// Each flow must come out before the next is made: streamed as
		// it happens, not batched.
		for i, ev := range held {
			if err := obs.Observe(ev); err != nil {
				t.Fatal(err)
			}
			select {
			case l := <-lines:
				fl := jsonFlows(t, l)
				if len(fl) != 1 || fl[0].GetL4().GetUDP() == nil {
					t.Fatalf("followed %q", l)
				}
			case <-ctx.Done(): // only ends a stream that never delivers
				t.Fatalf("flow %d not followed", i)
			}
		}
	})
}

// following reports whether a GetFlows stream waits on the ring.
func following(o *observer.Observer) bool { return o.Followers() > 0 }

func hasLabel(e *flowpb.Endpoint, l string) bool {
	for _, x := range e.GetLabels() {
		if x == l {
			return true
		}
	}
	return false
}
