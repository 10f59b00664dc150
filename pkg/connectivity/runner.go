// Package connectivity is `tendril connectivity test`: it deploys its own
// pods into a cluster, then checks pod-to-pod traffic on one node and
// across nodes, pod-to-host, and policy cases (allowed and denied, by
// TendrilNetworkPolicy and Kubernetes NetworkPolicy), printing a line per
// check and a pass/fail table. How a probe is made is a Prober: the lab
// enters the pod's network namespace; a cluster mode can exec into pods.
package connectivity

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Prober makes connections from inside a pod.
type Prober interface {
	// Probe connects from pod (namespace/name) to addr (IP:port) and
	// waits for an answer; an error means no connection or no answer.
	Probe(ctx context.Context, pod, addr string, udp bool, timeout time.Duration) error
	// Ping sends ICMP echo requests from pod to ip.
	Ping(ctx context.Context, pod, ip string, timeout time.Duration) error
	// Dial only opens a TCP connection from pod to addr (for servers that
	// do not answer the probe's request, such as the API server's TLS).
	Dial(ctx context.Context, pod, addr string, timeout time.Duration) error
}

// Check is one expectation: from a pod to a target, connected or not.
type Check struct {
	Name string
	From string
	// To is IP:port for TCP/UDP, an IP for ICMP.
	To    string
	Proto string // tcp, udp, icmp or tcp-connect
	// Allowed is the expected outcome.
	Allowed bool
}

// Result is a check's outcome.
type Result struct {
	Check
	Passed   bool
	Attempts int
	Took     time.Duration
	// Last is the last probe's error ("" when it connected).
	Last string
}

// Runner runs checks with a Prober.
type Runner struct {
	Prober Prober
	Out    io.Writer
	// ProbeTimeout bounds one probe.
	ProbeTimeout time.Duration
	// Settle is how long a check keeps retrying until the expected outcome
	// shows: policy reaches the nodes asynchronously.
	Settle time.Duration
}

func (r *Runner) probeOnce(ctx context.Context, c Check) error {
	switch c.Proto {
	case "icmp":
		return r.Prober.Ping(ctx, c.From, c.To, r.ProbeTimeout)
	case "udp":
		return r.Prober.Probe(ctx, c.From, c.To, true, r.ProbeTimeout)
	case "tcp-connect":
		return r.Prober.Dial(ctx, c.From, c.To, r.ProbeTimeout)
	default:
		return r.Prober.Probe(ctx, c.From, c.To, false, r.ProbeTimeout)
	}
}

// Run runs the checks in order, a progress line each. A check passes as
// soon as a probe's outcome is the expected one; it fails when Settle
// passes without that.
func (r *Runner) Run(ctx context.Context, total, first int, checks []Check) []Result {
	out := make([]Result, 0, len(checks))
	for i, c := range checks {
		begin := time.Now()
		res := Result{Check: c}
		for {
			res.Attempts++
			err := r.probeOnce(ctx, c)
			connected := err == nil
			res.Last = ""
			if err != nil {
				res.Last = err.Error()
			}
			if connected == c.Allowed {
				res.Passed = true
				break
			}
			if time.Since(begin) > r.Settle || ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
		res.Took = time.Since(begin)
		verdict := "ok"
		if !res.Passed {
			verdict = "FAILED"
		}
		fmt.Fprintf(r.Out, "[%d/%d] %-52s %-6s (%s, %d probe%s)\n", first+i, total, c.Name, verdict,
			res.Took.Round(time.Millisecond), res.Attempts, plural(res.Attempts))
		out = append(out, res)
	}
	return out
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// Failed counts the failed results.
func Failed(results []Result) int {
	n := 0
	for _, r := range results {
		if !r.Passed {
			n++
		}
	}
	return n
}

// PrintTable writes the pass/fail table.
func PrintTable(w io.Writer, results []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tFROM\tTO\tEXPECTED\tRESULT\tTIME")
	for _, r := range results {
		want := "allowed"
		if !r.Allowed {
			want = "denied"
		}
		got := "PASS"
		if !r.Passed {
			got = "FAIL: " + firstLine(r.Last)
			if r.Last == "" {
				got = "FAIL: connected"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s/%s\t%s\t%s\t%s\n", r.Name, r.From, r.To, r.Proto, want, got, r.Took.Round(time.Millisecond))
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d checks: %d passed, %d failed\n", len(results), len(results)-Failed(results), Failed(results))
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
