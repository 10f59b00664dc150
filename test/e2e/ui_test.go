package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	"github.com/tendril-net/tendril/pkg/ui/uitest"
)

// The demo's policy (examples/lab/allow-frontend.yaml) in the test's
// namespace.
const uiAllowFrontendYAML = `
metadata: {name: allow-frontend}
spec:
  endpointSelector: {matchLabels: {app: backend}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: frontend}}]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
`

// TestPrivilegedLabUIBrowser: the lab's web UI (started by lab up, reading
// the lab's relay) in headless Chromium, with the demo's app and policy
// and real traffic: the map shows frontend → backend and other → backend
// in red naming allow-frontend, the flow table filtered to drops shows
// only drops, and the backend's policy view suggests a policy admitting
// the frontend.
func TestPrivilegedLabUIBrowser(t *testing.T) {
	e := labUp(t)
	if e.st.UIURL() == "" {
		t.Fatal("the lab runs no web UI")
	}
	ctx := context.Background()
	const ns = "e2e-ui"
	e.createNamespace(t, ns)
	for _, app := range []string{"frontend", "backend", "other"} {
		e.createPod(t, ns, app, "node1", map[string]string{"app": app})
	}
	backend := e.waitReady(t, ns, "backend").Status.PodIP + ":80"
	e.waitReady(t, ns, "frontend")
	e.waitReady(t, ns, "other")
	pol := &v1alpha1.TendrilNetworkPolicy{}
	if err := yaml.UnmarshalStrict([]byte(uiAllowFrontendYAML), pol); err != nil {
		t.Fatal(err)
	}
	tnp := e.k8.Tendril.TendrilV1alpha1().TendrilNetworkPolicies(ns)
	if _, err := tnp.Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node1 enforcing allow-frontend", func() (bool, error) {
		got, err := tnp.Get(ctx, pol.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return got.Status.Nodes["node1"].Enforcing, fmt.Errorf("%+v", got.Status.Nodes)
	})
	if c := probe(t, ns+"/frontend", backend, false); c != 0 {
		t.Fatalf("frontend -> backend: exit %d, want 0", c)
	}
	if c := probe(t, ns+"/other", backend, false); c != 1 {
		t.Fatalf("other -> backend under allow-frontend: exit %d, want 1 (blocked)", c)
	}

	b := uitest.Browser(t)
	fwd := `g.edge.forwarded[data-source="e2e-ui/frontend"][data-target="e2e-ui/backend"]`
	drop := `g.edge.dropped[data-source="e2e-ui/other"][data-target="e2e-ui/backend"]`
	uitest.Do(t, b, "the service map",
		chromedp.Navigate(e.st.UIURL()+"?namespace="+ns),
		chromedp.WaitVisible(fwd),
		chromedp.WaitVisible(drop),
	)
	text := uitest.Value(t, b, "the dropped edge", chromedp.Evaluate[string](`document.querySelector('`+drop+` text').textContent`))
	stroke := uitest.Value(t, b, "the dropped edge's colour", chromedp.Evaluate[string](`getComputedStyle(document.querySelector('`+drop+` path')).stroke`))
	if !strings.Contains(text, ns+"/allow-frontend") || stroke != "rgb(211, 47, 47)" {
		t.Errorf("the dropped edge reads %q in %s, want red naming %s/allow-frontend", text, stroke, ns)
	}
	uitest.Do(t, b, "the flow table filtered to drops",
		chromedp.Click(`nav button[data-tab="flows"]`),
		chromedp.SetValue(`select[name="verdict"]`, "DROPPED"),
		chromedp.Click(`#filters button[type="submit"]`),
		uitest.Poll(`(() => { const rows = document.querySelectorAll('#flows tbody tr.flow');
			return rows.length > 0 && Array.from(rows).every(r => r.dataset.verdict === 'DROPPED'); })()`),
	)
	uitest.Do(t, b, "the backend's policy view",
		chromedp.Click(`nav button[data-tab="map"]`),
		chromedp.WaitVisible(`g.node[data-id="e2e-ui/backend"]`),
		chromedp.Click(`g.node[data-id="e2e-ui/backend"] rect`),
		uitest.Poll(`(document.querySelector('#suggested') || {}).textContent?.includes('kind: NetworkPolicy')`),
	)
	suggested := uitest.Value(t, b, "the suggested policy", chromedp.Text(`#suggested`))
	if !strings.Contains(suggested, "app: backend") || !strings.Contains(suggested, "app: frontend") || strings.Contains(suggested, "app: other") {
		t.Errorf("suggested policy:\n%s", suggested)
	}
}
