package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	flowpb "github.com/cilium/cilium/api/v1/flow"
	"github.com/miekg/dns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/workload"
)

// fqdnPolicyYAML puts the client under DNS rules (world.example and the
// pattern *.example, through the cluster DNS: the DNS proxy), lets it
// reach world.example's learned addresses on 81 (L4) and those of any
// *.example name on 80 only for GET /healthz (the HTTP proxy).
const fqdnPolicyYAML = `
apiVersion: tendril.io/v1alpha1
kind: TendrilNetworkPolicy
metadata:
  name: e2e-fqdn
spec:
  endpointSelector:
    matchLabels: {app: fqdn-client}
  egress:
  - toEndpoints:
    - matchLabels:
        k8s:io.kubernetes.pod.namespace: kube-system
        k8s-app: kube-dns
    toPorts:
    - ports: [{port: "53", protocol: ANY}]
      rules:
        dns: [{matchName: world.example}, {matchPattern: "*.example"}]
  - toFQDNs: [{matchName: world.example}]
    toPorts:
    - ports: [{port: "81", protocol: TCP}]
  - toFQDNs: [{matchPattern: "*.example"}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules:
        http: [{method: GET, path: /healthz}]
`

// dnsLoadEnv makes the test binary a DNS client instead of a test run
// (started inside a pod's network namespace and its node's cgroup by
// TestPrivilegedLabFQDNPolicy): "SERVER NAME WANT COUNT INTERVAL CONNECT".
const dnsLoadEnv = "TDR_E2E_DNS_LOAD"

// dnsLoadResult is what the DNS client prints.
type dnsLoadResult struct {
	Lookups, Failed, Retried int
	// LongestGapMS is the longest time between two answered lookups
	// (by completion), in milliseconds.
	LongestGapMS int64
	// Conns are the connections to CONNECT (one every fifth lookup),
	// ConnsFailed those that got no answer.
	Conns, ConnsFailed int
	Errors             []string
}

// runDNSLoad starts one lookup of NAME (an A query to SERVER over UDP,
// each on a new socket) every INTERVAL, COUNT times, each in its own
// goroutine so a slow one does not delay the next; a lookup is tried 3
// times with a 1 s timeout (a resolver's retries) and fails when no try
// was answered with WANT. Every fifth tick it also connects to CONNECT
// (TCP, the world server's answer within 2 s). Prints the result as JSON.
func runDNSLoad(spec string) int {
	f := strings.Fields(spec)
	if len(f) != 6 {
		fmt.Fprintln(os.Stderr, "want SERVER NAME WANT COUNT INTERVAL CONNECT in", dnsLoadEnv, "got", spec)
		return 2
	}
	server, name, want, connect := f[0], dns.Fqdn(f[1]), f[2], f[5]
	count, err1 := strconv.Atoi(f[3])
	interval, err2 := time.ParseDuration(f[4])
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "bad", dnsLoadEnv, spec, err1, err2)
		return 2
	}
	var (
		mu      sync.Mutex
		res     dnsLoadResult
		answers []time.Time
		wg      sync.WaitGroup
	)
	fail := func(what string) {
		if len(res.Errors) < 20 {
			res.Errors = append(res.Errors, time.Now().Format("15:04:05.000")+" "+what)
		}
	}
	lookup := func() {
		defer wg.Done()
		c := &dns.Client{Net: "udp", Timeout: time.Second}
		var last error
		for try := 0; try < 3; try++ {
			m := new(dns.Msg).SetQuestion(name, dns.TypeA)
			in, _, err := c.Exchange(m, server)
			if err == nil && in.Rcode != dns.RcodeSuccess {
				err = fmt.Errorf("rcode %s", dns.RcodeToString[in.Rcode])
			}
			if err == nil {
				err = fmt.Errorf("no %s in %v", want, in.Answer)
				for _, rr := range in.Answer {
					if a, ok := rr.(*dns.A); ok && a.A.String() == want {
						err = nil
					}
				}
			}
			if err == nil {
				mu.Lock()
				answers = append(answers, time.Now())
				if try > 0 {
					res.Retried++
				}
				mu.Unlock()
				return
			}
			last = err
		}
		mu.Lock()
		res.Failed++
		fail("lookup: " + last.Error())
		mu.Unlock()
	}
	dial := func() {
		defer wg.Done()
		err := func() error {
			c, err := net.DialTimeout("tcp", connect, 2*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Write([]byte(workload.ProbeRequest)); err != nil {
				return err
			}
			buf := make([]byte, 256)
			n, err := c.Read(buf)
			if err != nil {
				return err
			}
			if !strings.HasPrefix(string(buf[:n]), "world") {
				return fmt.Errorf("answer %q", buf[:n])
			}
			return nil
		}()
		mu.Lock()
		if err != nil {
			res.ConnsFailed++
			fail("connect: " + err.Error())
		}
		mu.Unlock()
	}
	next := time.Now()
	for i := 0; i < count; i++ {
		time.Sleep(time.Until(next))
		next = next.Add(interval)
		wg.Add(1)
		res.Lookups++
		go lookup()
		if i%5 == 0 {
			wg.Add(1)
			res.Conns++
			go dial()
		}
	}
	wg.Wait()
	slices.SortFunc(answers, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(answers); i++ {
		if g := answers[i].Sub(answers[i-1]).Milliseconds(); g > res.LongestGapMS {
			res.LongestGapMS = g
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// TestPrivilegedLabFQDNPolicy: a pod on node1 under a toFQDNs policy with
// DNS rules and an HTTP rule, real traffic through the datapath's
// redirect to node1's DNS and HTTP proxies and the lab's CoreDNS:
//   - before any lookup the world server's address is not learned: a
//     connection to it is dropped;
//   - world.example resolves through the DNS proxy (UDP and TCP, the
//     search list's names refused on the way), and then connects on 81
//     (matchName); a name no DNS rule allows is REFUSED, with a DROPPED
//     L7 flow naming it;
//   - through the HTTP proxy (matchPattern *.example, port 80): GET
//     /healthz is answered by the world server, POST /healthz and GET
//     /other get 403, with L7 flows naming the rule or saying none did;
//   - the agent killed (kill -9) and restarted while the pod looks up
//     world.example 50 times a second and connects to it 10 times a
//     second: no lookup and no connection fails (the datapath lets DNS
//     pass while no proxy listens, the learned address stays in the
//     pinned maps), and after the restart a denied name is REFUSED again;
//   - killed and restarted again without lookups: the restarted agent
//     lists world.example from its restored cache and the learned address
//     still connects.
func TestPrivilegedLabFQDNPolicy(t *testing.T) {
	e := labUp(t)
	ctx := context.Background()
	const ns = "e2e-fqdn"
	e.createNamespace(t, ns)
	node1, err := e.st.Node("node1")
	if err != nil {
		t.Fatal(err)
	}
	e.createPod(t, ns, "client", node1.Name, map[string]string{"app": "fqdn-client"})
	e.waitReady(t, ns, "client")
	client := ns + "/client"
	worldL4 := fmt.Sprintf("%s:81", lab.WorldServerIP)
	if c := probe(t, client, worldL4, false); c != 0 {
		t.Fatalf("before the policy: %s -> %s exit %d, want 0", client, worldL4, c)
	}
	// Nothing learned before: forget what node1 may know of the zone.
	runTendril(t, "-H", "unix://"+node1.Socket, "fqdn", "cache", "clean")

	pol := &v1alpha1.TendrilNetworkPolicy{}
	if err := yaml.UnmarshalStrict([]byte(fqdnPolicyYAML), pol); err != nil {
		t.Fatal(err)
	}
	if _, err := e.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns).Delete(context.Background(), pol.Name, metav1.DeleteOptions{})
	})
	eventually(t, "the world server's address, not learned yet, dropped", func() (bool, error) {
		c := probe(t, client, worldL4, false)
		return c == 1, fmt.Errorf("exit %d", c)
	})

	relay := "unix://" + e.st.RelaySocket()
	l7Flows := func() []*flowpb.Flow {
		return hubbletest.JSONFlows(t, runTendril(t, "observe", "--server", relay, "--last", "2000", "--type", "l7", "--namespace", ns, "-o", "json"))
	}

	t.Run("lookups", func(t *testing.T) {
		for _, args := range [][]string{nil, {"--dns-tcp"}} {
			code, out := tendril(t, append([]string{"probe", client, lab.WorldName + ":81", "--timeout", "2s"}, args...)...)
			wantResolved := fmt.Sprintf("%s. is %s", lab.WorldName, lab.WorldServerIP)
			if m := peerAnswer.FindStringSubmatch(out); code != 0 || !strings.Contains(out, wantResolved) || m == nil || m[1] != "world" {
				t.Errorf("probe %s %v: exit %d, want %q and the world server's answer:\n%s", lab.WorldName, args, code, wantResolved, out)
			}
		}
		// glibc, the name rooted (a REFUSED search-list name ends glibc's
		// search: see docs/policy-l7.md).
		if code, out := tendril(t, "exec", client, "--", "getent", "ahostsv4", lab.WorldName+"."); code != 0 || !strings.HasPrefix(out, lab.WorldServerIP+" ") {
			t.Errorf("getent ahostsv4 %s.: exit %d:\n%s", lab.WorldName, code, out)
		}
		if c := probe(t, client, worldL4, false); c != 0 {
			t.Errorf("%s learned: %s exit %d, want 0", lab.WorldServerIP, worldL4, c)
		}
		// Port 82 is in no rule.
		if c := probe(t, client, lab.WorldServerIP+":82", false); c != 1 {
			t.Errorf("%s:82: exit %d, want 1", lab.WorldServerIP, c)
		}
		if err := refused(client, "denied.test."); err != nil {
			t.Error(err)
		}
		eventually(t, "a DROPPED DNS flow naming denied.test", func() (bool, error) {
			for _, f := range l7Flows() {
				if f.GetVerdict() == flowpb.Verdict_DROPPED && strings.Contains(f.GetSummary(), "denied.test") &&
					f.GetL7().GetDns().GetRcode() == uint32(dns.RcodeRefused) {
					return true, nil
				}
			}
			return false, fmt.Errorf("no such flow")
		})
		out := runTendril(t, "-H", "unix://"+node1.Socket, "fqdn", "cache", "list")
		if !strings.Contains(out, lab.WorldName) || !strings.Contains(out, lab.WorldServerIP) {
			t.Errorf("node1's FQDN cache:\n%s", out)
		}
	})

	t.Run("http", func(t *testing.T) {
		for _, c := range []struct {
			method, path string
			want         string
		}{{"GET", "/healthz", "200"}, {"POST", "/healthz", "403"}, {"GET", "/other", "403"}} {
			code, out := tendril(t, "exec", client, "--", "curl", "-sS", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}",
				"-X", c.method, "http://"+lab.WorldName+"."+c.path)
			if code != 0 || strings.TrimSpace(out) != c.want {
				t.Errorf("%s %s: exit %d, code %q, want %s", c.method, c.path, code, out, c.want)
			}
		}
		eventually(t, "HTTP flows: GET /healthz naming the rule, POST denied", func() (bool, error) {
			var allowed, denied bool
			for _, f := range l7Flows() {
				h := f.GetL7().GetHttp()
				switch {
				case h == nil:
				case h.GetMethod() == "GET" && h.GetCode() == 200 && f.GetVerdict() == flowpb.Verdict_FORWARDED && strings.Contains(f.GetSummary(), `"/healthz"`):
					allowed = true
				case h.GetMethod() == "POST" && h.GetCode() == 403 && f.GetVerdict() == flowpb.Verdict_DROPPED && strings.Contains(f.GetSummary(), "no http rule"):
					denied = true
				}
			}
			return allowed && denied, fmt.Errorf("allowed %v, denied %v", allowed, denied)
		})
	})

	t.Run("kill-9", func(t *testing.T) {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		const lookups = 750 // 15 s at 50/s
		var out, errOut bytes.Buffer
		load := exec.Command(tendrilBin, "lab", "--name", labName, "exec", client, "--", self)
		load.Env = append(os.Environ(), fmt.Sprintf("%s=%s:53 %s %s %d 20ms %s", dnsLoadEnv, lab.ClusterDNSIP, lab.WorldName, lab.WorldServerIP, lookups, worldL4))
		load.Stdout, load.Stderr = &out, &errOut
		if err := load.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		argv := killAgent(t, e.st, node1.Name)
		killed := time.Now()
		time.Sleep(2 * time.Second)
		startAgent(t, e.st, node1.Name, argv)
		waitAgentAPI(t, *node1)
		t.Logf("agent of node1 killed and answering again in %s", time.Since(killed).Round(time.Millisecond))
		if err := load.Wait(); err != nil {
			t.Fatalf("DNS client: %v\n%s%s", err, out.String(), errOut.String())
		}
		var res dnsLoadResult
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("DNS client output: %v\n%s%s", err, out.String(), errOut.String())
		}
		t.Logf("across kill -9 and restart: %d lookups, %d failed, %d answered only on a retry, longest gap between answers %d ms; %d connections, %d failed; %v",
			res.Lookups, res.Failed, res.Retried, res.LongestGapMS, res.Conns, res.ConnsFailed, res.Errors)
		if res.Lookups != lookups || res.Failed != 0 || res.ConnsFailed != 0 {
			t.Errorf("%d of %d lookups and %d of %d connections failed across the agent's kill -9", res.Failed, res.Lookups, res.ConnsFailed, res.Conns)
		}
		// The restarted proxy filters names again.
		eventually(t, "denied.test refused after the restart", func() (bool, error) {
			err := refused(client, "denied.test.")
			return err == nil, err
		})
		if c := probe(t, client, lab.WorldServerIP+":82", false); c != 1 {
			t.Errorf("after the restart, %s:82: exit %d, want 1", lab.WorldServerIP, c)
		}
	})

	t.Run("cache-restored", func(t *testing.T) {
		argv := killAgent(t, e.st, node1.Name)
		startAgent(t, e.st, node1.Name, argv)
		waitAgentAPI(t, *node1)
		// No lookup since: only the restored cache can list it.
		out := runTendril(t, "-H", "unix://"+node1.Socket, "fqdn", "cache", "list")
		if !strings.Contains(out, lab.WorldName) || !strings.Contains(out, lab.WorldServerIP) {
			t.Errorf("node1's FQDN cache after the restart:\n%s", out)
		}
		for i := range 3 {
			if c := probe(t, client, worldL4, false); c != 0 {
				t.Errorf("restart without lookups, connection %d to the learned %s: exit %d", i, worldL4, c)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})
}

// refused asks the cluster DNS, from inside pod (lab exec), for name and
// reports an error unless the answer is REFUSED.
func refused(pod, name string) error {
	out, err := exec.Command(tendrilBin, "lab", "--name", labName, "exec", pod, "--",
		"getent", "ahostsv4", name).CombinedOutput()
	// getent cannot tell REFUSED from other failures: ask with the probe's
	// resolver over TCP too, whose error names the rcode.
	if err == nil {
		return fmt.Errorf("getent ahostsv4 %s from %s answered: %s", name, pod, out)
	}
	out, err = exec.Command(tendrilBin, "lab", "--name", labName, "probe", pod, name+":80", "--timeout", "2s").CombinedOutput()
	if err == nil || !strings.Contains(strings.ToLower(string(out)), "refused") {
		return fmt.Errorf("probe %s from %s: %v, want REFUSED:\n%s", name, pod, err, out)
	}
	return nil
}
