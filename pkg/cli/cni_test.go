package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// TestCNIInstallUninstall: install copies the plugin executable and writes
// a configuration list libcni loads, naming the plugin and the agent's
// socket; uninstall removes both and is quiet when they are gone.
func TestCNIInstallUninstall(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src-tendril-cni")
	if err := os.WriteFile(src, []byte("plugin bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := cniInstall{Source: src, BinDir: filepath.Join(dir, "bin"), ConfDir: filepath.Join(dir, "net.d"),
		ConfName: "05-tendril.conflist", AgentSocket: "/var/run/tendril/tendril.sock", MTU: 1450}
	if err := c.install(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(c.BinDir, "tendril-cni"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Errorf("plugin mode %v, want 0755", fi.Mode().Perm())
	}
	list, err := libcni.ConfListFromFile(filepath.Join(c.ConfDir, c.ConfName))
	if err != nil {
		t.Fatal(err)
	}
	if list.Name != "tendril" || list.CNIVersion != "1.1.0" || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "tendril-cni" {
		t.Fatalf("configuration %+v", list)
	}
	if got := string(list.Plugins[0].Bytes); !strings.Contains(got, `"agent-socket":"/var/run/tendril/tendril.sock"`) || !strings.Contains(got, `"mtu":1450`) {
		t.Errorf("plugin configuration %s", got)
	}
	entries, _ := os.ReadDir(c.ConfDir)
	if len(entries) != 1 {
		t.Errorf("conf dir has %d entries (a temporary file left?)", len(entries))
	}
	if err := c.uninstall(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(c.BinDir, "tendril-cni"), filepath.Join(c.ConfDir, c.ConfName)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there after uninstall (%v)", p, err)
		}
	}
	if err := c.uninstall(); err != nil {
		t.Errorf("second uninstall: %v", err)
	}
	c.Source = filepath.Join(dir, "missing")
	if err := c.install(); err == nil {
		t.Error("install from a missing plugin binary: no error")
	}
	if _, err := os.Stat(filepath.Join(c.ConfDir, c.ConfName)); !os.IsNotExist(err) {
		t.Error("a failed install wrote the configuration")
	}
}
