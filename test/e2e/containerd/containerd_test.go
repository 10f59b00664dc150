// Package containerd_test proves Tendril on real Kubernetes node software:
// `tendril lab up --runtime containerd` runs each lab node as the upstream
// kubelet and containerd (with runc), installs Tendril with its Helm chart
// from freshly built images, and `tendril connectivity test` must pass
// against it; `tendril lab down` must then leave nothing behind. A package
// of its own: the e2e package's TestMain brings up the default lab, which
// this test does not need.
package containerd_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/images"
	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/lab/realnode"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/binaries"
	"github.com/tendril-net/tendril/pkg/testutil/netpolmatrix"
)

// labName keeps the test's lab apart from a person's and from the e2e
// package's; TENDRIL_E2E_LAB (plus "cd") picks another.
var labName = cmp.Or(os.Getenv("TENDRIL_E2E_LAB"), "tdre2e") + "cd"

func moduleRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// buildLab builds what `lab up --runtime containerd` runs from this
// checkout: the lab's binaries (tendril, tendril-agent, tendril-cni,
// tendril-pause, tendril-workload) and the image archives of `make images`. The control
// plane and node binaries lab up builds itself when missing
// (hack/k8s-binaries.sh, hack/node-binaries.sh).
func buildLab(t *testing.T) (binDir, imagesDir string) {
	binDir, imagesDir = t.TempDir(), t.TempDir()
	b := binaries.NewBuilder(binDir)
	for _, name := range []string{"tendril", "tendril-agent", "tendril-cni", lab.PauseBinary, lab.WorkloadBinary} {
		p, err := b.Build(name)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(p) != binDir {
			if err := os.Symlink(p, filepath.Join(binDir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	begin := time.Now()
	imgBin := filepath.Join(imagesDir, "bin")
	if err := images.BuildBinaries(context.Background(), moduleRoot(t), imgBin, "e2e", "e2e"); err != nil {
		t.Fatal(err)
	}
	if _, err := images.BuildAll(images.Specs(imgBin, images.Meta{Repository: images.DefaultRepository, Version: "e2e",
		Revision: "e2e", Created: time.Unix(0, 0).UTC()}), imagesDir); err != nil {
		t.Fatal(err)
	}
	t.Logf("images built in %s", time.Since(begin).Round(time.Millisecond))
	return binDir, imagesDir
}

// previousReleaseTag tags the previous release's images.
const previousReleaseTag = "previous"

// buildPreviousRelease extracts the tree of the previous release (the
// commit hack/previous-release names, from this clone's history) and
// builds its images there as `make images` would, tagged
// previousReleaseTag: what a cluster runs before it upgrades. Its chart is
// the one the lab installs first.
func buildPreviousRelease(t *testing.T) (chartDir, imagesDir string) {
	root := moduleRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "hack", "previous-release"))
	if err != nil {
		t.Fatal(err)
	}
	var commit string
	for line := range strings.Lines(string(data)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			commit = line
		}
	}
	if !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(commit) {
		t.Fatalf("hack/previous-release: want a full commit hash, got %q", commit)
	}
	begin := time.Now()
	// A shallow clone may lack the commit: fetch it from the clone's
	// origin (the repository it was cloned from) before giving up.
	if exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run() != nil {
		if out, err := exec.Command("git", "-C", root, "fetch", "--quiet", "--depth=1", "origin", commit).CombinedOutput(); err != nil {
			t.Fatalf("the previous release %s is not in this clone's history, and fetching it from origin failed: %v\n%s", commit, err, out)
		}
	}
	src, imagesDir := t.TempDir(), t.TempDir()
	archive := filepath.Join(t.TempDir(), "src.tar")
	if out, err := exec.Command("git", "-C", root, "archive", "--format=tar", "-o", archive, commit).CombinedOutput(); err != nil {
		t.Fatalf("git archive of the previous release %s (is it in this clone's history?): %v\n%s", commit, err, out)
	}
	if out, err := exec.Command("tar", "-xf", archive, "-C", src).CombinedOutput(); err != nil {
		t.Fatalf("extract the previous release: %v\n%s", err, out)
	}
	cmd := exec.Command("go", "run", "./hack/images", "--out", imagesDir, "--version", previousReleaseTag, "--revision", commit)
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the previous release's images (go run ./hack/images in %s): %v\n%s", commit, err, out)
	}
	t.Logf("the previous release %s: tree and images built in %s", commit[:12], time.Since(begin).Round(time.Millisecond))
	return filepath.Join(src, "deploy", "helm", "tendril"), imagesDir
}

// TestMain: the test binary is also the policy matrix's prober, started
// inside a pod.
func TestMain(m *testing.M) {
	netpolmatrix.RunProberIfAsked()
	os.Exit(m.Run())
}

// TestPrivilegedLabContainerdConnectivity brings up a two-node lab of
// real nodes with the previous release installed, upgrades it with helm
// to the tree under test under traffic, runs the connectivity test
// against it (every check must pass), and takes it down: no process,
// mount, cgroup or network namespace of the lab may be left.
func TestPrivilegedLabContainerdConnectivity(t *testing.T) {
	testutil.Privileged(t)
	binDir, imagesDir := buildLab(t)
	prevChart, prevImages := buildPreviousRelease(t)
	tendril := filepath.Join(binDir, "tendril")
	down := func() (string, error) {
		out, err := exec.Command(tendril, "lab", "down", "--name", labName).CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if out, err := down(); err != nil {
			t.Errorf("lab down: %v\n%s", err, out)
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	begin := time.Now()
	out, err := exec.CommandContext(ctx, tendril, "lab", "up", "--name", labName, "--runtime", lab.RuntimeContainerd,
		"--nodes", "2", "--pods-per-node", "1", "--bin-dir", binDir, "--images-dir", prevImages, "--chart-dir", prevChart).CombinedOutput()
	t.Logf("tendril lab up --runtime containerd (%s):\n%s", time.Since(begin).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	st, err := lab.LoadState(labName)
	if err != nil {
		t.Fatal(err)
	}
	if st.Runtime != lab.RuntimeContainerd || st.WorkloadImage != images.DefaultRepository+"/workload:"+previousReleaseTag {
		t.Fatalf("lab state: runtime %q, workload image %q", st.Runtime, st.WorkloadImage)
	}

	// From the previous release to this tree's images and chart, under
	// traffic; everything after runs on the upgraded release.
	if !t.Run("helm upgrade from the previous release under traffic", func(t *testing.T) { upgradeUnderTraffic(t, st, tendril, imagesDir, "e2e") }) {
		t.FailNow()
	}

	begin = time.Now()
	out, err = exec.CommandContext(ctx, tendril, "connectivity", "test", "--lab", labName).CombinedOutput()
	t.Logf("tendril connectivity test (%s):\n%s", time.Since(begin).Round(time.Millisecond), out)
	if err != nil {
		t.Errorf("connectivity test: %v", err)
	}
	if m := regexp.MustCompile(`(\d+) checks: (\d+) passed, 0 failed`).FindStringSubmatch(string(out)); m == nil || m[1] != m[2] {
		t.Errorf("no all-passed summary in the connectivity test's output")
	}
	for _, want := range []string{"pod to pod, other node, TCP", "Service by DNS name, other node, UDP",
		"other client denied via the ClusterIP", "world to a LoadBalancer address on-link (L2 announcement), TCP: both servers"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the connectivity test's output lacks check %q", want)
		}
	}

	// lab status and lab env name the chart's agents' sockets (the
	// nodes' bound /var/run/tendril): the status answers through them,
	// and the CLI reaches node2's agent by the exported socket.
	out, err = exec.Command(tendril, "lab", "status", "--name", labName).CombinedOutput()
	if err != nil || strings.Count(string(out), "serving") != len(st.Nodes) || !strings.Contains(string(out), "tendril-run/tendril.sock") {
		t.Errorf("lab status: %v: want every node's agent serving at its tendril-run socket:\n%s", err, out)
	}
	out, err = exec.Command("bash", "-c", `eval "$("$0" lab env --name "$1")" && "$0" -H "$TENDRIL_SOCK_NODE2" status`, tendril, labName).CombinedOutput()
	if err != nil {
		t.Errorf("tendril status through lab env's TENDRIL_SOCK_NODE2: %v\n%s", err, out)
	}

	// The health endpoint (on by default) works from the chart's
	// unprivileged container: made in the node's namespace, published,
	// probed across nodes.
	healthEndpointsReachable(t, st, tendril)

	// The agent, in an unprivileged container whose /proc/sys is
	// read-only, reserves the masquerade ports in its node's network
	// namespace through the chart's /host/proc/sys/net mount (--procfs).
	for _, n := range st.Nodes {
		out, err := exec.Command("nsenter", "--net="+lab.NetnsPath(n.Netns), "cat", "/proc/sys/net/ipv4/ip_local_reserved_ports").CombinedOutput()
		if err != nil {
			t.Fatalf("node %s: read ip_local_reserved_ports: %v: %s", n.Name, err, out)
		}
		if !slices.Contains(strings.Split(strings.TrimSpace(string(out)), ","), "61000-65535") {
			t.Errorf("node %s: ip_local_reserved_ports %q lacks the masquerade range 61000-65535", n.Name, strings.TrimSpace(string(out)))
		}
	}

	// The x/y/z NetworkPolicy matrix, unchanged, on pods that are
	// containers of the workload image on the real nodes.
	t.Run("policy matrix (x, y, z) on real pods", func(t *testing.T) {
		cs, err := st.Clientset()
		if err != nil {
			t.Fatal(err)
		}
		var nodes []string
		for _, n := range st.Nodes {
			nodes = append(nodes, n.Name)
		}
		netpolmatrix.Run(t, netpolmatrix.Lab{Name: st.Name, Tendril: tendril, Clientset: cs, Nodes: nodes,
			Pod: func(ns, name, node string, labels map[string]string) *corev1.Pod {
				return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
					Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{lab.WorkloadContainer(st.WorkloadImage)}}}
			}})
	})
	t.Run("Hubble over TLS", func(t *testing.T) { hubbleOverTLS(t, st) })
	t.Run("bpffs taken away from an agent pod", func(t *testing.T) { bpffsTakenAway(t, st, tendril) })

	// The upgrade's pods, one per node, are the traffic the datapath must
	// keep forwarding once the release is gone.
	t.Run("helm uninstall leaves what install.md says", func(t *testing.T) {
		uninstallLeavesWhatTheDocsSay(t, st, tendril, "upgrade-server", "upgrade-client")
	})

	procs, err := lab.ReadProcesses(st.PidDir())
	if err != nil || len(procs) == 0 {
		t.Fatalf("no recorded processes (%v)", err)
	}
	if out, err := down(); err != nil {
		t.Fatalf("lab down: %v\n%s", err, out)
	}
	checkNothingLeft(t, st, procs)

	t.Run("the same images in the lab's default mode", func(t *testing.T) { defaultLabFromImages(t, tendril, imagesDir) })
}

// defaultLabFromImages runs the lab's default mode (its own kubelet, pods
// as namespaces) on the binaries the images carry: tendril-agent,
// tendril-cni and tendril from the agent image, tendril-operator from the
// operator's, tendril-workload from the workload image, extracted as a
// runtime would; the connectivity test must
// pass on them. The lab's own commands (lab up, its kubelets' side) are
// the tree's tendril, since the image's is built without the source tree
// the lab reads its scripts from.
func defaultLabFromImages(t *testing.T, tendril, imagesDir string) {
	root := t.TempDir()
	for _, name := range []string{"agent", "operator", "workload"} {
		a, err := images.ReadArchive(filepath.Join(imagesDir, name+".tar"), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if err := images.ExtractFiles(a.Image, root); err != nil {
			t.Fatal(err)
		}
	}
	binDir := filepath.Join(root, images.BinDir)
	name := labName + "img"
	if len(name) > 12 {
		name = name[:12]
	}
	down := func() { _ = exec.Command(tendril, "lab", "down", "--name", name).Run() }
	t.Cleanup(down)
	begin := time.Now()
	out, err := exec.Command(tendril, "lab", "up", "--name", name, "--nodes", "2", "--pods-per-node", "1", "--bin-dir", binDir).CombinedOutput()
	if err != nil {
		t.Fatalf("lab up on the images' binaries: %v\n%s", err, out)
	}
	t.Logf("lab up on the images' binaries in %s", time.Since(begin).Round(time.Millisecond))
	begin = time.Now()
	out, err = exec.Command(tendril, "connectivity", "test", "--lab", name).CombinedOutput()
	t.Logf("tendril connectivity test (%s):\n%s", time.Since(begin).Round(time.Millisecond), out)
	if err != nil {
		t.Errorf("connectivity test: %v", err)
	}
	if m := regexp.MustCompile(`(\d+) checks: (\d+) passed, 0 failed`).FindStringSubmatch(string(out)); m == nil || m[1] != m[2] {
		t.Errorf("no all-passed summary in the connectivity test's output")
	}
}

// checkNothingLeft fails for anything of the lab that `lab down` left:
// its recorded processes and any process naming its directory (the
// containerd shims), mounts under its directories (the nodes' mount
// namespaces, the kubelets' and runc's mounts), its cgroups in every
// hierarchy (a cgroup that holds a process cannot be removed) and its
// network namespaces.
func checkNothingLeft(t *testing.T, st *lab.State, procs []lab.Process) {
	t.Helper()
	for _, p := range procs {
		if p.Alive() {
			t.Errorf("%s (pid %d) still running", p.Role, p.PID)
		}
	}
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err == nil && lab.CmdlineNamesDir(cmdline, st.Dir) {
			t.Errorf("process %s still runs: %s", ent.Name(), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
	mounts, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer mounts.Close()
	sc := bufio.NewScanner(mounts)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 4 && (strings.HasPrefix(f[4], st.Dir) || strings.HasPrefix(f[4], lab.BPFDir(st.Name))) {
			t.Errorf("mount left: %s", sc.Text())
		}
	}
	paths := []string{st.Dir, lab.BPFDir(st.Name)}
	for _, n := range st.Nodes {
		paths = append(paths, n.Cgroup, filepath.Dir(n.Cgroup))
	}
	hs, err := realnode.Hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		paths = append(paths, filepath.Join(h.Mount, lab.CgroupSubdir, st.Name))
	}
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind (%v)", p, err)
		}
	}
	if left, _ := lab.ListNetns(lab.NetnsPrefix(st.Name)); len(left) > 0 {
		t.Errorf("network namespaces left: %v", left)
	}
}
