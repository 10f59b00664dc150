package health

import (
	"testing"
	"time"
)

func TestOverallIsTheWorstLevel(t *testing.T) {
	clock := time.Unix(1000, 0)
	r := NewRegistry()
	r.now = func() time.Time { return clock }

	a, b := r.Reporter("a"), r.Reporter("b")
	if lvl, _ := r.Overall(); lvl != LevelDegraded {
		t.Fatalf("new modules: level %s, want Degraded (starting)", lvl)
	}
	a.OK("fine")
	b.OK("fine")
	if lvl, msg := r.Overall(); lvl != LevelOK || msg != "" {
		t.Fatalf("all ok: %s %q", lvl, msg)
	}
	clock = clock.Add(time.Minute)
	b.Failed("disk gone")
	lvl, msg := r.Overall()
	if lvl != LevelFailure || msg != "b: disk gone" {
		t.Fatalf("one failed: %s %q", lvl, msg)
	}
	all := r.All()
	if all[1].Since != clock || all[0].Since == clock {
		t.Fatalf("since-times wrong: %+v", all)
	}
	// Same level again keeps the since-time.
	clock = clock.Add(time.Minute)
	b.Failed("still gone")
	if got := r.All()[1]; got.Since == clock || got.Updated != clock {
		t.Fatalf("repeat report moved since: %+v", got)
	}
	b.Stopped()
	if lvl, _ := r.Overall(); lvl != LevelOK {
		t.Fatalf("after stop: %s", lvl)
	}
}

// TestScopeReportsJobsAsModules: a job's scope shows as "<module>/<job>"
// and leaves when closed; the module's own entry is untouched.
func TestScopeReportsJobsAsModules(t *testing.T) {
	r := NewRegistry()
	r.Reporter("datapath").OK("started")
	job := r.Scope("datapath").NewScope("job-events")
	job.Degraded("read failed", errBoom{})
	if lvl, msg := r.Overall(); lvl != LevelDegraded || msg != "datapath/job-events: read failed: boom" {
		t.Fatalf("overall = %s %q", lvl, msg)
	}
	job.OK("Running")
	job.Close()
	all := r.All()
	if len(all) != 1 || all[0].Module != "datapath" || all[0].Level != LevelOK {
		t.Fatalf("after close: %+v", all)
	}
}

type errBoom struct{}

func (errBoom) Error() string { return "boom" }
