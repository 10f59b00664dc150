package lifecycle

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/hive/cell"

	"github.com/tendril-net/tendril/pkg/health"
)

var discard = slog.New(slog.DiscardHandler)

// TestStartStopOrderAndRollback: steps start in the order appended and stop
// in reverse; after a failed start, stopping the lifecycle stops only the
// steps that started (the agent's rollback).
func TestStartStopOrderAndRollback(t *testing.T) {
	tests := []struct {
		name      string
		failAt    string
		wantCalls []string
		wantErr   string
	}{
		{
			name:      "all start, stop in reverse",
			wantCalls: []string{"start a", "start b", "start c", "stop c", "stop b", "stop a"},
		},
		{
			name:      "failure rolls back the started ones",
			failAt:    "c",
			wantCalls: []string{"start a", "start b", "start c", "stop b", "stop a"},
			wantErr:   "start c: boom",
		},
		{
			name:      "first fails, nothing to roll back",
			failAt:    "a",
			wantCalls: []string{"start a"},
			wantErr:   "start a: boom",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls []string
			lc := &cell.DefaultLifecycle{}
			steps := NewSteps(health.NewRegistry())
			for _, name := range []string{"a", "b", "c"} {
				steps.Append(lc, name, func(context.Context) error {
					calls = append(calls, "start "+name)
					if name == tt.failAt {
						return errors.New("boom")
					}
					return nil
				}, func(context.Context) error {
					calls = append(calls, "stop "+name)
					return nil
				})
			}
			err := lc.Start(discard, context.Background())
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Start error = %v, want %q", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatalf("Start: %v", err)
			}
			if err := lc.Stop(discard, context.Background()); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			if !reflect.DeepEqual(calls, tt.wantCalls) {
				t.Fatalf("calls = %v, want %v", calls, tt.wantCalls)
			}
			// A second Stop is a no-op: nothing is started any more.
			before := len(calls)
			if err := lc.Stop(discard, context.Background()); err != nil || len(calls) != before {
				t.Fatalf("second Stop ran hooks again (err %v)", err)
			}
		})
	}
}

func TestStatsRecordEveryStep(t *testing.T) {
	lc := &cell.DefaultLifecycle{}
	steps := NewSteps(health.NewRegistry())
	steps.Append(lc, "one", nil, nil)
	steps.Append(lc, "two", func(context.Context) error { return nil }, nil)
	steps.Append(lc, "three", func(context.Context) error { return errors.New("no") }, nil)
	if err := lc.Start(discard, context.Background()); err == nil {
		t.Fatal("Start succeeded although step three failed")
	}
	stats, _ := steps.Stats()
	if len(stats) != 3 || stats[0].Name != "one" || stats[1].Name != "two" || stats[2].Name != "three" || stats[2].Error != "no" {
		t.Fatalf("stats = %+v", stats)
	}
}

// TestHealthFollowsTheSteps: a step is starting until it started, ok once
// it did, failed with its error, and gone once stopped.
func TestHealthFollowsTheSteps(t *testing.T) {
	reg := health.NewRegistry()
	lc := &cell.DefaultLifecycle{}
	steps := NewSteps(reg)
	steps.Append(lc, "good", nil, nil)
	steps.Append(lc, "bad", func(context.Context) error { return errors.New("map full") }, nil)
	levels := func() map[string]string {
		out := map[string]string{}
		for _, m := range reg.All() {
			out[m.Module] = string(m.Level) + " " + m.Message
		}
		return out
	}
	if got := levels(); got["good"] != "Degraded starting" || got["bad"] != "Degraded starting" {
		t.Fatalf("before start: %v", got)
	}
	_ = lc.Start(discard, context.Background())
	if got := levels(); got["good"] != "Ok started" || got["bad"] != "Failure map full" {
		t.Fatalf("after start: %v", got)
	}
	_ = lc.Stop(discard, context.Background())
	if got := levels(); len(got) != 1 || got["bad"] == "" {
		t.Fatalf("after stop (the started step leaves, the failed one stays reported): %v", got)
	}
}

func TestStopJoinsErrorsAndGoesOn(t *testing.T) {
	lc := &cell.DefaultLifecycle{}
	steps := NewSteps(health.NewRegistry())
	var stopped []string
	for _, name := range []string{"a", "b"} {
		steps.Append(lc, name, nil, func(context.Context) error {
			stopped = append(stopped, name)
			return errors.New(name + " failed")
		})
	}
	if err := lc.Start(discard, context.Background()); err != nil {
		t.Fatal(err)
	}
	err := lc.Stop(discard, context.Background())
	if err == nil || !strings.Contains(err.Error(), "stop a: a failed") || !strings.Contains(err.Error(), "stop b: b failed") {
		t.Fatalf("Stop error = %v", err)
	}
	if !reflect.DeepEqual(stopped, []string{"b", "a"}) {
		t.Fatalf("stopped = %v", stopped)
	}
}
