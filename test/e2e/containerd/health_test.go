package containerd_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/tendril-net/tendril/pkg/agent/nodehealth"
	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/realnode"
)

// healthEndpointsReachable waits until every node's agent (in the chart's
// container, the health endpoint on by the chart's default) sees every
// other node's health endpoint answer both probes through the datapath.
// The agent's socket is the node's /var/run/tendril, read in the node's
// mount namespace.
func healthEndpointsReachable(t *testing.T, st *lab.State, tendril string) {
	t.Helper()
	poll(t, "each node's health endpoint reachable from every other node", func() (bool, error) {
		for _, n := range st.Nodes {
			nd := realnode.Node{Name: n.Name, Dir: filepath.Join(st.Dir, "nodes", n.Name)}
			out, err := exec.Command("nsenter", "--mount="+nd.MountNamespace(), "--net="+lab.NetnsPath(n.Netns), "--",
				tendril, "-H", "unix://"+client.DefaultSocket, "health", "-o", "json").CombinedOutput()
			if err != nil {
				return false, fmt.Errorf("tendril health on %s: %v: %s", n.Name, err, out)
			}
			var resp nodehealth.HealthResponse
			if err := json.Unmarshal(out, &resp); err != nil {
				return false, fmt.Errorf("tendril health -o json on %s: %w\n%s", n.Name, err, out)
			}
			for _, peer := range st.Nodes {
				if peer.Name == n.Name {
					continue
				}
				a, ok := resp.HealthEndpoint(peer.Name)
				if !ok || !a.Reachable() {
					return false, fmt.Errorf("%s sees %s's health endpoint (published %v) %s: icmp %v, http %v", n.Name, peer.Name, ok, a.IP, a.ICMP, a.HTTP)
				}
			}
		}
		return true, nil
	})
}
