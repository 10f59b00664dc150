package connectivity

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"time"

	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/workload"
)

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
	return lab.NetnsPath(rec.Netns), nil
}

// Probe connects from the pod with the lab workload's probe.
func (p LabProber) Probe(ctx context.Context, pod, addr string, udp bool, timeout time.Duration) error {
	path, err := p.netns(pod)
	if err != nil {
		return err
	}
	var probeErr error
	if err := lab.InNetns(path, func() error {
		_, probeErr = workload.Probe(ctx, addr, udp, timeout)
		return nil
	}); err != nil {
		return fmt.Errorf("enter %s: %w", pod, err)
	}
	return probeErr
}

// Dial opens a TCP connection from inside the pod.
func (p LabProber) Dial(ctx context.Context, pod, addr string, timeout time.Duration) error {
	path, err := p.netns(pod)
	if err != nil {
		return err
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
		return fmt.Errorf("enter %s: %w", pod, err)
	}
	return dialErr
}

// Ping runs ping(8) inside the pod's network namespace.
func (p LabProber) Ping(ctx context.Context, pod, ip string, timeout time.Duration) error {
	path, err := p.netns(pod)
	if err != nil {
		return err
	}
	secs := int(timeout.Seconds())
	if secs < 1 {
		secs = 1
	}
	out, err := exec.CommandContext(ctx, "nsenter", "--net="+path, "ping", "-c", "1", "-W", fmt.Sprint(secs), ip).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s: %v: %s", ip, err, strings.TrimSpace(lastLine(string(out))))
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
