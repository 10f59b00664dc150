package l7redirect

import (
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/netlab"
)

// InstallRoute in a node namespace whose loopback is down: the rule
// fwmark 0x200/0xf00 lookup 2005 and table 2005's local default route for
// each family, twice (idempotent). With IPv6 disabled on the node, the
// IPv4 ones only, and no error: the proxies still start for IPv4.
func TestPrivilegedInstallRoute(t *testing.T) {
	testutil.Privileged(t)
	for _, c := range []struct {
		name        string
		disableIPv6 bool
	}{{"dual_stack", false}, {"IPv6_disabled", true}} {
		t.Run(c.name, func(t *testing.T) {
			netlab.EnterNode(t, "tdrl7rt", "tdrl7rt-test")
			if c.disableIPv6 {
				for _, dev := range []string{"all", "default", "lo"} {
					// /proc/sys/net is the calling thread's namespace's.
					if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+dev+"/disable_ipv6", []byte("1"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			for range 2 {
				if err := InstallRoute(); err != nil {
					t.Fatal(err)
				}
			}
			for _, f := range []struct {
				family int
				want   int
			}{{unix.AF_INET, 1}, {unix.AF_INET6, map[bool]int{false: 1, true: 0}[c.disableIPv6]}} {
				rules, err := netlink.RuleList(f.family)
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for _, r := range rules {
					if r.Table == int(maps.ProxyMarkTable) && r.Mark == maps.ProxyMarkValue && r.Mask != nil && *r.Mask == maps.ProxyMarkMask {
						n++
					}
				}
				routes, err := netlink.RouteListFiltered(f.family, &netlink.Route{Table: int(maps.ProxyMarkTable)}, netlink.RT_FILTER_TABLE)
				if err != nil {
					t.Fatal(err)
				}
				local := 0
				for _, rt := range routes {
					if rt.Type == unix.RTN_LOCAL && (rt.Dst == nil || rt.Dst.IP.IsUnspecified()) {
						local++
					}
				}
				if n != f.want || local != f.want {
					t.Errorf("family %d: %d proxy rules and %d local default routes in table %d, want %d of each (%v, %v)",
						f.family, n, local, maps.ProxyMarkTable, f.want, rules, routes)
				}
			}
		})
	}
}
