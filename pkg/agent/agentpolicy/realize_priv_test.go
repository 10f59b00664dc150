package agentpolicy

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/tendril-net/tendril/pkg/bpffs"
	"github.com/tendril-net/tendril/pkg/datapath/bpf"
	bpfmaps "github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/endpoint"
	"github.com/tendril-net/tendril/pkg/identity"
	"github.com/tendril-net/tendril/pkg/testutil"
)

// pinnedPolicyMap creates the datapath's outer policy map pinned in a
// bpffs directory of its own, with tries of trieEntries entries.
func pinnedPolicyMap(t *testing.T, trieEntries uint32) (*bpfmaps.PolicyMap, string) {
	t.Helper()
	testutil.Privileged(t)
	if _, err := bpffs.EnsureMounted(); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/sys/fs/bpf", "tendril-pmap-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	spec, err := bpf.LoadLxc()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[bpfmaps.PolicyMapName].Copy()
	ms.Pinning = ebpf.PinByName
	outer, err := ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { outer.Close() })
	pm := bpfmaps.NewPolicyMap(outer, trieEntries)
	t.Cleanup(pm.Close)
	return pm, filepath.Join(dir, bpfmaps.PolicyMapName)
}

// pinnedState reads endpoint id's entries through a new handle on the pin,
// as the CLI or a restarted agent would.
func pinnedState(t *testing.T, pin string, id uint16) (policy map[bpfmaps.PolicyKey]bpfmaps.PolicyValue, pm *bpfmaps.PolicyMap) {
	t.Helper()
	outer, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { outer.Close() })
	pm = bpfmaps.NewPolicyMap(outer, 0)
	t.Cleanup(pm.Close)
	got, err := pm.DumpEndpoint(id)
	if err != nil {
		t.Fatal(err)
	}
	return got, pm
}

// TestPrivilegedRealizeFullPolicyMap: in a real pinned policy map whose
// tries hold 8 entries, a change that revokes the allow from host, denies
// world on TCP 22 and allows world on 10 more ports (30 entries) fails
// with the trie full, yet the pinned map no longer has the revoked allow
// and world is not let in on 22; the module's record is what the map
// holds; a later revision that fits converges to exactly its entries.
func TestPrivilegedRealizeFullPolicyMap(t *testing.T) {
	pm, pin := pinnedPolicyMap(t, 8)
	m := newTestModule(t)
	ep := &endpoint.Endpoint{ID: 11, Labels: []string{"k8s:app=web"}}
	host := bpfmaps.PolicyKey{EndpointID: 11, Direction: bpfmaps.DirIngress, Identity: uint32(identity.Host)}

	setRules(t, m, portsRule(true, false, 1000, 2))
	if err := m.Realize(t.Context(), ep, pm); err != nil {
		t.Fatalf("first revision: %v", err)
	}
	if got, _ := pinnedState(t, pin, ep.ID); len(got) != 7 || got[host] != (bpfmaps.PolicyValue{Cookie: got[host].Cookie}) {
		t.Fatalf("first revision in the pinned map: %v", got)
	}
	if v, found, err := pm.Decide(ep.ID, bpfmaps.DirIngress, uint32(identity.Host), 6, 22); err != nil || !found || v.Deny {
		t.Fatalf("host on TCP 22 before the change: %+v found=%v %v", v, found, err)
	}

	setRules(t, m, portsRule(false, true, 2000, 10))
	err := m.Realize(t.Context(), ep, pm)
	if !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.E2BIG) {
		t.Fatalf("a change of 33 entries into tries of 8 = %v, want the trie full", err)
	}
	got, fresh := pinnedState(t, pin, ep.ID)
	if _, ok := got[host]; ok {
		t.Fatal("the revoked allow from host is still in the pinned map after the failed change")
	}
	if v, found, err := fresh.Decide(ep.ID, bpfmaps.DirIngress, uint32(identity.Host), 6, 22); err != nil || (found && !v.Deny) {
		t.Fatalf("host on TCP 22 after the revoking change: %+v found=%v %v", v, found, err)
	}
	for _, id := range []identity.NumericIdentity{identity.World, identity.WorldIPv4, identity.WorldIPv6} {
		if v, found, err := fresh.Decide(ep.ID, bpfmaps.DirIngress, uint32(id), 6, 22); err != nil || (found && !v.Deny) {
			t.Errorf("identity %d on TCP 22 against the new deny: %+v found=%v %v", id, v, found, err)
		}
	}
	m.mu.Lock()
	believed := maps.Clone(m.realized[ep.ID])
	m.mu.Unlock()
	if !maps.Equal(mapStateOf(got), believed) {
		t.Errorf("the module believes the map holds\n%v\nbut it holds\n%v", believed, mapStateOf(got))
	}

	setRules(t, m, portsRule(false, true, 2000, 1))
	want := m.resolve(ep).MapState
	if err := m.Realize(t.Context(), ep, pm); err != nil {
		t.Fatalf("a change that fits: %v", err)
	}
	got, _ = pinnedState(t, pin, ep.ID)
	if !maps.Equal(mapStateOf(got), want) {
		t.Errorf("pinned map holds\n%v\nwant\n%v", mapStateOf(got), want)
	}
}
