package connectivity

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tendril-net/tendril/pkg/lab"
)

// LabConfig fills cfg's nodes, API server and world from a lab with at
// least two nodes.
func LabConfig(st *lab.State, cfg Config) (Config, error) {
	if len(st.Nodes) < 2 {
		return cfg, fmt.Errorf("lab %s has %d node(s); the test needs two", st.Name, len(st.Nodes))
	}
	cfg.Nodes = [2]string{st.Nodes[0].Name, st.Nodes[1].Name}
	cfg.NodeIPs = [2]string{st.Nodes[0].Address, st.Nodes[1].Address}
	// The kubernetes Service's endpoint: node1's address, where every
	// lab kubelet forwards the API server for pods.
	cfg.APIServer = fmt.Sprintf("%s:%d", st.Nodes[0].Address, st.APIPort)
	if st.World != nil {
		cfg.World = st.World.ServerIP
		cfg.World6 = st.World.ServerIP6
	}
	if st.Dual() {
		cfg.NodeIPs6 = [2]string{st.Nodes[0].Address6, st.Nodes[1].Address6}
	}
	cfg.WorkloadImage = st.WorkloadImage
	// In the routed topology the world reaches each node through a
	// subnet of its own: no address is on-link with every node, so an
	// L2-announced load-balancer address has no segment to be announced
	// on (such clusters announce by BGP, which that topology lacks).
	cfg.NoSharedL2 = st.Topology == lab.TopologyRouted
	return cfg, nil
}

// LabProber probes from lab pods by entering their network namespaces.
type LabProber struct {
	State *lab.State
}

func (p LabProber) netns(pod string) (string, error) {
	ns, name, err := lab.ParsePodRef(pod)
	if err != nil {
		return "", err
	}
	rec, err := p.State.Pod(ns, name)
	if err != nil {
		return "", fmt.Errorf("pod %s: %w", pod, err)
	}
	return rec.NetnsFile(), nil
}

// Probe connects from the pod with `tendril lab probe`, a process of its
// own: the probe must run in the cgroup of the pod's node (which `lab
// probe` enters), where that node's agent attaches socket load-balancing,
// or, for OutsideNodeCgroup, in the machine's root cgroup; a cgroup is a
// property of a whole process, not of the thread that enters the pod's
// network namespace. `lab probe` resolves a name as the pod does. The
// answer is the answering pod's name.
func (p LabProber) Probe(ctx context.Context, pod, addr string, opts ProbeOptions, timeout time.Duration) (string, error) {
	args := []string{"lab", "probe", "--name", p.State.Name, pod, addr, "--timeout", timeout.String()}
	for _, f := range []struct {
		on   bool
		flag string
	}{{opts.UDP, "--udp"}, {opts.TLS, "--tls"}, {opts.DNSTCP, "--dns-tcp"}, {opts.OutsideNodeCgroup, "--outside-node-cgroup"}} {
		if f.on {
			args = append(args, f.flag)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(p.State.BinDir, "tendril"), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	msg := strings.TrimSpace(lastLine(stderr.String()))
	var exit *exec.ExitError
	switch {
	case err == nil:
		return parseProbeAnswer(stdout.String())
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		// `lab probe` exit 1: nothing answered.
		return "", probeFailure(strings.TrimPrefix(msg, "Error: "), opts)
	default:
		return "", fmt.Errorf("%w from %s: %v: %s", ErrCannotProbe, pod, err, msg)
	}
}

// probeFailure classifies the message of a `lab probe` that got no
// answer: it was dropped when its time ran out before anything came back
// (the handshake for TCP, the answer for UDP, or the name's resolution).
// A TCP connection that was accepted but not answered, a refusal, an
// unreachable network or a name that does not exist are not drops.
func probeFailure(msg string, opts ProbeOptions) error {
	timedOut := strings.Contains(msg, "i/o timeout") || strings.Contains(msg, "no answer within") ||
		strings.Contains(msg, "deadline exceeded")
	accepted := !opts.UDP && strings.Contains(msg, "connected, but no answer")
	if timedOut && !accepted {
		return fmt.Errorf("%w: %s", ErrDropped, msg)
	}
	return errors.New(msg)
}

// parseProbeAnswer reads the answer from `lab probe`'s line
// `POD -> ADDR/PROTO: answered "NAME"`.
func parseProbeAnswer(out string) (string, error) {
	_, quoted, ok := strings.Cut(strings.TrimSpace(out), ": answered ")
	if !ok {
		return "", fmt.Errorf("%w: unexpected output of lab probe: %q", ErrCannotProbe, out)
	}
	answer, err := strconv.Unquote(quoted)
	if err != nil {
		return "", fmt.Errorf("%w: unexpected answer in lab probe's output %q: %v", ErrCannotProbe, out, err)
	}
	return answer, nil
}

// Dial opens a TCP connection from inside the pod.
func (p LabProber) Dial(ctx context.Context, pod, addr string, timeout time.Duration) error {
	path, err := p.netns(pod)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCannotProbe, err)
	}
	var dialErr error
	if err := lab.InNetns(path, func() error {
		d := net.Dialer{Timeout: timeout}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		dialErr = err
		return nil
	}); err != nil {
		return fmt.Errorf("%w: enter %s: %v", ErrCannotProbe, pod, err)
	}
	if ne, ok := dialErr.(net.Error); ok && ne.Timeout() {
		return fmt.Errorf("%w: %v", ErrDropped, dialErr)
	}
	return dialErr
}

// Ping runs ping(8) inside the pod's network namespace.
func (p LabProber) Ping(ctx context.Context, pod, ip string, timeout time.Duration) error {
	path, err := p.netns(pod)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCannotProbe, err)
	}
	secs := int(timeout.Seconds())
	if secs < 1 {
		secs = 1
	}
	out, err := exec.CommandContext(ctx, "nsenter", "--net="+path, "ping", "-c", "1", "-W", fmt.Sprint(secs), ip).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && exit.ExitCode() == 1 && !strings.Contains(string(out), "Unreachable"):
		// ping(8) exits 1 when no reply came back in time (or an ICMP
		// error did, which is no drop).
		return fmt.Errorf("%w: ping %s: %s", ErrDropped, ip, strings.TrimSpace(lastLine(string(out))))
	case errors.As(err, &exit):
		return fmt.Errorf("ping %s: %v: %s", ip, err, strings.TrimSpace(lastLine(string(out))))
	default:
		return fmt.Errorf("%w: ping %s: %v", ErrCannotProbe, ip, err)
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
