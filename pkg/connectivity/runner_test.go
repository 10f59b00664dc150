package connectivity

import (
	"bytes"
	"context"
	"errors"
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
	return errors.New("i/o timeout")
}

func (f *fakeProber) Probe(_ context.Context, pod, addr string, udp bool, _ time.Duration) error {
	return f.outcome(pod + ">" + addr)
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
	r := &Runner{Prober: p, Out: &out, ProbeTimeout: time.Millisecond, Settle: 2 * time.Second}
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
	if res[3].Attempts != 3 {
		t.Fatalf("late policy: %d attempts, want 3", res[3].Attempts)
	}
	if !strings.Contains(out.String(), "[5/4] never connects") || !strings.Contains(out.String(), "FAILED") {
		t.Fatalf("progress lines:\n%s", out.String())
	}
	var table bytes.Buffer
	PrintTable(&table, res)
	for _, want := range []string{"CHECK", "PASS", "FAIL: i/o timeout", "5 checks: 4 passed, 1 failed"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}
