package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tendril-net/tendril/pkg/controlplane"
)

// EnvExports is what `tendril lab env` prints for eval: KUBECONFIG, the
// node sockets, the relay for tendril observe and hubble, and, when the
// Kubernetes binaries include kubectl, a PATH entry holding a `kubectl`
// link to it. A PATH entry rather than an alias: scripts (non-interactive
// shells) do not expand aliases.
func (s *State) EnvExports() (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "export KUBECONFIG=%s\n", s.Kubeconfig)
	if dir, err := s.kubectlDir(); err != nil {
		return "", err
	} else if dir != "" {
		fmt.Fprintf(&b, "export PATH=%s:\"$PATH\"\n", dir)
	}
	for i, n := range s.Nodes {
		if i == 0 {
			fmt.Fprintf(&b, "export TENDRIL_SOCK=unix://%s\n", n.Socket)
		}
		fmt.Fprintf(&b, "export TENDRIL_SOCK_%s=unix://%s\n", strings.ToUpper(n.Name), n.Socket)
	}
	if s.Runtime == RuntimeContainerd {
		// The chart's relay is a pod serving TLS inside the lab's
		// networks, not a socket of the lab's: the client certificate
		// and the names hubble checks, and where to reach it from.
		ca, cert, key := s.HubbleClientTLS()
		fmt.Fprintf(&b, "export HUBBLE_TLS=true HUBBLE_TLS_SERVER_NAME=%s\n", RelayTLSServerName)
		fmt.Fprintf(&b, "export HUBBLE_TLS_CA_CERT_FILES=%s HUBBLE_TLS_CLIENT_CERT_FILE=%s HUBBLE_TLS_CLIENT_KEY_FILE=%s\n", ca, cert, key)
		if len(s.Nodes) > 0 {
			fmt.Fprintf(&b, "# the relay: port 4245 of the %s pod (kubectl -n %s get pods -o wide), from a node's network namespace: nsenter --net=%s hubble --server <pod IP>:4245 observe\n",
				"app.kubernetes.io/name=tendril-relay", ChartNamespace, NetnsPath(s.Nodes[0].Netns))
		}
	} else {
		fmt.Fprintf(&b, "export TENDRIL_HUBBLE_SERVER=unix://%s\n", s.RelaySocket())
		fmt.Fprintf(&b, "export HUBBLE_SERVER=unix://%s\n", s.RelaySocket())
	}
	if u := s.UIURL(); u != "" {
		fmt.Fprintf(&b, "export TENDRIL_UI=%s\n", u)
	}
	return b.String(), nil
}

// kubectlDir makes <lab dir>/bin/kubectl a link to the lab's kubectl
// (kept current: the Kubernetes version may change between builds) and
// returns that directory, or "" when no kubectl was built.
func (s *State) kubectlDir() (string, error) {
	target := filepath.Join(s.K8sBinDir, controlplane.KubectlBinary)
	if _, err := os.Stat(target); err != nil {
		return "", nil
	}
	dir := filepath.Join(s.Dir, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("lab env: %w", err)
	}
	link := filepath.Join(dir, "kubectl")
	if cur, err := os.Readlink(link); err == nil && cur == target {
		return dir, nil
	}
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("lab env: replace %s: %w", link, err)
	}
	if err := os.Symlink(target, link); err != nil {
		return "", fmt.Errorf("lab env: %w", err)
	}
	return dir, nil
}
