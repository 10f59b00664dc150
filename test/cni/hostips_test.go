package cni_test

import (
	"context"
	"net/http"
	"os/exec"
	"testing"

	"github.com/cilium/cilium/api/v1/models"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedHostIPsFollowAddresses: an address added to the node is
// in the ipcache as host within the address-change notification, and
// leaves when the address is removed.
func TestPrivilegedHostIPsFollowAddresses(t *testing.T) {
	testutil.Privileged(t)
	n := startNode(t, "--ipv6-range", "none")
	hostEntry := func(prefix string) bool {
		var entries []*models.IPListEntry
		if err := n.agent.Do(context.Background(), http.MethodGet, "/ip", nil, nil, nil, &entries); err != nil {
			return false
		}
		for _, e := range entries {
			if *e.Cidr == prefix && *e.Identity == 1 {
				return true
			}
		}
		return false
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("nsenter", append([]string{"--net=" + n.netns, "ip"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	run("addr", "add", "198.51.100.7/32", "dev", "lo")
	eventually(t, "the new node address as host", func() bool { return hostEntry("198.51.100.7/32") })
	run("addr", "del", "198.51.100.7/32", "dev", "lo")
	eventually(t, "the removed address gone", func() bool { return !hostEntry("198.51.100.7/32") })
}
