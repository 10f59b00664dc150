package plugin

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPluginStaysSmall guards what makes the plugin cheap to start (one
// process per pod attachment): no cgo (package net links the C resolver and
// makes the binary dynamic), no netlink, no Cilium models, no net/http.
func TestPluginStaysSmall(t *testing.T) {
	goBin, err := exec.LookPath("go")
	// Under CI=true a missing go command fails instead of skipping.
	testutil.Require(t, err == nil, "no go command to list the plugin's imports")
	out, err := exec.Command(goBin, "list", "-deps", "github.com/tendril-net/tendril/cmd/tendril-cni").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list found only %v", deps)
	}
	for _, d := range deps {
		switch {
		case d == "runtime/cgo", d == "net", d == "net/http",
			strings.HasPrefix(d, "github.com/vishvananda/"),
			strings.HasPrefix(d, "github.com/cilium/"),
			strings.HasPrefix(d, "github.com/containernetworking/"):
			t.Errorf("tendril-cni imports %s", d)
		}
	}
}
