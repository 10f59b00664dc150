package cni_test

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedAgentPolicyDropsNamedAndFlowMetrics: real traffic through
// a real agent. b's policy (default/b-ingress) admits a, denies c by a
// deny rule, and d by default. `tendril observe` shows c's drop naming
// default/b-ingress and d's as the default deny of default/b-ingress (the
// policy selecting b); a's verdict carries its
// match type (L3-only) and a's TCP connections to b show a to-endpoint
// trace at b (delivered directly, b's to_pod never ran). The metrics
// endpoint counts the drops by policy, the verdicts by match type and the
// connect round trips to b's workload; the export file holds the drops
// only (its allow filter); `tendril status` has a Hubble section.
func TestPrivilegedAgentPolicyDropsNamedAndFlowMetrics(t *testing.T) {
	testutil.Privileged(t)
	export := filepath.Join(t.TempDir(), "export", "flows.json")
	n := startNode(t, "--ipv6-range", "none", "--prometheus-serve-addr", "127.0.0.1:9962",
		"--hubble-export-file-path", export, "--hubble-export-allowlist", `{"verdict":["DROPPED"]}`)
	list := n.confList("tendril-cni", "1.1.0", nil)
	pods := map[string]*pod{}
	ips := map[string]string{}
	for _, name := range []string{"a", "b", "c", "d"} {
		p := n.newPod(name)
		pods[name] = p
		ips[name] = n.mustAdd(list, p).IPs[0].Address.IP.String()
		n.setLabels(t, "pod-name:default/"+name, "k8s:app="+name)
	}
	n.importPolicy(t, `[{"endpointSelector":{"matchLabels":{"app":"b"}},
		"labels":["k8s:io.cilium.k8s.policy.name=b-ingress","k8s:io.cilium.k8s.policy.namespace=default"],
		"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"a"}}]}],
		"ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"c"}}]}]}]`)
	eventually(t, "c is denied", func() bool { return !reachable(pods["c"], ips["b"]) })
	if reachable(pods["d"], ips["b"]) {
		t.Fatal("d reaches b although nothing allows it")
	}
	if err := ping(pods["a"], ips["b"]); err != nil {
		t.Fatalf("a is denied although the policy allows it: %v", err)
	}
	// TCP connections from a to b: SYN and SYN-ACK for the round trip.
	ln := listenIn(t, pods["b"].netns, ips["b"]+":8080")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	const conns = 5
	for i := range conns {
		c, err := dialFrom(pods["a"].netns, ips["b"]+":8080")
		if err != nil {
			t.Fatalf("connection %d from a to b: %v", i, err)
		}
		c.Close()
	}

	cli, err := builder.Build("tendril")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(n.dir, "hubble.sock")
	observe := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(cli, append([]string{"observe", "--server", "unix://" + sock}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("tendril observe %v: %v: %s", args, err, stderr.String())
		}
		return out
	}
	parse := func(out []byte) []*flowpb.Flow {
		t.Helper()
		var flows []*flowpb.Flow
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var resp observerpb.GetFlowsResponse
			if err := protojson.Unmarshal(sc.Bytes(), &resp); err != nil {
				t.Fatalf("flow line %q: %v", sc.Text(), err)
			}
			if f := resp.GetFlow(); f != nil {
				flows = append(flows, f)
			}
		}
		return flows
	}
	from := func(f *flowpb.Flow, src, dst string) bool {
		return f.GetSource().GetPodName() == src && f.GetDestination().GetPodName() == dst
	}
	isSYN := func(f *flowpb.Flow) bool {
		fl := f.GetL4().GetTCP().GetFlags()
		return fl.GetSYN() && !fl.GetACK() && f.GetL4().GetTCP().GetDestinationPort() == 8080
	}

	// Every policy drop names its policy, or the default deny.
	var flows []*flowpb.Flow
	eventually(t, "the drops of c and d, a's verdict and its to-endpoint SYN at b are flows", func() bool {
		flows = parse(observe("--last", "2000", "-o", "json"))
		has := func(pred func(*flowpb.Flow) bool) bool { return slices.ContainsFunc(flows, pred) }
		return has(func(f *flowpb.Flow) bool { return from(f, "c", "b") && f.GetVerdict() == flowpb.Verdict_DROPPED }) &&
			has(func(f *flowpb.Flow) bool { return from(f, "d", "b") && f.GetVerdict() == flowpb.Verdict_DROPPED }) &&
			has(func(f *flowpb.Flow) bool { return from(f, "a", "b") && f.GetEventType().GetType() == 5 }) &&
			has(func(f *flowpb.Flow) bool {
				return from(f, "a", "b") && isSYN(f) && f.GetTraceObservationPoint() == flowpb.TraceObservationPoint_TO_ENDPOINT
			})
	})
	for _, f := range flows {
		switch {
		case from(f, "c", "b") && f.GetVerdict() == flowpb.Verdict_DROPPED:
			by := f.GetIngressDeniedBy()
			if f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENY || len(by) != 1 || by[0].GetNamespace() != "default" || by[0].GetName() != "b-ingress" {
				t.Errorf("c's drop: reason %s, denied by %v; want POLICY_DENY by default/b-ingress", f.GetDropReasonDesc(), by)
			}
		case from(f, "d", "b") && f.GetVerdict() == flowpb.Verdict_DROPPED:
			// The default deny, naming the policy that selects b.
			by := f.GetIngressDeniedBy()
			if f.GetDropReasonDesc() != flowpb.DropReason_POLICY_DENIED || len(by) != 1 || by[0].GetNamespace() != "default" || by[0].GetName() != "b-ingress" {
				t.Errorf("d's drop: reason %s, denied by %v; want the default deny of default/b-ingress", f.GetDropReasonDesc(), by)
			}
		case from(f, "a", "b") && f.GetEventType().GetType() == 5:
			by := f.GetIngressAllowedBy()
			if f.GetPolicyMatchType() != 1 || len(by) != 1 || by[0].GetName() != "b-ingress" {
				t.Errorf("a's verdict: match type %d (want 1, L3-only), allowed by %v", f.GetPolicyMatchType(), by)
			}
		case from(f, "a", "b") && isSYN(f) && f.GetTraceObservationPoint() == flowpb.TraceObservationPoint_TO_ENDPOINT:
			if f.GetDestination().GetID() == 0 || f.GetTrafficDirection() != flowpb.TrafficDirection_INGRESS {
				t.Errorf("to-endpoint SYN at b: destination %v, direction %s", f.GetDestination(), f.GetTrafficDirection())
			}
		}
	}
	// As people read them.
	compact := string(observe("--last", "2000", "--verdict", "DROPPED", "--to-pod", "default/b"))
	for _, want := range []string{"denied by default/b-ingress", "default deny of default/b-ingress"} {
		if !strings.Contains(compact, want) {
			t.Errorf("tendril observe of the drops lacks %q:\n%s", want, compact)
		}
	}

	// The flow metrics on the agent's metrics endpoint.
	var metrics string
	rttCount := regexp.MustCompile(`tendril_hubble_tcp_connect_rtt_seconds_count\{destination_workload="default/b",service="none"\} (\d+)`)
	eventually(t, "the connect round trips are counted", func() bool {
		out, err := inNetns(n.netns, "curl", "-sf", "http://127.0.0.1:9962/metrics")
		if err != nil {
			t.Fatalf("metrics: %v: %s", err, out)
		}
		metrics = string(out)
		m := rttCount.FindStringSubmatch(metrics)
		if m == nil {
			return false
		}
		got, _ := strconv.Atoi(m[1])
		return got >= conns
	})
	for _, want := range []string{
		`tendril_hubble_policy_drops_total{direction="ingress",policy="default/b-ingress"}`,
		`tendril_hubble_policy_drops_total{direction="ingress",policy="default deny"}`,
		`tendril_hubble_drop_total{protocol="ICMPv4",reason="POLICY_DENY"}`,
		`tendril_hubble_policy_verdicts_total{action="allowed",direction="ingress",match="l3-only"}`,
		`tendril_hubble_flows_processed_total{subtype="to-endpoint",type="trace",verdict="FORWARDED"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// The export file: c's and d's drops, nothing forwarded.
	eventually(t, "the drops are exported", func() bool {
		data, err := os.ReadFile(export)
		if err != nil {
			return false
		}
		got := parse(data)
		return slices.ContainsFunc(got, func(f *flowpb.Flow) bool { return from(f, "c", "b") }) &&
			slices.ContainsFunc(got, func(f *flowpb.Flow) bool { return from(f, "d", "b") })
	})
	data, _ := os.ReadFile(export)
	for _, f := range parse(data) {
		if f.GetVerdict() != flowpb.Verdict_DROPPED {
			t.Errorf("exported a flow the allow list excludes: %v", f)
		}
	}

	// tendril status: the Hubble section and model.
	st := n.status(t)
	if v := sectionValue(st, "Hubble", "ring"); !strings.HasSuffix(v, "/4095 flows") {
		t.Errorf("status ring %q", v)
	}
	if v := sectionValue(st, "Hubble", "export"); !strings.HasPrefix(v, export+": ") {
		t.Errorf("status export %q", v)
	}
	if v := sectionValue(st, "Hubble", "listeners"); !strings.Contains(v, "unix://"+sock) {
		t.Errorf("status listeners %q", v)
	}
	if v := sectionValue(st, "Hubble", "lost events"); !strings.HasSuffix(v, "rate-limited") {
		t.Errorf("status lost events %q", v)
	}
	if h := st.Hubble; h == nil || h.State != "Ok" || h.Observer == nil || h.Observer.SeenFlows == 0 || h.Observer.MaxFlows != 4095 {
		t.Errorf("status hubble model %+v", h)
	}
}
