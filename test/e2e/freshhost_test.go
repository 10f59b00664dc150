package e2e_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// runOnFreshHost runs script with bash inside a private mount namespace
// that looks like a fresh machine of the project's kind: /run is an empty
// tmpfs (so /run/netns is a plain directory, or missing) and no bpffs is
// mounted at /sys/fs/bpf. Whatever the script mounts dies with the
// namespace. $T is the tendril CLI, $BIN the directory of the binaries.
func runOnFreshHost(t *testing.T, script string) string {
	t.Helper()
	testutil.Privileged(t)
	testutil.Require(t, tendrilBin != "", "the tendril binaries were not built")
	prologue := `set -euo pipefail
while [[ $(stat -f -c %T /sys/fs/bpf) == bpf_fs ]]; do umount /sys/fs/bpf; done
mount -t tmpfs -o mode=0755 tmpfs /run
echo "fresh host: bpffs at /sys/fs/bpf: $(stat -f -c %T /sys/fs/bpf), /run/netns: $(ls -d /run/netns 2>&1 || true)"
`
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "--", "bash", "-c", prologue+script)
	cmd.Env = append(cmd.Environ(), "T="+tendrilBin, "BIN="+filepath.Dir(tendrilBin))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("on a fresh host: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	return string(out)
}

// TestPrivilegedLabUpWithoutBPFFS: on a machine where bpffs is not mounted
// (every fresh one), `tendril lab up` mounts it, says so, and the lab
// passes the connectivity test.
func TestPrivilegedLabUpWithoutBPFFS(t *testing.T) {
	out := runOnFreshHost(t, `
trap '"$T" lab --name tdrfresha down >/dev/null 2>&1 || true' EXIT
"$T" lab --name tdrfresha up --nodes 2 --pods-per-node 1 --bin-dir "$BIN"
[[ $(stat -f -c %T /sys/fs/bpf) == bpf_fs ]] || { echo "bpffs is still not mounted"; exit 1; }
"$T" connectivity test --lab tdrfresha
"$T" lab --name tdrfresha down
`)
	if !strings.Contains(out, "mounted bpffs at /sys/fs/bpf") {
		t.Errorf("lab up did not say that it mounted bpffs")
	}
}

// TestPrivilegedLabDownAfterIPNetnsAdd: with /run/netns a plain directory,
// a namespace added with iproute2 after `lab up` (which bind-mounts
// /run/netns over itself) does not stop `lab down` from removing every
// namespace of the lab, and the other namespace is kept.
func TestPrivilegedLabDownAfterIPNetnsAdd(t *testing.T) {
	runOnFreshHost(t, `
trap '"$T" lab --name tdrfreshb down >/dev/null 2>&1 || true' EXIT
"$T" lab --name tdrfreshb up --nodes 1 --pods-per-node 1 --bin-dir "$BIN"
ip netns add tdrfresh-other
"$T" lab --name tdrfreshb down
left=$(ls /run/netns | grep '^tdrfreshb-' || true)
[[ -z $left ]] || { echo "lab namespaces left after lab down: $left"; exit 1; }
[[ $(stat -f -c %T /run/netns/tdrfresh-other) == nsfs ]] || { echo "the other tool's namespace is gone"; exit 1; }
ip netns exec tdrfresh-other true
ip netns del tdrfresh-other
echo "lab down removed every lab namespace; the other namespace was kept"
`)
}
