// Package connectivity is `tendril connectivity test`: it deploys its own
// pods and Services into a cluster, then checks pod-to-pod traffic on one
// node and across nodes, pod-to-host, Services by ClusterIP (balancing,
// session affinity, internalTrafficPolicy Local), and policy cases (allowed and denied, by
// TendrilNetworkPolicy and Kubernetes NetworkPolicy), printing a line per
// check and a pass/fail table. How a probe is made is a Prober: the lab
// enters the pod's network namespace; a cluster mode can exec into pods.
package connectivity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Prober makes connections from inside a pod.
type Prober interface {
	// Probe connects from pod (namespace/name) to addr (IP:port, or a
	// DNS name and port that the pod resolves through its cluster DNS),
	// waits for an answer and returns it (the lab workload answers with its
	// pod's name, a TLS server with its certificate's common name); an
	// error means no connection or no answer: wrapping ErrDropped when
	// nothing came back within the timeout (what a policy that drops looks
	// like), wrapping ErrCannotProbe when the probe could not be made at
	// all, neither for any other failure (refused, unreachable, a name
	// that does not exist). Ping and Dial report the same way.
	Probe(ctx context.Context, pod, addr string, opts ProbeOptions, timeout time.Duration) (string, error)
	// Ping sends ICMP echo requests from pod to ip.
	Ping(ctx context.Context, pod, ip string, timeout time.Duration) error
	// Dial only opens a TCP connection from pod to addr (for servers that
	// do not answer the probe's request, such as the API server's TLS).
	Dial(ctx context.Context, pod, addr string, timeout time.Duration) error
}

// ProbeOptions say how a probe connects.
type ProbeOptions struct {
	// UDP probes over UDP (default TCP).
	UDP bool
	// TLS completes a TLS handshake that verifies the server's certificate
	// for the host probed.
	TLS bool
	// DNSTCP resolves a name with DNS queries over TCP (default UDP).
	DNSTCP bool
	// OutsideNodeCgroup probes from a process in the pod's network
	// namespace that is in no node's cgroup, so no socket load-balancing
	// translates a Service address: the pod programs' per-packet NAT must.
	OutsideNodeCgroup bool
}

// Check is one expectation: from a pod to a target, connected or not.
type Check struct {
	Name string
	From string
	// To is IP:port (or DNS name:port) for TCP/UDP/TLS, an IP for ICMP.
	To    string
	Proto string // tcp, udp, tls, icmp or tcp-connect
	// DNSTCP and OutsideNodeCgroup are passed to the probe (ProbeOptions).
	DNSTCP            bool
	OutsideNodeCgroup bool
	// Allowed is the expected outcome.
	Allowed bool
	// Service checks (TCP/UDP through a Service's ClusterIP) say who may
	// answer. Backends are the pods that may (none set: anyone). Repeat is
	// how many probes one attempt makes (0: one). Spread: every backend
	// answers within one attempt (load is balanced). Sticky: one backend
	// answers every probe of the attempt (session affinity).
	Backends []string
	Repeat   int
	Spread   bool
	Sticky   bool
	// AnswerPrefix, when set, is how every answer must begin (the world
	// server's "world from <node address>:": who the server saw).
	AnswerPrefix string
}

// ErrCannotProbe marks a probe that could not be made (no such pod, a
// broken prober): a check never counts it as "denied".
var ErrCannotProbe = errors.New("cannot probe")

// ErrDropped marks a probe that got nothing back within its timeout: no
// handshake, no answer, no refusal. Tendril's policy drops what it denies,
// so this is the only failure a denied check accepts; a refusal says the
// traffic reached its destination.
var ErrDropped = errors.New("dropped")

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
	// DenyProbes is how many probes in a row a denied check needs dropped
	// (0: one). From the first dropped probe on, every probe must be
	// dropped: one that connects, or fails otherwise, fails the check at
	// once. A single lost datagram or slow handshake therefore never
	// passes a check whose policy is absent.
	DenyProbes int
}

func (r *Runner) probeOnce(ctx context.Context, c Check) (string, error) {
	opts := ProbeOptions{DNSTCP: c.DNSTCP, OutsideNodeCgroup: c.OutsideNodeCgroup}
	switch c.Proto {
	case "icmp":
		return "", r.Prober.Ping(ctx, c.From, c.To, r.ProbeTimeout)
	case "tcp-connect":
		return "", r.Prober.Dial(ctx, c.From, c.To, r.ProbeTimeout)
	case "udp":
		opts.UDP = true
	case "tls":
		opts.TLS = true
	}
	return r.Prober.Probe(ctx, c.From, c.To, opts, r.ProbeTimeout)
}

// attempt makes one attempt of a check: Repeat probes (one by default),
// stopping at the first that gets no answer. It returns the answers and
// that error.
func (r *Runner) attempt(ctx context.Context, c Check) ([]string, error) {
	var answers []string
	for range max(c.Repeat, 1) {
		a, err := r.probeOnce(ctx, c)
		if err != nil {
			return answers, err
		}
		answers = append(answers, a)
	}
	return answers, nil
}

// judgeAnswers says whether the answers of an attempt where every probe
// was answered meet the check's expectations about who answers, and why
// not.
func judgeAnswers(c Check, answers []string) (bool, string) {
	seen := map[string]int{}
	for _, a := range answers {
		seen[a]++
		if len(c.Backends) > 0 && !slices.Contains(c.Backends, a) {
			return false, fmt.Sprintf("answered by %q, not one of %v", a, c.Backends)
		}
		if c.AnswerPrefix != "" && !strings.HasPrefix(a, c.AnswerPrefix) {
			return false, fmt.Sprintf("answered %q, want %q...", a, c.AnswerPrefix)
		}
	}
	if c.Sticky && len(seen) > 1 {
		return false, fmt.Sprintf("%d probes answered by %d backends %v, want one", len(answers), len(seen), seen)
	}
	if c.Spread {
		for _, b := range c.Backends {
			if seen[b] == 0 {
				return false, fmt.Sprintf("%d probes never answered by %s (answers %v)", len(answers), b, seen)
			}
		}
	}
	return true, ""
}

// Run runs the checks in order, a progress line each. An allowed check
// passes as soon as a probe's outcome is the expected one; it fails when
// Settle passes without that. A denied check retries while probes get
// through (the policy may not have arrived yet) and passes once DenyProbes
// probes in a row are dropped; it fails when, after its first dropped
// probe, one is not (the policy does not hold), when Settle passes first,
// or when a probe cannot be made.
func (r *Runner) Run(ctx context.Context, total, first int, checks []Check) []Result {
	out := make([]Result, 0, len(checks))
	for i, c := range checks {
		begin := time.Now()
		var res Result
		if c.Allowed {
			res = r.runAllowed(ctx, c)
		} else {
			res = r.runDenied(ctx, c)
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

// runAllowed retries a check that expects a connection until it connects
// and the answers are right, or Settle passes.
func (r *Runner) runAllowed(ctx context.Context, c Check) Result {
	begin := time.Now()
	res := Result{Check: c}
	for {
		res.Attempts++
		answers, err := r.attempt(ctx, c)
		res.Last = ""
		if err != nil {
			res.Last = err.Error()
		}
		if errors.Is(err, ErrCannotProbe) {
			return res // retrying will not help
		}
		if err == nil {
			ok, why := judgeAnswers(c, answers)
			res.Passed, res.Last = ok, why
			// Who answered is final once everything answers: retrying
			// until a lucky draw would let a broken affinity or traffic
			// policy pass. Only a spread not seen yet (a backend still
			// being added) is worth another attempt.
			if ok || !c.Spread {
				return res
			}
		}
		if !r.wait(ctx, begin) {
			return res
		}
	}
}

// runDenied probes a check that expects denial until DenyProbes probes in
// a row are dropped. Before the first drop, a probe that gets through is
// retried (policy reaches the nodes asynchronously); from the first drop
// on, the window must hold: any other outcome fails the check.
func (r *Runner) runDenied(ctx context.Context, c Check) Result {
	begin := time.Now()
	res := Result{Check: c}
	dropped := 0
	for {
		res.Attempts++
		_, err := r.attempt(ctx, c)
		switch {
		case errors.Is(err, ErrCannotProbe):
			res.Last = err.Error()
			return res // never mistaken for a denial
		case errors.Is(err, ErrDropped):
			dropped++
			res.Last = ""
			if dropped >= max(r.DenyProbes, 1) {
				res.Passed = true
				return res
			}
			continue // the window's next probe, at once
		case err == nil:
			res.Last = "connected"
		default:
			res.Last = "not dropped: " + err.Error()
		}
		if dropped > 0 {
			res.Last = fmt.Sprintf("%s after %d dropped probe%s: the denial does not hold", res.Last, dropped, plural(dropped))
			return res
		}
		if !r.wait(ctx, begin) {
			return res
		}
	}
}

// wait pauses before a check's next attempt; false when Settle has passed
// since begin or ctx is done.
func (r *Runner) wait(ctx context.Context, begin time.Time) bool {
	if time.Since(begin) > r.Settle || ctx.Err() != nil {
		return false
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(200 * time.Millisecond):
		return true
	}
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
		}
		if r.Repeat > 1 {
			want += fmt.Sprintf(" (x%d)", r.Repeat)
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
