package connectivity

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeProber connects where allowed says so; after flipAfter probes of a
// target its answer flips (a policy arriving late).
type fakeProber struct {
	mu        sync.Mutex
	allowed   map[string]bool
	flipAfter map[string]int
	seen      map[string]int
}

func (f *fakeProber) outcome(key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[key]++
	ok := f.allowed[key]
	if n, flips := f.flipAfter[key]; flips && f.seen[key] > n {
		ok = !ok
	}
	if ok {
		return nil
	}
	return fmt.Errorf("%w: i/o timeout", ErrDropped)
}

func (f *fakeProber) Probe(_ context.Context, pod, addr string, _ ProbeOptions, _ time.Duration) (string, error) {
	return "", f.outcome(pod + ">" + addr)
}

func (f *fakeProber) Ping(_ context.Context, pod, ip string, _ time.Duration) error {
	return f.outcome(pod + ">" + ip)
}

func (f *fakeProber) Dial(_ context.Context, pod, addr string, _ time.Duration) error {
	return f.outcome(pod + ">" + addr)
}

func TestRunnerPassesFailsAndWaitsForPolicy(t *testing.T) {
	p := &fakeProber{
		allowed:   map[string]bool{"a>10.0.0.2:80": true, "a>10.0.0.9": true, "b>10.0.0.2:80": true, "a>10.0.0.9:6443": true},
		flipAfter: map[string]int{"b>10.0.0.2:80": 2}, // denied from the third probe on
		seen:      map[string]int{},
	}
	var out bytes.Buffer
	r := &Runner{Prober: p, Out: &out, ProbeTimeout: time.Millisecond, Settle: 2 * time.Second, DenyProbes: 3}
	res := r.Run(context.Background(), 4, 1, []Check{
		{Name: "allowed tcp", From: "a", To: "10.0.0.2:80", Proto: "tcp", Allowed: true},
		{Name: "api server", From: "a", To: "10.0.0.9:6443", Proto: "tcp-connect", Allowed: true},
		{Name: "ping host", From: "a", To: "10.0.0.9", Proto: "icmp", Allowed: true},
		{Name: "policy arrives late", From: "b", To: "10.0.0.2:80", Proto: "tcp", Allowed: false},
		{Name: "never connects", From: "a", To: "10.0.0.3:81", Proto: "udp", Allowed: true},
	})
	if Failed(res) != 1 || !res[0].Passed || !res[1].Passed || !res[2].Passed || !res[3].Passed || res[4].Passed {
		t.Fatalf("results %+v", res)
	}
	// Two probes connect before the policy arrives, then the window of
	// three dropped probes.
	if res[3].Attempts != 5 {
		t.Fatalf("late policy: %d attempts, want 5", res[3].Attempts)
	}
	if !strings.Contains(out.String(), "[5/4] never connects") || !strings.Contains(out.String(), "FAILED") {
		t.Fatalf("progress lines:\n%s", out.String())
	}
	var table bytes.Buffer
	PrintTable(&table, res)
	for _, want := range []string{"CHECK", "PASS", "FAIL: dropped: i/o timeout", "5 checks: 4 passed, 1 failed"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}

// answerProber answers every probe of a target with the next name of its
// list, round and round; a target without a list cannot be probed.
type answerProber struct {
	mu      sync.Mutex
	answers map[string][]string
	n       map[string]int
	// opts are the options of every probe, in order.
	opts []ProbeOptions
}

func (a *answerProber) Probe(_ context.Context, pod, addr string, opts ProbeOptions, _ time.Duration) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.opts = append(a.opts, opts)
	key := pod + ">" + addr
	list, ok := a.answers[key]
	if !ok {
		return "", fmt.Errorf("%w: no pod %s", ErrCannotProbe, pod)
	}
	if len(list) == 0 {
		return "", fmt.Errorf("%w: i/o timeout", ErrDropped)
	}
	i := a.n[key]
	a.n[key]++
	return list[i%len(list)], nil
}

func (a *answerProber) Ping(context.Context, string, string, time.Duration) error { return nil }
func (a *answerProber) Dial(context.Context, string, string, time.Duration) error { return nil }

func TestRunnerJudgesWhoAnswers(t *testing.T) {
	p := &answerProber{n: map[string]int{}, answers: map[string][]string{
		"c>svc:80":    {"s1", "s2"},
		"c>sticky:80": {"s1"},
		"c>local:80":  {"s1", "s1", "s1", "s2"},
		"c>one:80":    {"s2"},
		"c>stray:80":  {"s1", "x"},
		"c>down:80":   {},
		"c>world:80":  {"world from 10.0.0.1:61234"},
		"c>leak:80":   {"world from 10.244.0.5:40000"},
	}}
	backends := []string{"s1", "s2"}
	r := &Runner{Prober: p, Out: &bytes.Buffer{}, ProbeTimeout: time.Millisecond, Settle: 300 * time.Millisecond}
	res := r.Run(context.Background(), 8, 1, []Check{
		{Name: "spread", From: "c", To: "svc:80", Proto: "tcp", Allowed: true, Backends: backends, Repeat: 4, Spread: true},
		{Name: "sticky", From: "c", To: "sticky:80", Proto: "tcp", Allowed: true, Backends: backends, Repeat: 8, Sticky: true},
		{Name: "sticky broken", From: "c", To: "svc:80", Proto: "tcp", Allowed: true, Backends: backends, Repeat: 8, Sticky: true},
		{Name: "local broken", From: "c", To: "local:80", Proto: "tcp", Allowed: true, Backends: []string{"s1"}, Repeat: 8},
		{Name: "spread never", From: "c", To: "one:80", Proto: "tcp", Allowed: true, Backends: backends, Repeat: 4, Spread: true},
		{Name: "stranger answers", From: "c", To: "stray:80", Proto: "tcp", Allowed: true, Backends: backends, Repeat: 2},
		{Name: "denied", From: "c", To: "down:80", Proto: "tcp", Allowed: false},
		{Name: "cannot probe is no denial", From: "nopod", To: "svc:80", Proto: "tcp", Allowed: false},
		{Name: "masqueraded to the node", From: "c", To: "world:80", Proto: "tcp", Allowed: true, AnswerPrefix: "world from 10.0.0.1:"},
		{Name: "left with the pod address", From: "c", To: "leak:80", Proto: "tcp", Allowed: true, AnswerPrefix: "world from 10.0.0.1:"},
	})
	want := []bool{true, true, false, false, false, false, true, false, true, false}
	for i, w := range want {
		if res[i].Passed != w {
			t.Errorf("%s: passed=%v, want %v (last %q)", res[i].Name, res[i].Passed, w, res[i].Last)
		}
	}
	// A verdict on who answered is final: no retry until a lucky draw.
	if res[2].Attempts != 1 || res[3].Attempts != 1 {
		t.Errorf("sticky/local broken retried: %d, %d attempts", res[2].Attempts, res[3].Attempts)
	}
	// A spread not seen yet is retried (a backend may still be joining).
	if res[4].Attempts < 2 {
		t.Errorf("spread never: %d attempts, want retries", res[4].Attempts)
	}
	if res[7].Attempts != 1 || !strings.Contains(res[7].Last, "cannot probe") {
		t.Errorf("cannot probe: %d attempts, last %q", res[7].Attempts, res[7].Last)
	}
	if !strings.Contains(res[3].Last, `answered by "s2"`) {
		t.Errorf("local broken: last %q", res[3].Last)
	}
}

func TestParseProbeAnswer(t *testing.T) {
	a, err := parseProbeAnswer("ns/c -> 10.96.0.10:80/tcp: answered \"server-same-node\"\n")
	if err != nil || a != "server-same-node" {
		t.Fatalf("%q, %v", a, err)
	}
	if _, err := parseProbeAnswer("garbage"); !errors.Is(err, ErrCannotProbe) {
		t.Fatalf("garbage: %v", err)
	}
}

func TestRunnerPassesProbeOptions(t *testing.T) {
	p := &answerProber{n: map[string]int{}, answers: map[string][]string{
		"c>servers:80": {"s"}, "c>servers:81": {"s"}, "c>kubernetes.default:443": {"kube-apiserver"}, "c>10.96.0.5:80": {"s"},
	}}
	var out bytes.Buffer
	r := &Runner{Prober: p, Out: &out, ProbeTimeout: time.Millisecond, Settle: time.Second}
	res := r.Run(context.Background(), 4, 1, []Check{
		{Name: "by name, DNS over TCP", From: "c", To: "servers:80", Proto: "tcp", Allowed: true, DNSTCP: true},
		{Name: "by name, UDP", From: "c", To: "servers:81", Proto: "udp", Allowed: true},
		{Name: "kubernetes", From: "c", To: "kubernetes.default:443", Proto: "tls", Allowed: true, Backends: []string{"kube-apiserver"}},
		{Name: "per-packet NAT", From: "c", To: "10.96.0.5:80", Proto: "tcp", Allowed: true, OutsideNodeCgroup: true},
	})
	if Failed(res) != 0 {
		t.Fatalf("failed:\n%s", out.String())
	}
	want := []ProbeOptions{{DNSTCP: true}, {UDP: true}, {TLS: true}, {OutsideNodeCgroup: true}}
	if fmt.Sprint(p.opts) != fmt.Sprint(want) {
		t.Fatalf("probe options %+v, want %+v", p.opts, want)
	}
}

// scriptProber answers the probes of each target with a script of
// outcomes, one per probe in order (the last one repeats): nil connects,
// an error fails the probe.
type scriptProber struct {
	mu     sync.Mutex
	script map[string][]error
	n      map[string]int
}

func (s *scriptProber) next(key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := s.script[key]
	i := min(s.n[key], len(list)-1)
	s.n[key]++
	return list[i]
}

func (s *scriptProber) Probe(_ context.Context, pod, addr string, _ ProbeOptions, _ time.Duration) (string, error) {
	return "s", s.next(pod + ">" + addr)
}
func (s *scriptProber) Ping(_ context.Context, pod, ip string, _ time.Duration) error {
	return s.next(pod + ">" + ip)
}
func (s *scriptProber) Dial(_ context.Context, pod, addr string, _ time.Duration) error {
	return s.next(pod + ">" + addr)
}

// TestRunnerDeniedHoldsOverAWindow: a denied check passes only when a
// whole window of probes is dropped. One lost datagram, a refusal, a
// probe that cannot be made or a policy that goes away in the middle of
// the window fail it; allowed checks still retry through failures.
func TestRunnerDeniedHoldsOverAWindow(t *testing.T) {
	drop := fmt.Errorf("%w: i/o timeout", ErrDropped)
	refused := errors.New("connection refused")
	cannot := fmt.Errorf("%w: no pod", ErrCannotProbe)
	p := &scriptProber{n: map[string]int{}, script: map[string][]error{
		"c>held:80":      {drop},
		"c>late:80":      {nil, nil, drop},
		"c>onelost:80":   {drop, nil},
		"c>removed:80":   {drop, drop, nil},
		"c>refused:80":   {refused},
		"c>cannot:80":    {cannot},
		"c>flaky:80":     {drop, refused, nil},
		"c>neverdrop:80": {nil},
		"c>10.0.0.9":     {drop},
		"c>allowed:80":   {drop, refused, drop, nil},
	}}
	r := &Runner{Prober: p, Out: &bytes.Buffer{}, ProbeTimeout: time.Millisecond, Settle: 700 * time.Millisecond, DenyProbes: 3}
	res := r.Run(context.Background(), 10, 1, []Check{
		{Name: "held", From: "c", To: "held:80", Proto: "tcp"},
		{Name: "policy arrives late", From: "c", To: "late:80", Proto: "udp"},
		{Name: "one lost datagram, no policy", From: "c", To: "onelost:80", Proto: "udp"},
		{Name: "policy removed in the window", From: "c", To: "removed:80", Proto: "tcp"},
		{Name: "refused is no drop", From: "c", To: "refused:80", Proto: "tcp"},
		{Name: "cannot probe is no drop", From: "c", To: "cannot:80", Proto: "tcp"},
		{Name: "refused in the window", From: "c", To: "flaky:80", Proto: "tcp"},
		{Name: "never dropped", From: "c", To: "neverdrop:80", Proto: "tcp"},
		{Name: "ping dropped", From: "c", To: "10.0.0.9", Proto: "icmp"},
		{Name: "allowed retries", From: "c", To: "allowed:80", Proto: "tcp", Allowed: true},
	})
	want := []struct {
		passed   bool
		attempts int
		last     string
	}{
		{true, 3, ""},
		{true, 5, ""},
		{false, 2, "connected after 1 dropped probe: the denial does not hold"},
		{false, 3, "connected after 2 dropped probes"},
		{false, -1, "not dropped: connection refused"},
		{false, 1, "cannot probe"},
		{false, 2, "not dropped: connection refused after 1 dropped probe"},
		{false, -1, "connected"},
		{true, 3, ""},
		{true, 4, ""},
	}
	for i, w := range want {
		got := res[i]
		if got.Passed != w.passed || (w.attempts >= 0 && got.Attempts != w.attempts) || !strings.Contains(got.Last, w.last) {
			t.Errorf("%s: passed=%v after %d probes (last %q), want passed=%v after %d probes (last %q)",
				got.Name, got.Passed, got.Attempts, got.Last, w.passed, w.attempts, w.last)
		}
	}
	// Checks that never see the expected outcome retry until Settle.
	for _, i := range []int{4, 7} {
		if res[i].Attempts < 2 {
			t.Errorf("%s: %d probes, want retries until Settle", res[i].Name, res[i].Attempts)
		}
	}
}

// TestProbeFailureClassifies: only a probe whose time ran out before
// anything came back counts as dropped.
func TestProbeFailureClassifies(t *testing.T) {
	for _, c := range []struct {
		msg     string
		opts    ProbeOptions
		dropped bool
	}{
		{"ns/c -> 10.0.0.2:80/tcp: no answer: dial tcp 10.0.0.2:80: i/o timeout", ProbeOptions{}, true},
		{"ns/c -> 10.0.0.2:81/udp: no answer: no answer within 1s", ProbeOptions{UDP: true}, true},
		{"ns/c -> servers:81/udp: resolve servers: read udp 10.0.0.3:5353->10.96.0.10:53: i/o timeout", ProbeOptions{UDP: true}, true},
		// The lab workload's own resolver (pkg/lab/workload) when no answer came.
		{"ns/c -> servers:81/udp: resolve servers: 10.96.0.10:53 over UDP: no answer within 2s", ProbeOptions{UDP: true}, true},
		{"ns/c -> 10.0.0.2:80/tcp: no answer: dial tcp 10.0.0.2:80: connect: connection refused", ProbeOptions{}, false},
		{"ns/c -> 10.0.0.2:81/udp: no answer: read udp: connection refused", ProbeOptions{UDP: true}, false},
		{"ns/c -> 10.0.0.2:80/tcp: no answer: connected, but no answer: read tcp: i/o timeout", ProbeOptions{}, false},
		{"ns/c -> 10.0.0.2:80/tcp: no answer: dial tcp: connect: no route to host", ProbeOptions{}, false},
		{"ns/c -> nope:80/tcp: nope: no such host", ProbeOptions{}, false},
	} {
		if got := errors.Is(probeFailure(c.msg, c.opts), ErrDropped); got != c.dropped {
			t.Errorf("%q: dropped=%v, want %v", c.msg, got, c.dropped)
		}
	}
}
