package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

// webPolicyYAML: HTTP rules on the ingress of the pod web (port 80, GET
// /healthz from the client only), and the client's egress to it (L4).
const webPolicyYAML = `
apiVersion: tendril.io/v1alpha1
kind: TendrilNetworkPolicy
metadata:
  name: e2e-fqdn-web
spec:
  endpointSelector:
    matchLabels: {app: fqdn-web}
  ingress:
  - fromEndpoints: [{matchLabels: {app: fqdn-client}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules:
        http: [{method: GET, path: /healthz}]
`

// webFromHostYAML: HTTP rules on web's port 80 for the node itself (GET
// /healthz), which reaches the ingress proxy through the hairpin device
// (docs/policy-l7.md, "The node as a source").
const webFromHostYAML = `
apiVersion: tendril.io/v1alpha1
kind: TendrilNetworkPolicy
metadata:
  name: e2e-fqdn-web-host
spec:
  endpointSelector:
    matchLabels: {app: fqdn-web}
  ingress:
  - fromEntities: [host]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules:
        http: [{method: GET, path: /healthz}]
`

// clientToWebHTTPYAML: the client's egress to web's port 80 with HTTP rules
// of its own: GET /healthz only with the header X-Egress: yes, and POST
// /healthz. With webPolicyYAML (GET /healthz on web's ingress) the flow has
// both egress and ingress HTTP rules, which the egress proxy applies
// together (docs/policy-l7.md, "Egress and ingress rules on one flow").
const clientToWebHTTPYAML = `
apiVersion: tendril.io/v1alpha1
kind: TendrilNetworkPolicy
metadata:
  name: e2e-fqdn-client-web
spec:
  endpointSelector:
    matchLabels: {app: fqdn-client}
  egress:
  - toEndpoints: [{matchLabels: {app: fqdn-web}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules:
        http:
        - {method: GET, path: /healthz, headers: ["X-Egress: yes"]}
        - {method: POST, path: /healthz}
`

const clientToWebYAML = `
apiVersion: tendril.io/v1alpha1
kind: TendrilNetworkPolicy
metadata:
  name: e2e-fqdn-client-web
spec:
  endpointSelector:
    matchLabels: {app: fqdn-client}
  egress:
  - toEndpoints: [{matchLabels: {app: fqdn-web}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
`

// web3PolicyYAML admits only the FQDN client at web3's port 80, at L4;
// clientToWeb3YAML sends the client's flows there through the HTTP proxy
// (TestPrivilegedLabFQDNPolicy/egress-http-remote-identity).
const web3PolicyYAML = `
apiVersion: tendril.io/v1alpha1
kind: TendrilNetworkPolicy
metadata:
  name: e2e-fqdn-web3
spec:
  endpointSelector:
    matchLabels: {app: fqdn-web3}
  ingress:
  - fromEndpoints: [{matchLabels: {app: fqdn-client}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
`

const clientToWeb3YAML = `
apiVersion: tendril.io/v1alpha1
kind: TendrilNetworkPolicy
metadata:
  name: e2e-fqdn-client-web3
spec:
  endpointSelector:
    matchLabels: {app: fqdn-client}
  egress:
  - toEndpoints: [{matchLabels: {app: fqdn-web3}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules:
        http: [{method: GET, path: /healthz}]
`

// dnsLoadEnv makes the test binary a DNS client instead of a test run
// (started inside a pod's network namespace and its node's cgroup by
// TestPrivilegedLabFQDNPolicy): "SERVER NAME WANT COUNT INTERVAL CONNECT
// DENIED".
const dnsLoadEnv = "TDR_E2E_DNS_LOAD"

// httpLoadEnv makes the test binary an HTTP client instead of a test run:
// "URL COUNT [new|keepalive [CLIENTS]]", COUNT GETs of URL one after the
// other, each on a new connection, or with "keepalive" on one kept-alive
// connection; CLIENTS clients side by side share the COUNT.
const httpLoadEnv = "TDR_E2E_HTTP_LOAD"

// httpLoadResult is what the HTTP client prints.
type httpLoadResult struct {
	Requests, Failed int
	PerSecond        float64
	P50US, P99US     int64
}

// runHTTPLoad is the HTTP client of httpLoadEnv; it prints the result as
// JSON.
func runHTTPLoad(spec string) int {
	f := strings.Fields(spec)
	keepAlive, clients := false, 1
	if len(f) >= 3 && (f[2] == "keepalive" || f[2] == "new") {
		keepAlive = f[2] == "keepalive"
		if len(f) == 4 {
			n, err := strconv.Atoi(f[3])
			if err != nil || n < 1 {
				fmt.Fprintln(os.Stderr, "bad CLIENTS in", httpLoadEnv, "got", spec)
				return 2
			}
			clients, f = n, f[:3]
		}
		f = f[:2]
	}
	count, err := strconv.Atoi(f[len(f)-1])
	if len(f) != 2 || err != nil {
		fmt.Fprintln(os.Stderr, "want URL COUNT [new|keepalive [CLIENTS]] in", httpLoadEnv, "got", spec)
		return 2
	}
	// Each client its own connection(s), COUNT requests in all.
	var mu sync.Mutex
	var res httpLoadResult
	var lat []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for i := range clients {
		n := count / clients
		if i < count%clients {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 1}}
			for range n {
				t0 := time.Now()
				resp, err := c.Get(f[0])
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				d := time.Since(t0)
				mu.Lock()
				res.Requests++
				if err != nil {
					res.Failed++
				} else {
					lat = append(lat, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.PerSecond = float64(len(lat)) / time.Since(start).Seconds()
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		res.P50US, res.P99US = lat[n/2].Microseconds(), lat[n*99/100].Microseconds()
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// dnsLoadResult is what the DNS client prints.
type dnsLoadResult struct {
	Lookups, Failed, Retried int
	// LongestGapMS is the longest time between two answered lookups
	// (by completion), in milliseconds.
	LongestGapMS int64
	// Conns are the connections to CONNECT (one every fifth lookup),
	// ConnsFailed those that got no answer.
	Conns, ConnsFailed int
	// Refused are the tries of NAME answered REFUSED: the DNS proxy
	// refusing a name the pod's rules allow.
	Refused int
	// DeniedLookups are the lookups of DENIED (a name no DNS rule allows,
	// one try each, every fifth tick), DeniedAnswered those answered with
	// an address (the proxy refuses them, and while no proxy listens the
	// datapath's DNS fallback does), DeniedConnected the
	// connections to such an address's port 443 that got through (the
	// policy allows none).
	DeniedLookups, DeniedAnswered, DeniedConnected int
	// P50US and P99US are the latencies of the lookups answered at the
	// first try, in microseconds.
	P50US, P99US int64
	Errors       []string
}

// runDNSLoad starts one lookup of NAME (an A query to SERVER over UDP,
// each on a new socket) every INTERVAL, COUNT times, each in its own
// goroutine so a slow one does not delay the next; a lookup is tried 3
// times with a 1 s timeout (a resolver's retries) and fails when no try
// was answered with WANT. Every fifth tick it also connects to CONNECT
// (TCP, the world server's answer within 2 s) and looks up DENIED once,
// connecting to its answer's port 443 (CONNECT or DENIED "-": not
// done). Prints the result as JSON.
func runDNSLoad(spec string) int {
	f := strings.Fields(spec)
	if len(f) != 7 {
		fmt.Fprintln(os.Stderr, "want SERVER NAME WANT COUNT INTERVAL CONNECT DENIED in", dnsLoadEnv, "got", spec)
		return 2
	}
	server, name, want, connect, denied := f[0], dns.Fqdn(f[1]), f[2], f[5], dns.Fqdn(f[6])
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
		firsts  []time.Duration
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
			in, rtt, err := c.Exchange(m, server)
			if err == nil && in.Rcode != dns.RcodeSuccess {
				err = fmt.Errorf("rcode %s", dns.RcodeToString[in.Rcode])
				if in.Rcode == dns.RcodeRefused {
					mu.Lock()
					res.Refused++
					mu.Unlock()
				}
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
				} else {
					firsts = append(firsts, rtt)
				}
				mu.Unlock()
				return
			}
			last = err
			mu.Lock()
			fail(fmt.Sprintf("lookup try %d: %v", try, err))
			mu.Unlock()
		}
		mu.Lock()
		res.Failed++
		fail("lookup failed: " + last.Error())
		mu.Unlock()
	}
	deniedLookup := func() {
		defer wg.Done()
		c := &dns.Client{Net: "udp", Timeout: time.Second}
		in, _, err := c.Exchange(new(dns.Msg).SetQuestion(denied, dns.TypeA), server)
		if err != nil || in.Rcode != dns.RcodeSuccess {
			return
		}
		for _, rr := range in.Answer {
			a, ok := rr.(*dns.A)
			if !ok {
				continue
			}
			mu.Lock()
			res.DeniedAnswered++
			mu.Unlock()
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(a.A.String(), "443"), time.Second)
			if err == nil {
				conn.Close()
				mu.Lock()
				res.DeniedConnected++
				fail("connected to denied " + a.A.String())
				mu.Unlock()
			}
			return
		}
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
		if i%5 == 0 && connect != "-" {
			wg.Add(1)
			res.Conns++
			go dial()
		}
		if i%5 == 0 && denied != "-." {
			wg.Add(1)
			res.DeniedLookups++
			go deniedLookup()
		}
	}
	wg.Wait()
	slices.SortFunc(answers, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(answers); i++ {
		if g := answers[i].Sub(answers[i-1]).Milliseconds(); g > res.LongestGapMS {
			res.LongestGapMS = g
		}
	}
	slices.Sort(firsts)
	if n := len(firsts); n > 0 {
		res.P50US, res.P99US = firsts[n/2].Microseconds(), firsts[n*99/100].Microseconds()
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
	// applyPolicies creates the policies of docs in ns until t ends.
	applyPolicies := func(t *testing.T, docs ...string) {
		t.Helper()
		for _, doc := range docs {
			p := &v1alpha1.TendrilNetworkPolicy{}
			if err := yaml.UnmarshalStrict([]byte(doc), p); err != nil {
				t.Fatal(err)
			}
			if _, err := e.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = e.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{})
			})
		}
	}
	// clientCurl is an HTTP request from the client pod to base+path:
	// curl's exit code and the HTTP status it printed.
	clientCurl := func(t *testing.T, base string) func(method, path string) (int, string) {
		return func(method, path string) (int, string) {
			code, out := tendril(t, "exec", client, "--", "curl", "-sS", "-m", "3", "-o", "/dev/null", "-w", "%{http_code}", "-X", method, base+path)
			return code, strings.TrimSpace(out)
		}
	}
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
		// glibc, the name rooted: one query, not first the search list's
		// names (which no DNS rule allows: refused).
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

	t.Run("ingress-http", func(t *testing.T) {
		// HTTP rules on a pod's own port: the client on the same node goes
		// through node1's HTTP proxy (its from_pod assigns the flow); a
		// pod of the same node without the client's identity, and one of
		// another node without it, cannot connect.
		e.createPod(t, ns, "web", node1.Name, map[string]string{"app": "fqdn-web"})
		web := e.waitReady(t, ns, "web")
		applyPolicies(t, webPolicyYAML, clientToWebYAML)
		webURL := "http://" + web.Status.PodIP
		curl := clientCurl(t, webURL)
		eventually(t, "GET /healthz to web answered 200 through the ingress proxy", func() (bool, error) {
			code, out := curl("GET", "/healthz")
			return code == 0 && out == "200", fmt.Errorf("exit %d, %q", code, out)
		})
		if code, out := curl("POST", "/healthz"); code != 0 || out != "403" {
			t.Errorf("POST /healthz to web: exit %d, code %q, want 403", code, out)
		}
		// Keep-alive is not checked here: the lab workload closes each
		// connection after its answer (TestPrivilegedIngressRedirectRealTraffic
		// checks it, pkg/l7redirect).
		plain := "default/" + e.labPodOn(t, node1.Name).Name
		if c := probe(t, plain, web.Status.PodIP+":80", false); c != 1 {
			t.Errorf("%s (not the client's identity) -> web:80: exit %d, want 1", plain, c)
		}
		for _, n := range e.st.Nodes {
			if n.Name == node1.Name {
				continue
			}
			other := "default/" + e.labPodOn(t, n.Name).Name
			if c := probe(t, other, web.Status.PodIP+":80", false); c != 1 {
				t.Errorf("%s on %s -> web:80: exit %d, want 1 (not the client's identity)", other, n.Name, c)
			}
			break
		}
		eventually(t, "ingress HTTP flows: GET /healthz naming the rule, POST denied", func() (bool, error) {
			var allowed, denied bool
			for _, f := range l7Flows() {
				h := f.GetL7().GetHttp()
				if h == nil || f.GetTrafficDirection() != flowpb.TrafficDirection_INGRESS || f.GetIP().GetDestination() != web.Status.PodIP {
					continue
				}
				switch {
				case h.GetMethod() == "GET" && h.GetCode() == 200 && f.GetVerdict() == flowpb.Verdict_FORWARDED && strings.Contains(f.GetSummary(), `"/healthz"`):
					allowed = true
				case h.GetMethod() == "POST" && h.GetCode() == 403 && f.GetVerdict() == flowpb.Verdict_DROPPED:
					denied = true
				}
			}
			return allowed && denied, fmt.Errorf("allowed %v, denied %v", allowed, denied)
		})

		// Both rule sets on one flow: the client's egress to web gets HTTP
		// rules of its own (replacing its L4 allow). node1's egress proxy
		// applies them with web's ingress rules: GET /healthz with the
		// header both allow (200), without it only the egress denies
		// (403), POST only the ingress denies (403); the flows name the
		// side. The proxy's marked upstream reaches web, whose policy does
		// not admit the node.
		{
			pc := e.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns)
			cur, err := pc.Get(ctx, "e2e-fqdn-client-web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			p := &v1alpha1.TendrilNetworkPolicy{}
			if err := yaml.UnmarshalStrict([]byte(clientToWebHTTPYAML), p); err != nil {
				t.Fatal(err)
			}
			cur.Spec = p.Spec
			if _, err := pc.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		curlH := func(method, path string, header ...string) (int, string) {
			args := []string{"exec", client, "--", "curl", "-sS", "-m", "3", "-o", "/dev/null", "-w", "%{http_code}", "-X", method}
			for _, h := range header {
				args = append(args, "-H", h)
			}
			code, out := tendril(t, append(args, webURL+path)...)
			return code, strings.TrimSpace(out)
		}
		eventually(t, "GET /healthz with X-Egress to web answered 200 through both rule sets", func() (bool, error) {
			code, out := curlH("GET", "/healthz", "X-Egress: yes")
			return code == 0 && out == "200", fmt.Errorf("exit %d, %q", code, out)
		})
		if code, out := curlH("GET", "/healthz"); code != 0 || out != "403" {
			t.Errorf("GET /healthz without X-Egress (the egress denies): exit %d, code %q, want 403", code, out)
		}
		if code, out := curlH("POST", "/healthz", "X-Egress: yes"); code != 0 || out != "403" {
			t.Errorf("POST /healthz (the ingress denies): exit %d, code %q, want 403", code, out)
		}
		eventually(t, "flows of both rule sets: INGRESS and EGRESS for the GET, the side of each denial", func() (bool, error) {
			var inAllowed, outAllowed, inDenied, outDenied bool
			for _, f := range l7Flows() {
				h := f.GetL7().GetHttp()
				if h == nil || f.GetIP().GetDestination() != web.Status.PodIP {
					continue
				}
				sum, dir, v := f.GetSummary(), f.GetTrafficDirection(), f.GetVerdict()
				switch {
				case dir == flowpb.TrafficDirection_INGRESS && v == flowpb.Verdict_FORWARDED && h.GetCode() == 200 && strings.Contains(sum, "destination's ingress http rule"):
					inAllowed = true
				case dir == flowpb.TrafficDirection_EGRESS && v == flowpb.Verdict_FORWARDED && h.GetCode() == 200 && strings.Contains(sum, "X-Egress"):
					outAllowed = true
				case dir == flowpb.TrafficDirection_INGRESS && v == flowpb.Verdict_DROPPED && h.GetMethod() == "POST" && strings.Contains(sum, "destination's ingress"):
					inDenied = true
				case dir == flowpb.TrafficDirection_EGRESS && v == flowpb.Verdict_DROPPED && h.GetMethod() == "GET" && strings.Contains(sum, "source's egress"):
					outDenied = true
				}
			}
			return inAllowed && outAllowed && inDenied && outDenied, fmt.Errorf("ingress allowed %v, egress allowed %v, ingress denied %v, egress denied %v",
				inAllowed, outAllowed, inDenied, outDenied)
		})

		// The node itself (curl in node1's namespace): no rule admits the
		// host yet, so nothing connects; with HTTP rules for the host on
		// port 80, node1's to_pod sends the flow through the hairpin device
		// to the ingress proxy: GET 200, POST 403, INGRESS flows from the
		// host identity. With the objects from before the hairpin, to_pod
		// dropped the node's SYN and the GET timed out.
		nodeCurl := func(method, path string) (int, string) {
			out, err := exec.Command("nsenter", "--net="+lab.NetnsPath(node1.Netns), "curl", "-sS", "-m", "3", "-o", "/dev/null",
				"-w", "%{http_code}", "-X", method, webURL+path).CombinedOutput()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			return code, strings.TrimSpace(string(out))
		}
		if code, out := nodeCurl("GET", "/healthz"); code == 0 || strings.HasSuffix(out, "200") {
			t.Errorf("node1 -> web:80 before any rule admits the host: exit %d, %q, want a failed connection", code, out)
		}
		applyPolicies(t, webFromHostYAML)
		eventually(t, "GET /healthz from node1 to web answered 200 through the hairpin and the ingress proxy", func() (bool, error) {
			code, out := nodeCurl("GET", "/healthz")
			return code == 0 && out == "200", fmt.Errorf("exit %d, %q", code, out)
		})
		if code, out := nodeCurl("POST", "/healthz"); code != 0 || out != "403" {
			t.Errorf("POST /healthz from node1 to web: exit %d, code %q, want 403", code, out)
		}
		eventually(t, "ingress HTTP flows from the host: GET /healthz naming the rule, POST denied", func() (bool, error) {
			var allowed, denied bool
			for _, f := range l7Flows() {
				h := f.GetL7().GetHttp()
				if h == nil || f.GetTrafficDirection() != flowpb.TrafficDirection_INGRESS || f.GetIP().GetDestination() != web.Status.PodIP ||
					f.GetSource().GetIdentity() != 1 {
					continue
				}
				switch {
				case h.GetMethod() == "GET" && h.GetCode() == 200 && f.GetVerdict() == flowpb.Verdict_FORWARDED && strings.Contains(f.GetSummary(), `"/healthz"`):
					allowed = true
				case h.GetMethod() == "POST" && h.GetCode() == 403 && f.GetVerdict() == flowpb.Verdict_DROPPED:
					denied = true
				}
			}
			return allowed && denied, fmt.Errorf("allowed %v, denied %v", allowed, denied)
		})
	})

	t.Run("ingress-http-remote", func(t *testing.T) {
		// The same rules on a pod of node2, the client on node1 (native
		// routing): node2's from_netdev hands the client's flow to node2's
		// ingress HTTP proxy, which takes the client's identity from the
		// flow's conntrack entry (bpf/lib/l7ingress.h). GET 200, POST 403
		// with INGRESS flows (the GET's naming the rule); a pod of node1
		// without the client's identity cannot connect.
		node2, err := e.st.Node("node2")
		if err != nil {
			t.Fatal(err)
		}
		e.createPod(t, ns, "web2", node2.Name, map[string]string{"app": "fqdn-web"})
		web := e.waitReady(t, ns, "web2")
		applyPolicies(t, webPolicyYAML, clientToWebYAML)
		webURL := "http://" + web.Status.PodIP
		curl := clientCurl(t, webURL)
		eventually(t, "GET /healthz to web2 on node2 answered 200 through node2's ingress proxy", func() (bool, error) {
			code, out := curl("GET", "/healthz")
			return code == 0 && out == "200", fmt.Errorf("exit %d, %q", code, out)
		})
		if code, out := curl("POST", "/healthz"); code != 0 || out != "403" {
			t.Errorf("POST /healthz to web2: exit %d, code %q, want 403", code, out)
		}
		plain := "default/" + e.labPodOn(t, node1.Name).Name
		if c := probe(t, plain, web.Status.PodIP+":80", false); c != 1 {
			t.Errorf("%s on node1 (not the client's identity) -> web2:80: exit %d, want 1", plain, c)
		}
		eventually(t, "node2's ingress HTTP flows: GET /healthz naming the rule, POST denied", func() (bool, error) {
			var allowed, denied bool
			for _, f := range l7Flows() {
				h := f.GetL7().GetHttp()
				if h == nil || f.GetTrafficDirection() != flowpb.TrafficDirection_INGRESS || f.GetIP().GetDestination() != web.Status.PodIP {
					continue
				}
				switch {
				case h.GetMethod() == "GET" && h.GetCode() == 200 && f.GetVerdict() == flowpb.Verdict_FORWARDED && strings.Contains(f.GetSummary(), `"/healthz"`):
					allowed = true
				case h.GetMethod() == "POST" && h.GetCode() == 403 && f.GetVerdict() == flowpb.Verdict_DROPPED:
					denied = true
				}
			}
			return allowed && denied, fmt.Errorf("allowed %v, denied %v", allowed, denied)
		})
	})

	t.Run("egress-http-remote-identity", func(t *testing.T) {
		// The client's egress HTTP rules towards a pod of node2 whose
		// ingress admits only the client's labels (L4, no HTTP rules):
		// node1's HTTP proxy connects from the client's own address and
		// port (docs/policy-l7.md, "The pod's identity upstream"), so
		// node2 sees the client's identity, not node1's. GET 200 through
		// node1's egress proxy, POST 403 there; a pod of node1 without the
		// client's identity cannot connect. With the proxy connecting from
		// node1's address, node2 dropped it and the GET timed out.
		node2, err := e.st.Node("node2")
		if err != nil {
			t.Fatal(err)
		}
		e.createPod(t, ns, "web3", node2.Name, map[string]string{"app": "fqdn-web3"})
		web := e.waitReady(t, ns, "web3")
		applyPolicies(t, web3PolicyYAML, clientToWeb3YAML)
		webURL := "http://" + web.Status.PodIP
		curl := clientCurl(t, webURL)
		eventually(t, "GET /healthz to web3 on node2 answered 200 through node1's egress proxy, as the client", func() (bool, error) {
			code, out := curl("GET", "/healthz")
			return code == 0 && out == "200", fmt.Errorf("exit %d, %q", code, out)
		})
		if code, out := curl("POST", "/healthz"); code != 0 || out != "403" {
			t.Errorf("POST /healthz to web3: exit %d, code %q, want 403 from node1's egress proxy", code, out)
		}
		plain := "default/" + e.labPodOn(t, node1.Name).Name
		if c := probe(t, plain, web.Status.PodIP+":80", false); c != 1 {
			t.Errorf("%s on node1 (not the client's identity) -> web3:80: exit %d, want 1", plain, c)
		}
		eventually(t, "node1's egress HTTP flow of the GET to web3", func() (bool, error) {
			for _, f := range l7Flows() {
				h := f.GetL7().GetHttp()
				if h != nil && f.GetTrafficDirection() == flowpb.TrafficDirection_EGRESS && f.GetIP().GetDestination() == web.Status.PodIP &&
					h.GetMethod() == "GET" && h.GetCode() == 200 && f.GetVerdict() == flowpb.Verdict_FORWARDED {
					return true, nil
				}
			}
			return false, fmt.Errorf("none yet")
		})
	})

	t.Run("latency", func(t *testing.T) {
		// The redirected pod against a pod of the same node under no
		// policy (its queries go to CoreDNS directly), alternating.
		plain := "default/" + e.labPodOn(t, node1.Name).Name
		for round := range 2 {
			for _, pod := range []string{client, plain} {
				res := dnsLoad(t, pod, 250, "-", "-", nil)
				t.Logf("round %d, %s: %d lookups at 50/s, %d failed, %d retried; first-try latency p50 %d µs, p99 %d µs", round, pod, res.Lookups, res.Failed, res.Retried, res.P50US, res.P99US)
				if res.Failed != 0 {
					t.Errorf("%s: %d lookups failed: %v", pod, res.Failed, res.Errors)
				}
			}
		}
	})

	t.Run("http-latency", func(t *testing.T) {
		// The same world server and pod: port 80 through the HTTP proxy
		// (its L7 rule allows GET /healthz), port 81 L4 only; alternating;
		// a new connection a request, then all on one kept-alive
		// connection (the proxy keeps its upstream connection too).
		for round := range 2 {
			for _, load := range []struct {
				port int
				mode string
			}{{80, "new"}, {81, "new"}, {80, "keepalive"}, {81, "keepalive"}, {80, "keepalive 8"}, {81, "keepalive 8"}} {
				port := load.port
				requests := 300
				if strings.Contains(load.mode, " ") {
					requests = 1600 // 8 clients, 200 each
				}
				url := fmt.Sprintf("http://%s:%d/healthz", lab.WorldServerIP, port)
				self, err := os.Executable()
				if err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command(tendrilBin, "lab", "--name", labName, "exec", client, "--", self)
				cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %s", httpLoadEnv, url, requests, load.mode))
				out, err := cmd.Output()
				var res httpLoadResult
				if err == nil {
					err = json.Unmarshal(out, &res)
				}
				if err != nil {
					t.Fatalf("HTTP client: %v\n%s", err, out)
				}
				t.Logf("round %d, port %d, %s connection: %d requests, %d failed, %.0f/s, p50 %d µs, p99 %d µs", round, port, load.mode, res.Requests, res.Failed, res.PerSecond, res.P50US, res.P99US)
				if res.Failed != 0 {
					t.Errorf("port %d: %d of %d requests failed", port, res.Failed, res.Requests)
				}
			}
		}
	})

	t.Run("kill-9", func(t *testing.T) {
		const lookups = 750 // 15 s at 50/s
		res := dnsLoad(t, client, lookups, worldL4, deniedName, func() {
			time.Sleep(3 * time.Second)
			argv := killAgent(t, e.st, node1.Name)
			killed := time.Now()
			time.Sleep(2 * time.Second)
			started := time.Now()
			startAgent(t, e.st, node1.Name, argv)
			waitAgentAPI(t, *node1)
			t.Logf("agent of node1 killed at %s, started at %s, API answering %s after the kill", killed.Format("15:04:05.000"), started.Format("15:04:05.000"), time.Since(killed).Round(time.Millisecond))
		})
		t.Logf("across kill -9 and restart: %d lookups, %d failed, %d answered only on a retry, %d tries REFUSED, longest gap between answers %d ms; %d connections, %d failed; %s: %d lookups, %d answered, %d connected; %v",
			res.Lookups, res.Failed, res.Retried, res.Refused, res.LongestGapMS, res.Conns, res.ConnsFailed, deniedName, res.DeniedLookups, res.DeniedAnswered, res.DeniedConnected, res.Errors)
		logAgentSteps(t, e.st, node1.Name)
		if res.Lookups != lookups || res.Failed != 0 || res.ConnsFailed != 0 {
			t.Errorf("%d of %d lookups and %d of %d connections failed across the agent's kill -9", res.Failed, res.Lookups, res.ConnsFailed, res.Conns)
		}
		if res.Refused != 0 {
			t.Errorf("%s, which the pod's DNS rules allow, REFUSED %d times across the restart", lab.WorldName, res.Refused)
		}
		if res.DeniedConnected != 0 {
			t.Errorf("%d connections to the addresses of %s, which no rule allows, got through", res.DeniedConnected, deniedName)
		}
		// While no proxy listens the datapath's DNS fallback filters the
		// names (docs/policy-l7.md, "No proxy listening").
		if res.DeniedLookups == 0 || res.DeniedAnswered != 0 {
			t.Errorf("%s, which no DNS rule allows, answered with an address %d times of %d lookups across the kill -9", deniedName, res.DeniedAnswered, res.DeniedLookups)
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
		// Back with the DNS proxy on a fixed port (Cilium's flag).
		startAgent(t, e.st, node1.Name, append(slices.Clone(argv), "--tofqdns-proxy-port", strconv.Itoa(fixedDNSProxyPort)))
		t.Cleanup(func() {
			killAgent(t, e.st, node1.Name)
			startAgent(t, e.st, node1.Name, argv)
			waitAgentAPI(t, *node1)
		})
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
		// The proxy listens on the port given, and filters names.
		for _, proto := range []string{"-Hlun", "-Hltn"} {
			out, err := exec.Command("nsenter", "--net="+lab.NetnsPath(node1.Netns), "ss", proto, fmt.Sprintf("sport = :%d", fixedDNSProxyPort)).CombinedOutput()
			if err != nil || !strings.Contains(string(out), fmt.Sprintf(":%d", fixedDNSProxyPort)) {
				t.Errorf("ss %s on node1: nothing on port %d (%v):\n%s", proto, fixedDNSProxyPort, err, out)
			}
		}
		eventually(t, "denied.test refused by the proxy on its fixed port", func() (bool, error) {
			err := refused(client, "denied.test.")
			return err == nil, err
		})
	})
}

// dnsLoad runs the test binary as a DNS client (runDNSLoad) in pod:
// count lookups of the world's name at 50/s through the cluster DNS,
// with connect and denied as runDNSLoad takes them; during runs while it
// does (nil: nothing).
func dnsLoad(t *testing.T, pod string, count int, connect, denied string, during func()) dnsLoadResult {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	load := exec.Command(tendrilBin, "lab", "--name", labName, "exec", pod, "--", self)
	load.Env = append(os.Environ(), fmt.Sprintf("%s=%s:53 %s %s %d 20ms %s %s", dnsLoadEnv, lab.ClusterDNSIP, lab.WorldName, lab.WorldServerIP, count, connect, denied))
	load.Stdout, load.Stderr = &out, &errOut
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	if during != nil {
		during()
	}
	if err := load.Wait(); err != nil {
		t.Fatalf("DNS client in %s: %v\n%s%s", pod, err, out.String(), errOut.String())
	}
	var res dnsLoadResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("DNS client output: %v\n%s%s", err, out.String(), errOut.String())
	}
	if res.Lookups != count {
		t.Fatalf("DNS client in %s: %d lookups, want %d", pod, res.Lookups, count)
	}
	return res
}

// deniedName is a name the cluster DNS answers that the test's DNS rules
// do not allow and whose address (the kubernetes Service) its policy
// does not let the pod reach.
const deniedName = "kubernetes.default.svc.cluster.local"

// fixedDNSProxyPort is the --tofqdns-proxy-port the test gives node1's
// agent.
const fixedDNSProxyPort = 10053

// logAgentSteps logs, from a node's agent log, the last lines naming the
// start steps around the proxies (the hive logs each hook with its
// duration) and the FQDN cache's restore.
func logAgentSteps(t *testing.T, st *lab.State, node string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(st.LogDir(), "agent-"+node+".log"))
	if err != nil {
		t.Log(err)
		return
	}
	lines := strings.Split(string(raw), "\n")
	for _, pat := range []string{"Restored the FQDN cache", "l7-proxies", "L7 proxies", "regenerate-restored"} {
		for i := len(lines) - 1; i >= 0; i-- {
			if strings.Contains(lines[i], pat) {
				t.Log(lines[i])
				break
			}
		}
	}
}

// refused asks the cluster DNS for name from inside pod and reports an
// error unless the lookup fails with REFUSED: getent (glibc) must fail,
// and the probe's resolver, whose error names the rcode, must say
// REFUSED.
func refused(pod, name string) error {
	out, err := exec.Command(tendrilBin, "lab", "--name", labName, "exec", pod, "--",
		"getent", "ahostsv4", name).CombinedOutput()
	if err == nil {
		return fmt.Errorf("getent ahostsv4 %s from %s answered: %s", name, pod, out)
	}
	out, err = exec.Command(tendrilBin, "lab", "--name", labName, "probe", pod, name+":80", "--timeout", "2s").CombinedOutput()
	if err == nil || !strings.Contains(strings.ToLower(string(out)), "refused") {
		return fmt.Errorf("probe %s from %s: %v, want REFUSED:\n%s", name, pod, err, out)
	}
	return nil
}
