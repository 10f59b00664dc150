package agent_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedAgentNamesMissingBPFFS: an agent whose view of the node
// has no bpffs at /sys/fs/bpf (a pod without the chart's bpffs mount; here
// a mount namespace of its own with /sys/fs/bpf unmounted, and a network
// namespace of its own) still starts its datapath, and both its log and
// `tendril status` say that the pinned state will not outlive its mount;
// with --require-node-bpffs (the chart's) its health is Degraded (`status
// --brief`, the chart's probes, fails), without it (an agent on the node
// itself, which mounts the node's bpffs) it is not. The same agent with
// the machine's bpffs says nothing of the kind.
func TestPrivilegedAgentNamesMissingBPFFS(t *testing.T) {
	testutil.Privileged(t)
	// The machine's bpffs (a fresh machine has none until something
	// mounts it, as lab up does).
	if _, err := bpffs.EnsureMounted(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name             string
		unmount, require bool
	}{{"node bpffs", false, true}, {"no bpffs", true, true}, {"no bpffs, not required", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			agent, err := builder.Build("tendril-agent")
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			sock := filepath.Join(dir, "t.sock")
			script := `mount --make-rprivate /
if [ "$UNMOUNT" = 1 ]; then while umount -l /sys/fs/bpf 2>/dev/null; do :; done; fi
ip link set lo up
exec "$@"`
			unmount := "0"
			if tc.unmount {
				unmount = "1"
			}
			cmd := exec.Command("unshare", "--mount", "--net", "--", "sh", "-c", script, "sh", agent,
				"--state-dir", filepath.Join(dir, "state"), "--socket", sock,
				"--bpf-root", "/sys/fs/bpf/tendril-bpffs-"+filepath.Base(dir), "--prometheus-serve-addr", "",
				"--node-name", "bpffs-node", "--install-host-networking=false", "--enable-health-checking=false",
				"--require-node-bpffs="+strconv.FormatBool(tc.require))
			cmd.Env = append(cmd.Environ(), "UNMOUNT="+unmount)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			// Not waitServing: without bpffs the agent serves, unhealthy.
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			var out string
			deadline := time.Now().Add(60 * time.Second)
			for time.Now().Before(deadline) {
				select {
				case <-exited:
					t.Fatalf("agent exited: %s", stderr.String())
				default:
				}
				out, _, _ = runCLI(t, sock, "status")
				if strings.Contains(out, "bpf root") {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !strings.Contains(out, "bpf root") {
				t.Fatalf("status has no Datapath section:\n%s", out)
			}
			const said = "was not mounted at /sys/fs/bpf"
			if got := strings.Contains(out, said); got != tc.unmount {
				t.Errorf("status names the missing bpffs: %v, want %v:\n%s", got, tc.unmount, out)
			}
			if got := strings.Contains(stderr.String(), "bpffs was not mounted"); got != tc.unmount {
				t.Errorf("log names the missing bpffs: %v, want %v:\n%s", got, tc.unmount, stderr.String())
			}
			// The bpffs health module is Degraded without the node's
			// bpffs when it is required, so `status --brief` (the chart's
			// probes) fails and names it; otherwise there is no such
			// module.
			brief, briefErr, code := runCLI(t, sock, "status", "--brief")
			degraded := tc.unmount && tc.require
			if got := strings.Contains(brief+briefErr, "bpffs: "+said); got != degraded || (degraded && code == 0) {
				t.Errorf("status --brief names the missing bpffs: %v (exit %d), want %v:\n%s%s", got, code, degraded, brief, briefErr)
			}
		})
	}
}
