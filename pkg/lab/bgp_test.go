package lab

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBirdConfigDual: a dual-stack lab's router has a second session per
// node over IPv6 and exports the IPv6 pool's addresses to the kernel; an
// IPv4 lab's has neither; BIRD parses both (bird -p) where it is
// installed.
func TestBirdConfigDual(t *testing.T) {
	nodes := []Node{{Name: "node1", Address: "172.30.0.11", Address6: "fd00:172:30::11"},
		{Name: "node2", Address: "172.30.0.12", Address6: "fd00:172:30::12"}}
	for _, tc := range []struct {
		family string
		want   []string
		absent []string
	}{
		{IPFamilyDual, []string{"protocol bgp node1 from tnode", "neighbor 172.30.0.11 as 65001;",
			"protocol bgp node2_v6 from tnode6", "neighbor fd00:172:30::12 as 65001;", "local " + WorldGateway6 + " as 65000;",
			"export where net ~ [ " + BGPPoolCIDR6 + "{128,128} ];"}, nil},
		{IPFamilyIPv4, []string{"protocol bgp node2 from tnode"}, []string{"_v6", "ipv6", BGPPoolCIDR6}},
	} {
		st := &State{IPFamily: tc.family, World: &World{Gateway: "172.30.0.1"}, Nodes: nodes}
		conf, err := birdConfig(st)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(conf), w) {
				t.Errorf("%s: bird.conf lacks %q:\n%s", tc.family, w, conf)
			}
		}
		for _, a := range tc.absent {
			if strings.Contains(string(conf), a) {
				t.Errorf("%s: bird.conf has %q:\n%s", tc.family, a, conf)
			}
		}
		if _, err := exec.LookPath("bird"); err != nil {
			continue
		}
		path := filepath.Join(t.TempDir(), "bird.conf")
		if err := os.WriteFile(path, conf, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("bird", "-p", "-c", path).CombinedOutput(); err != nil {
			t.Errorf("%s: bird -p: %v: %s\n%s", tc.family, err, out, conf)
		}
	}
}
