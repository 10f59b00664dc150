package cni_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/url"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/models"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// inPodNetns runs fn on a thread inside the pod's network namespace: a
// socket made there stays in that namespace whatever thread uses it later.
func inPodNetns(t *testing.T, p *pod, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread is not unlocked: it dies with the goroutine rather
		// than go back to the pool in the pod's namespace on a failed
		// switch back.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			t.Error(err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(p.netns)
		if err != nil {
			t.Error(err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			t.Error(err)
			return
		}
		fn()
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread()
		}
	}()
	<-done
}

// importPolicyRevision imports rules (replacing those with the same
// labels) and returns the repository's revision after it.
func (n *node) importPolicyRevision(t *testing.T, doc string) int64 {
	t.Helper()
	var pol models.Policy
	if err := n.agent.Do(context.Background(), "PUT", "/policy", url.Values{"replace": {"true"}}, nil, doc, &pol); err != nil {
		t.Fatal(err)
	}
	return pol.Revision
}

// waitRealized waits until endpoint id has realized policy revision rev:
// its refresh (map entries, flags, the revocation of established flows)
// is over.
func (n *node) waitRealized(t *testing.T, id string, rev int64) {
	t.Helper()
	eventually(t, "endpoint "+id+" realizes policy revision", func() bool {
		ep, err := n.agent.EndpointGet(context.Background(), id)
		return err == nil && ep.Status.Policy != nil && ep.Status.Policy.Realized.PolicyRevision >= rev
	})
}

// TestPrivilegedRevokeEstablishedFlow: a long-lived TCP connection from
// pod a to pod b, through the eBPF datapath, exchanges data under a
// policy that lets a in; then a deny rule for a lands on b.
//
// With the default --policy-revoke-established=deny the agent revokes b's
// admission in the flow's conntrack entry: b's policy checks the client's
// next message as new and drops it (and every retransmission, and the
// client's acknowledgements of what b sends), so the server never gets it
// and the client's connection times out (TCP_USER_TIMEOUT).
// With none (Cilium's behaviour) the established flow outlives the deny:
// the next message is echoed.
//
// When the change only removes a's allow (b still enforces ingress, for
// another peer), all ends the flow the same way, and deny lets it live.
func TestPrivilegedRevokeEstablishedFlow(t *testing.T) {
	testutil.Privileged(t)
	const (
		denyRule = `[{"endpointSelector":{"matchLabels":{"app":"b"}},"labels":["test=revoke-deny"],
				"ingressDeny":[{"fromEndpoints":[{"matchLabels":{"app":"a"}}]}]}]`
		allowOther = `[{"endpointSelector":{"matchLabels":{"app":"b"}},"labels":["test=revoke-allow"],
				"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"other"}}],"toPorts":[{"ports":[{"port":"7070","protocol":"TCP"}]}]}]}]`
	)
	for _, tc := range []struct {
		name, mode, change string
		revoked            bool
	}{
		{"deny rule, deny", "deny", denyRule, true},
		{"deny rule, none", "none", denyRule, false},
		{"allow removed, all", "all", allowOther, true},
		{"allow removed, deny", "deny", allowOther, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startNode(t, "--ipv6-range", "none", "--policy-revoke-established", tc.mode)
			list := n.confList("tendril-cni", "1.1.0", nil)
			a, b := n.newPod("a"), n.newPod("b")
			n.mustAdd(list, a)
			rb := n.mustAdd(list, b)
			ipB := rb.IPs[0].Address.IP.String()
			n.setLabels(t, "pod-name:default/a", "k8s:app=a")
			n.setLabels(t, "pod-name:default/b", "k8s:app=b")
			rev := n.importPolicyRevision(t, `[{"endpointSelector":{"matchLabels":{"app":"b"}},"labels":["test=revoke-allow"],
				"ingress":[{"fromEndpoints":[{"matchLabels":{"app":"a"}}],"toPorts":[{"ports":[{"port":"7070","protocol":"TCP"}]}]}]}]`)
			n.waitRealized(t, "pod-name:default/b", rev)

			// An echo server in b: every line it reads goes to got, and
			// back to the client.
			var ln net.Listener
			inPodNetns(t, b, func() {
				var err error
				if ln, err = net.Listen("tcp4", ":7070"); err != nil {
					t.Error(err)
				}
			})
			if ln == nil {
				t.FailNow()
			}
			t.Cleanup(func() { ln.Close() })
			got := make(chan string, 16)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						close(got)
						return
					}
					got <- strings.TrimSpace(line)
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()

			var conn net.Conn
			inPodNetns(t, a, func() {
				var err error
				// The deadline only bounds a broken datapath.
				if conn, err = net.DialTimeout("tcp4", net.JoinHostPort(ipB, "7070"), 20*time.Second); err != nil {
					t.Error(err)
				}
			})
			if conn == nil {
				t.FailNow()
			}
			t.Cleanup(func() { conn.Close() })
			// Unacknowledged data fails the connection after 3 s, so a
			// dropped flow ends in an error the test can wait for.
			raw, err := conn.(*net.TCPConn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var serr error
			if err := raw.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, 3000)
			}); err != nil || serr != nil {
				t.Fatalf("TCP_USER_TIMEOUT: %v %v", err, serr)
			}
			cr := bufio.NewReader(conn)
			exchange := func(msg string) (string, error) {
				if _, err := conn.Write([]byte(msg + "\n")); err != nil {
					return "", err
				}
				// The deadline only bounds a broken test: the user
				// timeout ends a dropped flow long before.
				_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second))
				line, err := cr.ReadString('\n')
				return strings.TrimSpace(line), err
			}
			for _, msg := range []string{"one", "two"} {
				if echo, err := exchange(msg); err != nil || echo != msg {
					t.Fatalf("exchange %q under the allow: %q %v", msg, echo, err)
				}
				if s := <-got; s != msg {
					t.Fatalf("server got %q, want %q", s, msg)
				}
			}

			rev = n.importPolicyRevision(t, tc.change)
			n.waitRealized(t, "pod-name:default/b", rev)

			start := time.Now()
			echo, err := exchange("three")
			t.Logf("after the change: %q %v (%v)", echo, err, time.Since(start))
			if !tc.revoked {
				if err != nil || echo != "three" {
					t.Fatalf("with --policy-revoke-established=%s the established flow stopped: %q %v", tc.mode, echo, err)
				}
				if s := <-got; s != "three" {
					t.Fatalf("server got %q", s)
				}
				return
			}
			if !errors.Is(err, syscall.ETIMEDOUT) {
				t.Fatalf("after the change the exchange ended with %q %v, want the connection timed out", echo, err)
			}
			// The server never got the message: it was dropped, not
			// delivered and unanswered.
			select {
			case s, ok := <-got:
				if ok {
					t.Fatalf("the server got %q after the change", s)
				}
			default:
			}
			m, err := maps.OpenPinned(n.bpfRoot, true)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			reason := maps.ReasonPolicyDenyRule
			if tc.change == allowOther {
				reason = maps.ReasonPolicyDenied
			}
			if row, err := m.MetricsMap().Lookup(reason, maps.DirIngress); err != nil || row.Packets == 0 {
				t.Errorf("no ingress drop counted under %s: %+v %v", maps.ReasonName(reason), row, err)
			}
		})
	}
}
