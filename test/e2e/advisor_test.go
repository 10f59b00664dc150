package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// runTendril runs the tendril CLI (not a lab subcommand) and returns its
// standard output.
func runTendril(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(tendrilBin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("tendril %v: %v\n%s%s", args, err, out.String(), errOut.String())
	}
	return out.String()
}

// suggestedConnections reads, from the output of `tendril policy suggest`,
// how many observed connections each suggested policy admits (by name).
func suggestedConnections(out string) map[string]int {
	got := map[string]int{}
	for _, doc := range strings.Split(out, "\n---\n") {
		var n int
		var name string
		for _, line := range strings.Split(doc, "\n") {
			if k, err := fmt.Sscanf(line, "# %d observed connections", &n); k == 1 && err == nil {
				continue
			}
			if v, ok := strings.CutPrefix(line, "  name: "); ok {
				name = v
			}
		}
		if name != "" {
			got[name] = n
		}
	}
	return got
}

// conn is a probe: from a pod to another's port.
type conn struct {
	from, to string // "sx/a"
	port     int
}

// probeAll runs the probes many at once and returns which connected.
func probeAll(t *testing.T, ips map[string]string, conns []conn) map[conn]bool {
	t.Helper()
	out := map[conn]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 12)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			cmd := exec.Command(tendrilBin, "lab", "--name", labName, "probe", "e2e"+c.from, fmt.Sprintf("%s:%d", ips[c.to], c.port), "--timeout", "1s")
			err := cmd.Run()
			code := cmd.ProcessState.ExitCode()
			if err != nil && code != 1 {
				t.Errorf("probe %v: could not probe (exit %d): %v", c, code, err)
			}
			mu.Lock()
			out[c] = code == 0
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// TestPrivilegedLabPolicySuggestAndWhatIf: the x/y/z matrix's traffic
// (TCP 80 between every pair but a few) is observed through the relay,
// `tendril policy suggest` writes policies for each namespace, they are
// applied, and replaying the same traffic gives 0 drops while connections
// that were never observed are denied; then `tendril policy whatif` on a
// change to one of the policies lists exactly the connections that
// enforcing the change drops.
func TestPrivilegedLabPolicySuggestAndWhatIf(t *testing.T) {
	e := labUp(t)
	ctx := context.Background()
	nss := []string{"sx", "sy", "sz"}
	pods := []string{"a", "b", "c"}
	nodes := []string{"node1", "node2"}
	var names []string
	i := 0
	for _, ns := range nss {
		e.createNamespace(t, "e2e"+ns)
		for _, p := range pods {
			e.createPod(t, "e2e"+ns, p, nodes[i%2], map[string]string{"pod": p})
			names = append(names, ns+"/"+p)
			i++
		}
	}
	ips := map[string]string{}
	for _, n := range names {
		ns, p, _ := strings.Cut(n, "/")
		ips[n] = e.waitReady(t, "e2e"+ns, p).Status.PodIP
	}
	// Observed: every pair on TCP 80 but those from sz/c and to sx/c;
	// never observed: those, and port 81 anywhere.
	var observed, never []conn
	for _, from := range names {
		for _, to := range names {
			if from == to {
				continue
			}
			c := conn{from, to, 80}
			if from == "sz/c" || to == "sx/c" {
				never = append(never, c)
			} else {
				observed = append(observed, c)
			}
		}
	}
	never = append(never, conn{"sx/a", "sy/b", 81}, conn{"sy/c", "sz/a", 81})

	start := time.Now().Add(-time.Second).UTC().Format(time.RFC3339)
	for c, ok := range probeAll(t, ips, observed) {
		if !ok {
			t.Fatalf("before any policy: %v did not connect", c)
		}
	}
	relay := "unix://" + e.st.RelaySocket()
	var nps []*networkingv1.NetworkPolicy
	for _, ns := range nss {
		// The relay serves what the nodes' observers have decoded so
		// far: wait until each workload's suggestion counts every
		// connection made to or from it (suggesting from a partial
		// window leaves a connection out, and replaying it then drops).
		want := map[string]int{}
		for _, c := range observed {
			for _, end := range []string{c.from, c.to} {
				if n, p, _ := strings.Cut(end, "/"); n == ns {
					want["suggested-"+p]++
				}
			}
		}
		var out string
		eventually(t, "suggested policies for every connection of every workload of "+ns, func() (bool, error) {
			out = runTendril(t, "policy", "suggest", "-n", "e2e"+ns, "--since", start, "--server", relay)
			got := suggestedConnections(out)
			return maps.Equal(got, want), fmt.Errorf("connections per suggested policy %v, want %v\n%s", got, want, out)
		})
		t.Logf("suggested for %s:\n%s", ns, out)
		for _, doc := range strings.Split(out, "\n---\n") {
			if !strings.Contains(doc, "kind: NetworkPolicy") {
				continue
			}
			np := &networkingv1.NetworkPolicy{}
			if err := yaml.UnmarshalStrict([]byte(doc), np); err != nil {
				t.Fatalf("suggested policy: %v\n%s", err, doc)
			}
			if _, err := e.cs.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			nps = append(nps, np)
		}
	}
	eventually(t, "every never-observed connection denied", func() (bool, error) {
		var allowed []conn
		for c, ok := range probeAll(t, ips, never) {
			if ok {
				allowed = append(allowed, c)
			}
		}
		return len(allowed) == 0, fmt.Errorf("still connecting: %v", allowed)
	})
	// Replaying the observed traffic: 0 drops, three times.
	for round := 0; round < 3; round++ {
		for c, ok := range probeAll(t, ips, observed) {
			if !ok {
				t.Errorf("replay %d: %v dropped under the suggested policies", round, c)
			}
		}
	}
	if t.Failed() {
		return
	}

	// What if sx/a's policy no longer admitted namespace sy? whatif lists
	// the connections; enforcing the change drops exactly them.
	var pol *networkingv1.NetworkPolicy
	for _, np := range nps {
		if np.Namespace == "e2esx" && np.Spec.PodSelector.MatchLabels["pod"] == "a" {
			pol = np.DeepCopy()
		}
	}
	if pol == nil {
		t.Fatal("no suggested policy for sx/a")
	}
	pol.Spec.Ingress = slices.DeleteFunc(pol.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
		return len(r.From) == 1 && r.From[0].NamespaceSelector != nil && r.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "e2esy"
	})
	pol.TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}
	pol.ResourceVersion, pol.UID = "", ""
	b, err := yaml.Marshal(pol)
	if err != nil {
		t.Fatal(err)
	}
	file := t.TempDir() + "/candidate.yaml"
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := runTendril(t, "-H", "unix://"+e.st.Nodes[0].Socket, "policy", "whatif", "-f", file, "--since", start, "--server", relay, "-o", "json")
	var rows []struct {
		SourceIP, DestIP    string
		Port                uint16
		Now, WithCandidates string
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("whatif -o json: %v\n%s", err, out)
	}
	listed := map[string]bool{}
	for _, r := range rows {
		listed[fmt.Sprintf("%s>%s:%d", r.SourceIP, r.DestIP, r.Port)] = true
		if r.Now != "allowed" || r.WithCandidates != "denied" {
			t.Errorf("whatif row %+v: want allowed -> denied", r)
		}
	}
	t.Logf("whatif lists %d connections: %v", len(listed), listed)
	if len(listed) != 3 {
		t.Errorf("whatif listed %d connections, want sy/a, sy/b, sy/c -> sx/a", len(listed))
	}
	cur, err := e.cs.NetworkingV1().NetworkPolicies("e2esx").Get(ctx, pol.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec = pol.Spec
	if _, err := e.cs.NetworkingV1().NetworkPolicies("e2esx").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := conn{"sy/a", "sx/a", 80}
	eventually(t, "the change enforced", func() (bool, error) {
		ok := probeAll(t, ips, []conn{first})[first]
		return !ok, fmt.Errorf("%v still connects", first)
	})
	for c, ok := range probeAll(t, ips, observed) {
		k := fmt.Sprintf("%s>%s:%d", ips[c.from], ips[c.to], c.port)
		if !ok != listed[k] {
			t.Errorf("%v: dropped=%v after enforcing, listed by whatif=%v", c, !ok, listed[k])
		}
	}
	for _, ns := range nss {
		if err := e.cs.NetworkingV1().NetworkPolicies("e2e"+ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}
