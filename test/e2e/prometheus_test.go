package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
)

// Policies that make every kind of traffic the dashboards count: the
// server admits only client1 on TCP 80 (so client2 is dropped, naming the
// policy), and an audit-mode policy on the audited server lets client2
// pass as AUDIT.
const (
	promEnforcedYAML = `
metadata: {name: prom-server-allow}
spec:
  endpointSelector: {matchLabels: {app: prom-server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: prom-client1}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
`
	promAuditYAML = `
metadata: {name: prom-audited-allow}
spec:
  endpointSelector: {matchLabels: {app: prom-audited}}
  enforcementMode: audit
  ingress:
  - fromEndpoints: [{matchLabels: {app: prom-client1}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
`
)

// TestPrivilegedLabPrometheusDashboards: the lab's Prometheus (lab up
// --prometheus) scrapes every agent, the operator and the relay, and every
// query of the Grafana dashboards under install/grafana returns data once
// the lab has carried allowed, dropped and audited traffic.
func TestPrivilegedLabPrometheusDashboards(t *testing.T) {
	e := labUp(t)
	ctx := context.Background()
	p := e.st.Prometheus
	if p == nil {
		t.Fatal("the test lab has no Prometheus (lab up --prometheus)")
	}
	const ns = "e2e-prom"
	e.createNamespace(t, ns)
	e.createPod(t, ns, "server", "node1", map[string]string{"app": "prom-server"})
	e.createPod(t, ns, "audited", "node1", map[string]string{"app": "prom-audited"})
	e.createPod(t, ns, "client1", "node2", map[string]string{"app": "prom-client1"})
	e.createPod(t, ns, "client2", "node1", map[string]string{"app": "prom-client2"})
	server := e.waitReady(t, ns, "server").Status.PodIP + ":80"
	audited := e.waitReady(t, ns, "audited").Status.PodIP + ":80"
	e.waitReady(t, ns, "client1")
	e.waitReady(t, ns, "client2")
	tnp := e.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns)
	for _, doc := range []string{promEnforcedYAML, promAuditYAML} {
		pol := &v1alpha1.TendrilNetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(doc), pol); err != nil {
			t.Fatal(err)
		}
		if _, err := tnp.Create(ctx, pol, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "node1 enforcing "+pol.Name, func() (bool, error) {
			got, err := tnp.Get(ctx, pol.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return got.Status.Nodes["node1"].Enforcing, fmt.Errorf("%+v", got.Status.Nodes)
		})
	}
	// A Service in front of the server: the service panels count
	// connections to a frontend, which no other traffic here makes (the
	// other tests' Services are not there when this one runs first).
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "prom-server"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "prom-server"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)}}},
	}
	created, err := e.cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	frontend := created.Spec.ClusterIP + ":80"
	eventually(t, "client1 answered through the Service", func() (bool, error) {
		code, out := tendril(t, "probe", ns+"/client1", frontend, "--timeout", "1s")
		return code == 0, fmt.Errorf("exit %d: %s", code, out)
	})
	traffic := func() {
		probe(t, ns+"/client1", server, false)   // allowed by the policy
		probe(t, ns+"/client1", frontend, false) // the same, through the Service
		probe(t, ns+"/client2", server, false)   // dropped, naming it
		probe(t, ns+"/client2", audited, false)  // passes as AUDIT
	}
	traffic()

	files, err := filepath.Glob("../../install/grafana/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("dashboards: %v %v", files, err)
	}
	var queries []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []struct {
				Targets []struct{ Expr string }
			}
		}
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, panel := range d.Panels {
			for _, q := range panel.Targets {
				queries = append(queries, q.Expr)
			}
		}
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	series := func(q string) (int, error) {
		resp, err := hc.Get(p.URL() + "api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var out struct {
			Status string
			Error  string
			Data   struct{ Result []json.RawMessage }
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return 0, err
		}
		if out.Status != "success" {
			return 0, fmt.Errorf("%s: %s", q, out.Error)
		}
		return len(out.Data.Result), nil
	}
	// A rate needs two scrapes (every 5 s) after the traffic: poll, with
	// more traffic now and then, until every query has data.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var empty []string
		for _, q := range queries {
			n, err := series(q)
			if err != nil {
				t.Fatalf("query %q: %v", q, err)
			}
			if n == 0 {
				empty = append(empty, q)
			}
		}
		if len(empty) == 0 {
			t.Logf("every one of %d dashboard queries returns data", len(queries))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d dashboard queries return no data from the lab's Prometheus:\n%s", len(empty), len(queries), strings.Join(empty, "\n"))
		}
		traffic()
		time.Sleep(5 * time.Second)
	}
}
