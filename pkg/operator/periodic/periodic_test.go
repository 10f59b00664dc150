package periodic

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/operator/leader"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// eventually is the generous deadline of a wait for something that must
// happen (never an upper bound on how fast).
const eventually = 30 * time.Second

func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(eventually):
		t.Fatalf("no %s", what)
		panic("unreachable")
	}
}

// clock hands Run's pauses to the test: each pause asked for is sent on
// asked, and ends when the test sends on tick.
type clock struct {
	asked chan time.Duration
	tick  chan time.Time
}

func newClock() *clock {
	return &clock{asked: make(chan time.Duration, 16), tick: make(chan time.Time)}
}

func (c *clock) after(d time.Duration) <-chan time.Time {
	c.asked <- d
	return c.tick
}

// passes is a Pass whose results the test scripts; each call is
// announced on calls.
type passes struct {
	calls   chan int
	mu      sync.Mutex
	n       int
	results []error
}

func newPasses(results ...error) *passes {
	return &passes{calls: make(chan int, 16), results: results}
}

func (p *passes) pass(ctx context.Context) (string, error) {
	p.mu.Lock()
	p.n++
	n := p.n
	var err error
	if n <= len(p.results) {
		err = p.results[n-1]
	}
	p.mu.Unlock()
	select {
	case p.calls <- n:
	case <-ctx.Done():
	}
	if err != nil {
		return "partial " + string(rune('0'+n)), err
	}
	return "pass " + string(rune('0'+n)), nil
}

// reports records what Run reports.
type reports struct {
	mu   sync.Mutex
	last map[string]string
	all  []string
}

func (r *reports) Set(job, summary string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]string{}
	}
	r.last[job] = summary
	r.all = append(r.all, summary)
}

func (r *reports) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.all...)
}

func testJob(p *passes, c *clock, logs *testutil.SyncBuffer, r *reports) Job {
	j := Job{
		Name: "test-gc", Interval: time.Hour, Pass: p.pass, Failed: "Test GC pass failed",
		Log: slog.New(slog.NewTextHandler(logs, nil)), after: c.after,
	}
	if r != nil {
		j.Reports = r
	}
	return j
}

// start runs j until the returned stop is called; stop returns Run's
// error.
func start(j Job) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx) }()
	return func() error { cancel(); return <-done }
}

func TestPassAtOnceThenEveryInterval(t *testing.T) {
	p, c, r := newPasses(), newClock(), &reports{}
	stop := start(testJob(p, c, &testutil.SyncBuffer{}, r))
	if n := recv(t, "first pass", p.calls); n != 1 {
		t.Fatalf("first pass is call %d", n)
	}
	for want := 2; want <= 3; want++ {
		if d := recv(t, "pause", c.asked); d != time.Hour {
			t.Fatalf("pause %s, want the interval", d)
		}
		select {
		case n := <-p.calls:
			t.Fatalf("pass %d ran before the pause ended", n)
		default:
		}
		c.tick <- time.Time{}
		if n := recv(t, "next pass", p.calls); n != want {
			t.Fatalf("pass %d, want %d", n, want)
		}
	}
	recv(t, "pause", c.asked)
	if err := stop(); err != nil {
		t.Fatalf("Run = %v after its context ended", err)
	}
	if got := r.get(); strings.Join(got, ",") != "pass 1,pass 2,pass 3" {
		t.Fatalf("reports %q", got)
	}
	// Nothing runs after the end of the term.
	select {
	case n := <-p.calls:
		t.Fatalf("pass %d after the context ended", n)
	default:
	}
}

func TestFailedPassIsLoggedReportedAndTheNextRuns(t *testing.T) {
	boom := errors.New("api server said no")
	p, c, r, logs := newPasses(boom), newClock(), &reports{}, &testutil.SyncBuffer{}
	j := testJob(p, c, logs, r)
	j.RetryAfter = time.Second
	stop := start(j)
	recv(t, "failing pass", p.calls)
	if d := recv(t, "pause", c.asked); d != time.Second {
		t.Fatalf("pause after a failure %s, want RetryAfter", d)
	}
	out := logs.String()
	if !strings.Contains(out, `msg="Test GC pass failed"`) || !strings.Contains(out, `error="api server said no"`) || !strings.Contains(out, `partial="partial 1"`) {
		t.Fatalf("log %q lacks the failure", out)
	}
	if got := r.get(); len(got) != 1 || got[0] != "last pass failed: api server said no; partial 1" {
		t.Fatalf("reports %q", got)
	}
	c.tick <- time.Time{}
	if n := recv(t, "pass after the failure", p.calls); n != 2 {
		t.Fatalf("pass %d, want 2", n)
	}
	// A success pauses for the interval again and reports its own summary.
	if d := recv(t, "pause", c.asked); d != time.Hour {
		t.Fatalf("pause after a success %s, want the interval", d)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := r.get(); got[len(got)-1] != "pass 2" {
		t.Fatalf("reports %q", got)
	}
}

// A RetryAfter longer than the interval does not stretch the pause.
func TestRetryAfterNeverLengthensThePause(t *testing.T) {
	p, c := newPasses(errors.New("x")), newClock()
	j := testJob(p, c, &testutil.SyncBuffer{}, nil)
	j.RetryAfter = 2 * time.Hour
	stop := start(j)
	recv(t, "pass", p.calls)
	if d := recv(t, "pause", c.asked); d != time.Hour {
		t.Fatalf("pause %s, want the interval", d)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// A pass cut short by the end of the term is no failure: nothing is
// logged.
func TestErrorOfACancelledPassIsNotLogged(t *testing.T) {
	logs := &testutil.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	j := Job{Name: "test-gc", Interval: time.Hour, Failed: "Test GC pass failed", Log: slog.New(slog.NewTextHandler(logs, nil)),
		Pass: func(ctx context.Context) (string, error) { cancel(); return "", ctx.Err() }}
	if err := j.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if logs.String() != "" {
		t.Fatalf("logged %q for a cancelled pass", logs.String())
	}
}

func TestTriggerRunsAPassBeforeTheInterval(t *testing.T) {
	p, c := newPasses(), newClock()
	trigger := make(chan struct{}, 1)
	j := testJob(p, c, &testutil.SyncBuffer{}, &reports{})
	j.Trigger = trigger
	stop := start(j)
	recv(t, "first pass", p.calls)
	recv(t, "pause", c.asked)
	trigger <- struct{}{} // the clock never ticks
	if n := recv(t, "triggered pass", p.calls); n != 2 {
		t.Fatalf("pass %d, want 2", n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestStartTermRunsBeforeEachTermsFirstPass(t *testing.T) {
	var order []string
	var mu sync.Mutex
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	j := Job{Name: "test-gc", Interval: time.Hour, Log: slog.New(slog.NewTextHandler(&testutil.SyncBuffer{}, nil)),
		StartTerm: func() { note("start") },
		after:     func(time.Duration) <-chan time.Time { return nil }}
	passed := make(chan struct{}, 4)
	j.Pass = func(context.Context) (string, error) { note("pass"); passed <- struct{}{}; return "", nil }
	for term := 0; term < 2; term++ {
		stop := start(j)
		recv(t, "pass", passed)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(order, ","); got != "start,pass,start,pass" {
		t.Fatalf("order %s", got)
	}
}

func TestRunRefusesAJobWithoutInterval(t *testing.T) {
	j := Job{Name: "test-gc", Pass: func(context.Context) (string, error) { t.Fatal("pass ran"); return "", nil }}
	if err := j.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "test-gc") {
		t.Fatalf("Run = %v, want an error naming the job", err)
	}
}

// elector records the jobs added to it.
type elector map[string]leader.Run

func (e elector) Add(name string, run leader.Run) { e[name] = run }

func TestRegisterSkipsADisabledJob(t *testing.T) {
	p, c := newPasses(), newClock()
	for _, interval := range []time.Duration{0, -time.Second} {
		e := elector{}
		j := testJob(p, c, &testutil.SyncBuffer{}, nil)
		j.Interval = interval
		if j.Register(e) || len(e) != 0 {
			t.Fatalf("interval %s: registered %v", interval, e)
		}
	}
	e := elector{}
	if !testJob(p, c, &testutil.SyncBuffer{}, nil).Register(e) || e["test-gc"] == nil {
		t.Fatalf("not registered: %v", e)
	}
	// What the elector runs for a term is the job's Run.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e["test-gc"](ctx) }()
	recv(t, "pass of the registered job", p.calls)
	recv(t, "pause", c.asked)
	cancel()
	if err := recv(t, "end of the term", done); err != nil {
		t.Fatal(err)
	}
}
