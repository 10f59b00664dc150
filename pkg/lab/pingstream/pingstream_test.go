package pingstream

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/icmp"

	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// TestPrivilegedPingStreamLoopback: every request to loopback is
// answered and counted once, in both families, and the summary carries
// ping's line.
func TestPrivilegedPingStreamLoopback(t *testing.T) {
	testutil.Privileged(t)
	for _, dst := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()} {
		conn, err := Listen(dst)
		if err != nil {
			t.Fatal(err)
		}
		st, err := Run(context.Background(), conn, Config{Dst: dst, Interval: 2 * time.Millisecond, Count: 200, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s", st.Summary())
		if st.Sent != 200 || st.Received != 200 {
			t.Errorf("%s: sent %d, received %d, want 200 and 200", dst, st.Sent, st.Received)
		}
		if !strings.Contains(st.Summary(), "200 packets transmitted, 200 received") {
			t.Errorf("summary: %s", st.Summary())
		}
	}
}

// TestPrivilegedPingStreamCountsLosses: from a pod of a node namespace,
// the node's router address answers every request, and an address of the
// pod CIDR no pod holds answers none: every request is counted as sent,
// none as received, the gap covers the stream, and the context ends an
// unbounded stream.
func TestPrivilegedPingStreamCountsLosses(t *testing.T) {
	testutil.Privileged(t)
	node, err := netlab.NewNode("tdrps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })
	pod, err := node.AddPod("ps", 0)
	if err != nil {
		t.Fatal(err)
	}
	stream := func(dst netip.Addr, cfg Config, ctx context.Context) Stats {
		t.Helper()
		var conn *icmp.PacketConn
		if err := pod.Do(func() (err error) { conn, err = Listen(dst); return err }); err != nil {
			t.Fatal(err)
		}
		cfg.Dst = dst
		st, err := Run(ctx, conn, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s", st.Summary())
		return st
	}
	for _, dst := range []netip.Addr{netlab.Router4, netlab.Router6} {
		if st := stream(dst, Config{Interval: 2 * time.Millisecond, Count: 100, Wait: 2 * time.Second}, context.Background()); st.Sent != 100 || st.Received != 100 {
			t.Errorf("%s: sent %d, received %d, want 100 and 100", dst, st.Sent, st.Received)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	st := stream(netip.MustParseAddr("10.77.0.250"), Config{Interval: 5 * time.Millisecond, Wait: 100 * time.Millisecond}, ctx)
	if st.Sent < 2 || st.Received != 0 {
		t.Errorf("sent %d, received %d: want some sent, none received", st.Sent, st.Received)
	}
	if st.LongestGap < st.Elapsed {
		t.Errorf("longest gap %s shorter than the stream %s, which got no reply", st.LongestGap, st.Elapsed)
	}
}
