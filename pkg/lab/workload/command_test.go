package workload

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRunCommandFlags: bad input is refused with the flag named, before
// anything listens.
func TestRunCommandFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--pod-name", "p", "--tcp", "eighty"},
		{"--pod-name", "p", "--udp", "70000"},
		{"--pod-name", "p", "--no-such-flag"},
		{"--pod-name", "p", "stray"},
	} {
		if err := RunCommand(context.Background(), "t", args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// TestRunCommandHelp: --help prints the usage (what an image's
// entrypoint check looks for) and is no error.
func TestRunCommandHelp(t *testing.T) {
	var out strings.Builder
	if err := RunCommand(context.Background(), "tendril-workload", []string{"--help"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "Usage: tendril-workload --pod-name NAME") || !strings.Contains(out.String(), "-report-peer") {
		t.Errorf("usage:\n%s", out.String())
	}
}

// TestRunCommandServesAndReportsReady: the command line of the lab's
// kubelet (--ready-fd 3 there; here a pipe's descriptor) gets a
// server that says ready once it listens, answers with --pod-name and the
// peer (--report-peer), and returns when its context ends.
func TestRunCommandServesAndReportsReady(t *testing.T) {
	port := freePort(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	// The command closes the descriptor it is given: give it its own.
	fd, err := syscall.Dup(int(pw.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	pw.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- RunCommand(ctx, "t", []string{"--pod-name", "web-2", "--tcp", fmt.Sprint(port), "--udp", fmt.Sprint(port),
			"--address", "127.0.0.1", "--report-peer", "--ready-fd", fmt.Sprint(fd)}, io.Discard)
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("ready line %q: %v", line, err)
	}
	for _, udp := range []bool{false, true} {
		got, err := Probe(context.Background(), fmt.Sprintf("127.0.0.1:%d", port), udp, 2*time.Second)
		if err != nil || !strings.HasPrefix(got, "web-2 from 127.0.0.1:") {
			t.Errorf("probe udp=%v: %q, %v", udp, got, err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
