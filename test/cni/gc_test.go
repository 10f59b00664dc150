package cni_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/tendril-net/tendril/pkg/cni"
	"github.com/tendril-net/tendril/pkg/cni/cniserver"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// TestPrivilegedTendrilCNIGCSafety: CNI GC through the real plugin and
// agent removes nothing it cannot know to be stale. A GC without
// cni.dev/valid-attachments is refused (by the plugin, and by the agent
// when called directly); GC of another network leaves this network's pods
// alone; and pods whose ADD just finished survive a GC whose list does not
// name them yet (the agent's default grace period).
func TestPrivilegedTendrilCNIGCSafety(t *testing.T) {
	testutil.Privileged(t)
	n := startNode(t)
	list := n.confList("tendril-cni", "1.1.0", nil)
	a, b := n.newPod("pod-a"), n.newPod("pod-b")
	n.mustAdd(list, a)
	n.mustAdd(list, b)
	both := []string{cniserver.HostVethName(a.rt.ContainerID, "eth0"), cniserver.HostVethName(b.rt.ContainerID, "eth0")}
	slices.Sort(both)
	intact := func(what string) {
		t.Helper()
		v := n.hostVeths()
		slices.Sort(v)
		if !slices.Equal(v, both) {
			t.Errorf("%s: host veths %v, want both pods' %v", what, v, both)
		}
		pods := 0
		for _, ep := range n.endpoints() {
			if ids := ep.Status.ExternalIdentifiers; ids != nil && (ids.ContainerID == a.rt.ContainerID || ids.ContainerID == b.rt.ContainerID) {
				pods++
			}
		}
		if pods != 2 {
			t.Errorf("%s: %d pod endpoints, want 2", what, pods)
		}
	}
	ctx := context.Background()

	// The plugin run as a runtime would, with a GC configuration that has
	// no list (libcni with nil GCArgs sends it so).
	gcRuntime := n.runtime(t.TempDir())
	err := gcRuntime.GCNetworkList(ctx, list, nil)
	if err == nil {
		t.Error("GC without cni.dev/valid-attachments succeeded")
	} else if code := cniCode(t, err); code != cni.ErrInvalidNetworkConfig {
		t.Errorf("GC without the list: code %d (%v), want %d", code, err, cni.ErrInvalidNetworkConfig)
	}
	intact("after GC without a list")

	// The agent checks too: anything can call its API.
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "tendril-test", "type": "tendril-cni"})
	body, _ := json.Marshal(cni.Request{Config: conf})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", n.socket)
	}}, Timeout: time.Minute}
	resp, err := hc.Post("http://agent"+cni.CommandPath(cni.CommandGC), "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var answer cni.Error
	_ = json.NewDecoder(resp.Body).Decode(&answer)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || answer.Code != cni.ErrInvalidNetworkConfig {
		t.Errorf("agent's GC without the list: HTTP %d, %+v; want 400 with code %d", resp.StatusCode, answer, cni.ErrInvalidNetworkConfig)
	}
	intact("after the agent's GC without a list")

	// GC of another network, with nothing valid there.
	other := n.confList("tendril-cni", "1.1.0", nil)
	other.Name = "other-network"
	if err := gcRuntime.GCNetworkList(ctx, other, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{}}); err != nil {
		t.Fatalf("GC of another network: %v", err)
	}
	intact("after GC of another network")

	// GC of this network naming only pod-b: pod-a's ADD has just finished,
	// within the grace period, so the runtime's list may not know it yet.
	if err := gcRuntime.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: b.rt.ContainerID, IfName: "eth0"}}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	intact("after GC within the grace period")

	for _, p := range []*pod{a, b} {
		if err := n.del(list, p); err != nil {
			t.Errorf("DEL %s: %v", p.name, err)
		}
	}
	n.assertClean("DEL")
}
