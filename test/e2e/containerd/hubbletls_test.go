package containerd_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/hubble/hubbletest"
	"github.com/tendril-net/tendril/pkg/hubble/hubbletls"
	"github.com/tendril-net/tendril/pkg/lab"
)

// hubbleOverTLS drives the stock hubble CLI, from node1's network
// namespace, against the chart's Hubble with TLS on (the lab installs it
// so, from the Secrets it makes): the relay's Observer API takes the
// lab's client certificate, sees both nodes and their flows, and so does
// each agent's Hubble port; a client certificate of another CA, none at
// all, and plaintext are each refused, at the relay and at each agent.
func hubbleOverTLS(t *testing.T, st *lab.State) {
	ctx := context.Background()
	cs, err := st.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	bin := hubbletest.HubbleCLI(t)
	caFile, certFile, keyFile := st.HubbleClientTLS()
	n1 := st.Nodes[0]
	hubble := func(args ...string) (string, error) {
		out, err := exec.Command("nsenter", append([]string{"--net=" + lab.NetnsPath(n1.Netns), "--", bin}, args...)...).CombinedOutput()
		return string(out), err
	}
	// The servers: the relay's pod, each agent at its node's address
	// (host network) with the TLS name the relay checks.
	type server struct{ what, addr, name string }
	var relayIP string
	poll(t, "the relay pod running", func() (bool, error) {
		pods, err := cs.CoreV1().Pods(lab.ChartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=tendril-relay"})
		if err != nil || len(pods.Items) == 0 {
			return false, fmt.Errorf("relay pods: %d (%v)", len(pods.Items), err)
		}
		p := pods.Items[0]
		relayIP = p.Status.PodIP
		return lab.PodReady(&p) && relayIP != "", fmt.Errorf("relay pod %s: %s, ready %v", p.Name, p.Status.Phase, lab.PodReady(&p))
	})
	servers := []server{{"the relay", net.JoinHostPort(relayIP, strconv.Itoa(4245)), lab.RelayTLSServerName}}
	for _, n := range st.Nodes {
		servers = append(servers, server{n.Name + "'s agent", net.JoinHostPort(n.Address, strconv.Itoa(lab.HubblePort)), hubbletls.ServerName(n.Name, "default")})
	}
	withTLS := func(s server, cert, key string) []string {
		args := []string{"--server", s.addr, "--tls", "--tls-ca-cert-files", caFile, "--tls-server-name", s.name, "--timeout", "3s", "--request-timeout", "3s"}
		if cert != "" {
			args = append(args, "--tls-client-cert-file", cert, "--tls-client-key-file", key)
		}
		return args
	}

	begin := time.Now()
	relay := servers[0]
	poll(t, "hubble status over TLS through the relay: 2/2 nodes", func() (bool, error) {
		out, err := hubble(append([]string{"status"}, withTLS(relay, certFile, keyFile)...)...)
		return err == nil && strings.Contains(out, fmt.Sprintf("Connected Nodes: %d/%d", len(st.Nodes), len(st.Nodes))), fmt.Errorf("%v: %s", err, out)
	})
	poll(t, "flows of both nodes through the relay over TLS", func() (bool, error) {
		out, err := hubble(append([]string{"observe", "--last", "200", "-o", "json"}, withTLS(relay, certFile, keyFile)...)...)
		if err != nil {
			return false, fmt.Errorf("%v: %s", err, out)
		}
		seen := map[string]int{}
		for _, r := range hubbletest.JSONResponses(t, out) {
			seen[r.GetNodeName()]++
		}
		for _, n := range st.Nodes {
			if seen[n.Name] == 0 {
				return false, fmt.Errorf("flows by node: %v", seen)
			}
		}
		t.Logf("hubble observe through the relay over TLS: flows by node %v", seen)
		return true, nil
	})
	for _, s := range servers[1:] {
		out, err := hubble(append([]string{"status"}, withTLS(s, certFile, keyFile)...)...)
		if err != nil || !strings.Contains(out, "Healthcheck") {
			t.Errorf("hubble status at %s (%s) over TLS with the client certificate: %v\n%s", s.what, s.addr, err, out)
		}
	}

	// Refused: each a client the servers must not serve. Run side by side
	// (each waits out its timeout).
	other, err := hubbletls.NewCA(t.TempDir(), "other-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	intruder, err := other.Issue(t.TempDir(), "intruder", time.Hour, "client.hubble-relay.tendril.io")
	if err != nil {
		t.Fatal(err)
	}
	refused := []struct {
		what string
		args func(server) []string
	}{
		{"a client certificate of another CA", func(s server) []string { return withTLS(s, intruder.CertFile, intruder.KeyFile) }},
		{"no client certificate", func(s server) []string { return withTLS(s, "", "") }},
		{"plaintext", func(s server) []string {
			return []string{"--server", s.addr, "--timeout", "3s", "--request-timeout", "3s"}
		}},
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, s := range servers {
		for _, c := range refused {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := hubble(append([]string{"status"}, c.args(s)...)...)
				mu.Lock()
				defer mu.Unlock()
				if err == nil || strings.Contains(out, "Healthcheck") {
					t.Errorf("%s at %s (%s) was served: %v\n%s", c.what, s.what, s.addr, err, out)
					return
				}
				t.Logf("%s at %s refused: %s", c.what, s.what, lastLine(out))
			}()
		}
	}
	wg.Wait()
	t.Logf("Hubble over TLS on the real nodes checked in %s", time.Since(begin).Round(time.Millisecond))
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
