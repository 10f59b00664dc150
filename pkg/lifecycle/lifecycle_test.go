package lifecycle

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
)

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
			lc := New(nil)
			for _, name := range []string{"a", "b", "c"} {
				lc.Append(Hook{
					Name: name,
					Start: func(context.Context) error {
						calls = append(calls, "start "+name)
						if name == tt.failAt {
							return errors.New("boom")
						}
						return nil
					},
					Stop: func(context.Context) error {
						calls = append(calls, "stop "+name)
						return nil
					},
				})
			}
			err := lc.Start(context.Background())
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Start error = %v, want %q", err, tt.wantErr)
				}
			} else {
				if err != nil {
					t.Fatalf("Start: %v", err)
				}
				if err := lc.Stop(context.Background()); err != nil {
					t.Fatalf("Stop: %v", err)
				}
			}
			if !reflect.DeepEqual(calls, tt.wantCalls) {
				t.Fatalf("calls = %v, want %v", calls, tt.wantCalls)
			}
			// A second Stop is a no-op: nothing is started any more.
			before := len(calls)
			if err := lc.Stop(context.Background()); err != nil || len(calls) != before {
				t.Fatalf("second Stop ran hooks again (err %v)", err)
			}
		})
	}
}

func TestStatsRecordEveryStep(t *testing.T) {
	lc := New(nil)
	lc.Append(Hook{Name: "one"})
	lc.Append(Hook{Name: "two", Start: func(context.Context) error { return nil }})
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stats, total := lc.Stats()
	if len(stats) != 2 || stats[0].Name != "one" || stats[1].Name != "two" {
		t.Fatalf("stats = %+v", stats)
	}
	if total <= 0 {
		t.Fatalf("total = %v, want > 0", total)
	}
}

func TestStopJoinsErrorsAndGoesOn(t *testing.T) {
	lc := New(nil)
	var stopped []string
	for _, name := range []string{"a", "b"} {
		lc.Append(Hook{Name: name, Stop: func(context.Context) error {
			stopped = append(stopped, name)
			return errors.New(name + " failed")
		}})
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	err := lc.Stop(context.Background())
	if err == nil || !strings.Contains(err.Error(), "stop a: a failed") || !strings.Contains(err.Error(), "stop b: b failed") {
		t.Fatalf("Stop error = %v", err)
	}
	if !reflect.DeepEqual(stopped, []string{"b", "a"}) {
		t.Fatalf("stopped = %v", stopped)
	}
}
