package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// run runs the tendril CLI (not a lab subcommand) and returns its output.
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

// TestPrivilegedLabPolicySuggestAndWhatIf: traffic is observed through the
// relay, `tendril policy suggest` writes policies admitting it, they are
// applied, and the same traffic passes again while a connection that was
// never observed is denied; `tendril policy whatif` on a change to one of
// them lists exactly the connections the change then drops when enforced.
func TestPrivilegedLabPolicySuggestAndWhatIf(t *testing.T) {
	e := labUp(t)
	ctx := context.Background()
	const ns, clientNS = "e2e-suggest", "e2e-suggest-client"
	e.createNamespace(t, ns)
	e.createNamespace(t, clientNS)
	e.createPod(t, ns, "web", "node1", map[string]string{"app": "web"})
	e.createPod(t, ns, "db", "node2", map[string]string{"app": "db"})
	e.createPod(t, ns, "cache", "node1", map[string]string{"app": "cache"})
	e.createPod(t, clientNS, "client", "node2", map[string]string{"app": "client"})
	ip := map[string]string{}
	for _, p := range []string{ns + "/web", ns + "/db", ns + "/cache", clientNS + "/client"} {
		n, name, _ := strings.Cut(p, "/")
		ip[p] = e.waitReady(t, n, name).Status.PodIP
	}
	type pair struct {
		from, to string
		port     int
		udp      bool
	}
	observed := []pair{
		{clientNS + "/client", ns + "/web", 80, false},
		{ns + "/web", ns + "/db", 80, false},
		{ns + "/web", ns + "/cache", 81, true},
		{ns + "/web", ns + "/cache", 80, false},
	}
	never := []pair{
		{ns + "/db", ns + "/web", 80, false},          // db's egress: nothing observed
		{clientNS + "/client", ns + "/db", 80, false}, // db's ingress admits web only
		{ns + "/web", ns + "/db", 81, false},          // another port
	}
	run := func(p pair) int { return probe(t, p.from, fmt.Sprintf("%s:%d", ip[p.to], p.port), p.udp) }

	start := time.Now().Add(-time.Second).UTC().Format(time.RFC3339)
	for _, p := range observed {
		if c := run(p); c != 0 {
			t.Fatalf("before any policy: %v exit %d", p, c)
		}
	}
	relay := "unix://" + e.st.RelaySocket()
	var yamlOut string
	eventually(t, "suggested policies for every workload", func() (bool, error) {
		yamlOut = runTendril(t, "policy", "suggest", "-n", ns, "--since", start, "--server", relay)
		return strings.Count(yamlOut, "kind: NetworkPolicy") == 3, fmt.Errorf("%s", yamlOut)
	})
	t.Logf("suggested:\n%s", yamlOut)
	var nps []*networkingv1.NetworkPolicy
	for _, doc := range strings.Split(yamlOut, "\n---\n") {
		if !strings.Contains(doc, "kind: NetworkPolicy") {
			continue
		}
		np := &networkingv1.NetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(doc), np); err != nil {
			t.Fatalf("suggested policy: %v\n%s", err, doc)
		}
		if _, err := e.cs.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		nps = append(nps, np)
	}
	for _, p := range never {
		eventually(t, fmt.Sprintf("never observed %v denied", p), func() (bool, error) {
			c := run(p)
			return c == 1, fmt.Errorf("exit %d", c)
		})
	}
	// Replaying the observed traffic: 0 drops.
	for round := 0; round < 3; round++ {
		for _, p := range observed {
			if c := run(p); c != 0 {
				t.Fatalf("replay %d of %v under the suggested policies: exit %d, want 0", round, p, c)
			}
		}
	}

	// What if web's policy no longer admitted anything from the client
	// namespace? whatif lists the connections; enforcing the change drops
	// exactly them.
	var web *networkingv1.NetworkPolicy
	for _, np := range nps {
		if np.Spec.PodSelector.MatchLabels["app"] == "web" {
			web = np.DeepCopy()
		}
	}
	if web == nil {
		t.Fatal("no suggested policy for web")
	}
	web.Spec.Ingress = slices.DeleteFunc(web.Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
		return len(r.From) == 1 && r.From[0].NamespaceSelector != nil
	})
	web.TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}
	web.ResourceVersion, web.UID = "", ""
	b, err := yaml.Marshal(web)
	if err != nil {
		t.Fatal(err)
	}
	file := t.TempDir() + "/web.yaml"
	if err := writeFile(file, b); err != nil {
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
	t.Logf("whatif lists %v", listed)
	cur, err := e.cs.NetworkingV1().NetworkPolicies(ns).Get(ctx, web.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec = web.Spec
	if _, err := e.cs.NetworkingV1().NetworkPolicies(ns).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the change enforced", func() (bool, error) {
		c := run(observed[0])
		return c == 1, fmt.Errorf("exit %d", c)
	})
	for _, p := range observed {
		dropped := run(p) == 1
		k := fmt.Sprintf("%s>%s:%d", ip[p.from], ip[p.to], p.port)
		if dropped != listed[k] {
			t.Errorf("%v: dropped=%v after enforcing, listed by whatif=%v", p, dropped, listed[k])
		}
	}
	if len(listed) != 1 {
		t.Errorf("whatif listed %d connections, want the client's one: %v", len(listed), listed)
	}
}

func writeFile(name string, b []byte) error { return os.WriteFile(name, b, 0o644) }
