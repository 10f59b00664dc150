package hubbletest

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/encoding/protojson"
)

// RunCLI runs the stock hubble CLI (bin) against server and returns its
// standard output; a failure fails the test with its output.
func RunCLI(t testing.TB, bin, server string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(args, "--server", server)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hubble %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// JSONResponses parses `hubble observe -o json` output.
func JSONResponses(t testing.TB, out string) []*observerpb.GetFlowsResponse {
	t.Helper()
	var rs []*observerpb.GetFlowsResponse
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var r observerpb.GetFlowsResponse
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("parse %q: %v", sc.Text(), err)
		}
		rs = append(rs, &r)
	}
	return rs
}

// JSONFlows is the flows of `hubble observe -o json` output.
func JSONFlows(t testing.TB, out string) []*flowpb.Flow {
	t.Helper()
	var flows []*flowpb.Flow
	for _, r := range JSONResponses(t, out) {
		if r.GetFlow() != nil {
			flows = append(flows, r.GetFlow())
		}
	}
	return flows
}
