package lab

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	observerpb "github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tendril-net/tendril/pkg/hubble/hubbletls"
)

// Ports of the lab's Hubble API: each agent serves TCP (mTLS) on its node
// address for the relay; the relay serves node1's address and a unix
// socket in the lab's directory, reachable from the machine's namespace.
const (
	HubblePort = 4244
	RelayPort  = 4245
)

// hubbleCertValidity is long enough for any lab.
const hubbleCertValidity = 365 * 24 * time.Hour

// hubblePKI makes the lab's Hubble CA, a server certificate per node (for
// its TLS server name) and the relay's client certificate, and returns
// each node's agent flags and the relay's TLS flags.
func hubblePKI(st *State) (agentArgs map[string][]string, relayArgs []string, err error) {
	dir := filepath.Join(st.Dir, "pki", "hubble")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	ca, err := hubbletls.NewCA(dir, "hubble-ca", hubbleCertValidity)
	if err != nil {
		return nil, nil, err
	}
	agentArgs = map[string][]string{}
	for _, n := range st.Nodes {
		pair, err := ca.Issue(dir, n.Name, hubbleCertValidity, hubbletls.ServerName(n.Name, "default"))
		if err != nil {
			return nil, nil, err
		}
		agentArgs[n.Name] = []string{
			"--hubble-listen-address", net.JoinHostPort(n.Address, strconv.Itoa(HubblePort)),
			"--hubble-tls-cert-file", pair.CertFile, "--hubble-tls-key-file", pair.KeyFile,
			"--hubble-tls-client-ca-files", ca.CertFile,
		}
	}
	relay, err := ca.Issue(dir, "relay", hubbleCertValidity, "relay.hubble-relay.tendril.io")
	if err != nil {
		return nil, nil, err
	}
	relayArgs = []string{"--tls-hubble-server-ca-files", ca.CertFile,
		"--tls-client-cert-file", relay.CertFile, "--tls-client-key-file", relay.KeyFile}
	return agentArgs, relayArgs, nil
}

// RelaySocket is where the lab's relay serves the Observer API for the
// machine's namespace.
func (s *State) RelaySocket() string { return filepath.Join(s.Dir, "relay.sock") }

// startRelay runs `tendril relay` in node1's namespace: it finds the nodes
// through node1's Peer service and serves on the lab's relay socket and
// node1's address. It waits until the relay reaches every node.
func startRelay(ctx context.Context, st *State, tlsArgs []string, exited map[string]<-chan error) error {
	n1 := st.Nodes[0]
	argv := []string{"nsenter", "--net=" + NetnsPath(n1.Netns), filepath.Join(st.BinDir, "tendril"), "relay",
		"--peer-service", "unix://" + filepath.Join(filepath.Dir(n1.Socket), "hubble.sock"),
		"--listen-address", "unix://" + st.RelaySocket(),
		"--listen-address", net.JoinHostPort(n1.Address, strconv.Itoa(RelayPort)),
		"--retry-timeout", "5s"}
	argv = append(argv, tlsArgs...)
	cmd, _, err := StartDetached(st.PidDir(), "relay", filepath.Join(st.LogDir(), "relay.log"), argv)
	if err != nil {
		return err
	}
	exited["relay"] = watchExit(cmd)
	return poll(ctx, "wait for the relay to reach every node", 60*time.Second, st, map[string]<-chan error{"relay": exited["relay"]}, func() (bool, error) {
		rs, err := RelayStatus(ctx, st)
		if err != nil {
			return false, err
		}
		if got := int(rs.GetNumConnectedNodes().GetValue()); got != len(st.Nodes) || rs.GetNumUnavailableNodes().GetValue() != 0 {
			return false, fmt.Errorf("relay: %d of %d nodes connected, unavailable: %v", got, len(st.Nodes), rs.GetUnavailableNodes())
		}
		return true, nil
	})
}

// RelayStatus asks the lab's relay for its status (nodes connected and
// unavailable, flows).
func RelayStatus(ctx context.Context, st *State) (*observerpb.ServerStatusResponse, error) {
	conn, err := grpc.NewClient("unix://"+st.RelaySocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return observerpb.NewObserverClient(conn).ServerStatus(cctx, &observerpb.ServerStatusRequest{})
}
