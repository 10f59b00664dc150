package exporter

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func testFlow(i int, ns string, v flowpb.Verdict) *flowpb.Flow {
	return &flowpb.Flow{
		Time:        timestamppb.New(time.Date(2026, 11, 24, 10, 0, i, 0, time.UTC)),
		Uuid:        "flow-" + strings.Repeat("0", 3-len(itoa(i))) + itoa(i),
		Verdict:     v,
		NodeName:    "node-a",
		IP:          &flowpb.IP{Source: "10.0.0.1", Destination: "10.0.0.2"},
		Source:      &flowpb.Endpoint{Namespace: ns, PodName: "a"},
		Destination: &flowpb.Endpoint{Namespace: ns, PodName: "b"},
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	s := ""
	for ; i > 0; i /= 10 {
		s = string(rune('0'+i%10)) + s
	}
	return s
}

// readFlows reads a JSON lines file back into the flows' UUIDs.
func readFlows(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r observerpb.GetFlowsResponse
		if err := protojson.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: line %q: %v", path, sc.Text(), err)
		}
		if r.GetNodeName() != "node-a" || r.GetTime() == nil {
			t.Fatalf("%s: response without node or time: %q", path, sc.Text())
		}
		out = append(out, r.GetFlow().GetUuid())
	}
	return out
}

func lineSize(t *testing.T) int64 {
	t.Helper()
	b, err := protojson.Marshal(&observerpb.GetFlowsResponse{
		ResponseTypes: &observerpb.GetFlowsResponse_Flow{Flow: testFlow(1, "default", flowpb.Verdict_FORWARDED)},
		NodeName:      "node-a", Time: testFlow(1, "default", flowpb.Verdict_FORWARDED).Time,
	})
	if err != nil {
		t.Fatal(err)
	}
	return int64(len(b) + 1)
}

// TestRotation writes 25 flows into files of 4 lines with 2 backups: the
// current file and both backups hold the newest 9 flows, in order,
// nothing older is kept, no file exceeds the size, and nothing between
// them was lost.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "flows", "export.json")
	size := lineSize(t)
	e, err := New(Config{Path: path, MaxSizeBytes: 4 * size, MaxBackups: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 25 {
		f := testFlow(i, "default", flowpb.Verdict_FORWARDED)
		e.Export(f)
		want = append(want, f.GetUuid())
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range []string{path + ".2", path + ".1", path} {
		flows := readFlows(t, p)
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 4*size {
			t.Fatalf("%s: %d bytes, over the maximum %d", p, st.Size(), 4*size)
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v, want 0600", p, st.Mode().Perm())
		}
		got = append(got, flows...)
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Fatalf("a third backup exists (max 2): %v", err)
	}
	// 25 flows in files of 4: 6 rotations, the current file holds 1.
	want = want[len(want)-9:]
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("kept flows\n%v\nwant\n%v", got, want)
	}
	if s := e.Stats(); s.Written != 25 || s.Rotated != 6 || s.Failed != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestRotationNoBackups: with no backups the file is truncated.
func TestRotationNoBackups(t *testing.T) {
	path := filepath.Join(t.TempDir(), "export.json")
	size := lineSize(t)
	e, err := New(Config{Path: path, MaxSizeBytes: 2 * size}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		e.Export(testFlow(i, "default", flowpb.Verdict_FORWARDED))
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readFlows(t, path); strings.Join(got, ",") != "flow-004" {
		t.Fatalf("flows %v, want the last one", got)
	}
	if m, _ := filepath.Glob(path + ".*"); len(m) != 0 {
		t.Fatalf("backups %v with max backups 0", m)
	}
}

// TestReopenAppends: a restarted exporter appends and counts the size
// already there.
func TestReopenAppends(t *testing.T) {
	path := filepath.Join(t.TempDir(), "export.json")
	size := lineSize(t)
	for round := range 2 {
		e, err := New(Config{Path: path, MaxSizeBytes: 3 * size, MaxBackups: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			e.Export(testFlow(round*2+i, "default", flowpb.Verdict_FORWARDED))
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(readFlows(t, path+".1"), ","); got != "flow-000,flow-001,flow-002" {
		t.Fatalf("backup %s", got)
	}
	if got := strings.Join(readFlows(t, path), ","); got != "flow-003" {
		t.Fatalf("current %s", got)
	}
}

func TestFilters(t *testing.T) {
	allow, err := ParseFilters(`{"source_pod":["kube-system/"]} {"verdict":["DROPPED"]}`)
	if err != nil {
		t.Fatal(err)
	}
	deny, err := ParseFilters(`[{"destination_pod":["kube-system/b"]}]`)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		allow, deny []*flowpb.FlowFilter
		want        string
	}{
		{name: "no filters: every flow", want: "flow-000,flow-001,flow-002,flow-003"},
		{name: "allow list", allow: allow, want: "flow-001,flow-002,flow-003"},
		{name: "allow and deny lists", allow: allow, deny: deny, want: "flow-002"},
		{name: "deny list", deny: deny, want: "flow-000,flow-002"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "export.json")
			e, err := New(Config{Path: path, MaxSizeBytes: 1 << 20, Allow: tc.allow, Deny: tc.deny}, nil)
			if err != nil {
				t.Fatal(err)
			}
			e.Export(testFlow(0, "default", flowpb.Verdict_FORWARDED))
			e.Export(testFlow(1, "kube-system", flowpb.Verdict_FORWARDED))
			e.Export(testFlow(2, "default", flowpb.Verdict_DROPPED))
			e.Export(testFlow(3, "kube-system", flowpb.Verdict_DROPPED))
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(readFlows(t, path), ","); got != tc.want {
				t.Fatalf("exported %s, want %s", got, tc.want)
			}
		})
	}
}

func TestBadConfig(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Path: "relative.json", MaxSizeBytes: 1}, "absolute path"},
		{Config{Path: filepath.Join(dir, "x"), MaxSizeBytes: 0}, "max size"},
		{Config{Path: filepath.Join(dir, "x"), MaxSizeBytes: 1, MaxBackups: -1}, "max backups"},
		{Config{Path: filepath.Join(dir, "x"), MaxSizeBytes: 1, Allow: []*flowpb.FlowFilter{{SourceFqdn: []string{"a.example"}}}}, "export filters"},
	} {
		if _, err := New(tc.cfg, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one about %s", tc.cfg, err, tc.want)
		}
	}
	if _, err := ParseFilters(`{"source_pod": 3}`); err == nil {
		t.Error("a bad filter parsed")
	}
	if f, err := ParseFilters(""); err != nil || len(f) != 0 {
		t.Errorf("empty filters: %v %v", f, err)
	}
}

// TestRunFlushes: an exported flow reaches the file by the periodic
// flush, with writers racing the flusher.
func TestRunFlushes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "export.json")
	e, err := New(Config{Path: path, MaxSizeBytes: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); e.Run(ctx) }()
	var writers sync.WaitGroup
	for w := range 4 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range 25 {
				e.Export(testFlow(w*25+i, "default", flowpb.Verdict_FORWARDED))
			}
		}()
	}
	writers.Wait()
	for len(readFlows(t, path)) < 100 {
		select {
		case <-time.After(50 * time.Millisecond):
		case <-t.Context().Done():
			t.Fatal("flows never flushed")
		}
	}
	cancel()
	wg.Wait()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}
