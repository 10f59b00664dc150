package realnode

import (
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	"sigs.k8s.io/yaml"
)

func testNode() Node {
	return Node{
		Name: "node1", Dir: "/var/run/tendril-lab/x/nodes/node1", NetnsPath: "/run/netns/x-node1",
		Address: "172.30.0.11", Kubeconfig: "/var/run/tendril-lab/x/kubeconfig-node",
		CgroupRoot: "/tendril-lab.x.node1", PauseImage: PauseImageRef,
		ClusterDNS: "10.96.0.10", ClusterDomain: "cluster.local",
	}
}

// The containerd configuration parses as TOML and says, at the keys
// containerd 2.x reads, what the node needs: its own root, state and
// socket; CNI from the node's dirs; the lab's pause image; cgroupfs.
func TestContainerdConfigTOML(t *testing.T) {
	n := testNode()
	var cfg map[string]any
	if err := toml.Unmarshal([]byte(ContainerdConfigTOML(n)), &cfg); err != nil {
		t.Fatalf("not TOML: %v\n%s", err, ContainerdConfigTOML(n))
	}
	get := func(path ...string) any {
		var cur any = cfg
		for _, p := range path {
			m, ok := cur.(map[string]any)
			if !ok {
				t.Fatalf("%v: %q is not a table", path, p)
			}
			cur = m[p]
		}
		return cur
	}
	checks := []struct {
		path []string
		want any
	}{
		{[]string{"version"}, int64(3)},
		{[]string{"root"}, n.ContainerdRoot()},
		{[]string{"state"}, n.ContainerdState()},
		{[]string{"grpc", "address"}, n.ContainerdSocket()},
		{[]string{"plugins", "io.containerd.cri.v1.images", "pinned_images", "sandbox"}, PauseImageRef},
		{[]string{"plugins", "io.containerd.cri.v1.runtime", "cni", "conf_dir"}, n.CNIConfDir()},
		{[]string{"plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "runc", "options", "SystemdCgroup"}, false},
		{[]string{"plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "runc", "options", "Root"}, n.RuncRoot()},
		{[]string{"plugins", "io.containerd.grpc.v1.cri", "disable_tcp_service"}, true},
		{[]string{"plugins", "io.containerd.cri.v1.runtime", "restrict_oom_score_adj"}, true},
	}
	for _, c := range checks {
		if got := get(c.path...); got != c.want {
			t.Errorf("%s = %v, want %v", strings.Join(c.path, "."), got, c.want)
		}
	}
	bins, _ := get("plugins", "io.containerd.cri.v1.runtime", "cni", "bin_dirs").([]any)
	if len(bins) != 1 || bins[0] != n.CNIBinDir() {
		t.Errorf("cni bin_dirs = %v, want [%s]", bins, n.CNIBinDir())
	}
	// A path with a quote or backslash stays one TOML string.
	odd := n
	odd.Dir = `/tmp/a"b\c`
	if err := toml.Unmarshal([]byte(ContainerdConfigTOML(odd)), &cfg); err != nil {
		t.Fatalf("odd path: %v", err)
	}
	if cfg["root"] != odd.ContainerdRoot() {
		t.Errorf("odd path: root = %v, want %s", cfg["root"], odd.ContainerdRoot())
	}
}

// The kubelet configuration parses as YAML with what this machine's
// kubelet needs (FACTS: failCgroupV1 false, cgroupfs, a cgroupRoot).
func TestKubeletConfigYAML(t *testing.T) {
	n := testNode()
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(KubeletConfigYAML(n, "/ca.crt")), &cfg); err != nil {
		t.Fatalf("not YAML: %v", err)
	}
	want := map[string]any{
		"kind":                     "KubeletConfiguration",
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               n.CgroupRoot,
		"containerRuntimeEndpoint": "unix://" + n.ContainerdSocket(),
		"address":                  n.Address,
		"podLogsDir":               n.PodLogsDir(),
		"readOnlyPort":             float64(0),
	}
	for k, v := range want {
		if cfg[k] != v {
			t.Errorf("%s = %v (%T), want %v", k, cfg[k], cfg[k], v)
		}
	}
	if x509, _ := cfg["authentication"].(map[string]any)["x509"].(map[string]any); x509["clientCAFile"] != "/ca.crt" {
		t.Errorf("authentication.x509 = %v", x509)
	}
	if dns, _ := cfg["clusterDNS"].([]any); len(dns) != 1 || dns[0] != n.ClusterDNS {
		t.Errorf("clusterDNS = %v", cfg["clusterDNS"])
	}
	args := strings.Join(KubeletArgs(n), " ")
	for _, w := range []string{"--hostname-override node1", "--node-ip 172.30.0.11", "--root-dir " + n.KubeletDir(), "--kubeconfig " + n.Kubeconfig} {
		if !strings.Contains(args, w) {
			t.Errorf("kubelet args %q lack %q", args, w)
		}
	}
	n.Address6 = "fd00:172:30::11"
	if args := strings.Join(KubeletArgs(n), " "); !strings.Contains(args, "--node-ip 172.30.0.11,fd00:172:30::11 ") {
		t.Errorf("dual stack: kubelet args %q lack both node IPs, IPv4 first", args)
	}
}

func TestParseHierarchies(t *testing.T) {
	mounts := `tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
cgroup /mnt/again cgroup rw,nosuid,cpu 0 0
/dev/vda / ext4 rw 0 0
`
	hs, err := parseHierarchies(strings.NewReader(mounts))
	if err != nil {
		t.Fatal(err)
	}
	want := []Hierarchy{
		{Mount: "/sys/fs/cgroup/cpu"},
		{Mount: "/sys/fs/cgroup/cpuset", Cpuset: true},
		{Mount: "/sys/fs/cgroup/systemd"},
		{Mount: "/sys/fs/cgroup/unified", V2: true},
	}
	if len(hs) != len(want) {
		t.Fatalf("hierarchies %+v, want %+v", hs, want)
	}
	for i := range want {
		if hs[i] != want[i] {
			t.Errorf("hierarchy %d = %+v, want %+v", i, hs[i], want[i])
		}
	}
	if _, err := parseHierarchies(strings.NewReader("/dev/vda / ext4 rw 0 0\n")); err == nil {
		t.Error("no cgroup mounts: no error")
	}
}

func TestRemoveCgroupRootRefusesRoot(t *testing.T) {
	for _, root := range []string{"", "/", "/a/../.."} {
		if _, err := RemoveCgroupRoot(nil, root); err == nil {
			t.Errorf("RemoveCgroupRoot(%q): no error", root)
		}
	}
}
