package socklb

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/tendril-net/tendril/pkg/cgroups"
	"github.com/tendril-net/tendril/pkg/datapath/loader"
	"github.com/tendril-net/tendril/pkg/datapath/maps"
)

// TestPrivilegedSocketLBEventCarriesCgroup: a process in a container
// cgroup laid out as the kubelet does (kubepods/besteffort/pod<uid>/<ctr>
// under the cgroup the socket load-balancer is attached to) connects to a
// ClusterIP; the translation event carries that cgroup's ID, and the scan
// of the hierarchy names the pod UID of that ID.
func TestPrivilegedSocketLBEventCarriesCgroup(t *testing.T) {
	e := setupWith(t, true)
	const uid = "4f1d7a52-2a5e-4c1b-9a55-0d6b1f2e3c4d"
	pod := filepath.Join(e.cgroup, "kubepods", "besteffort", "pod"+uid)
	ctr := filepath.Join(pod, "0123456789abcdef")
	if err := os.MkdirAll(ctr, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range []string{ctr, pod, filepath.Dir(pod), filepath.Dir(filepath.Dir(pod))} {
			if err := os.Remove(d); err != nil {
				t.Errorf("remove cgroup %s: %v", d, err)
			}
		}
	})
	e.service(t, tcp("10.96.0.10", 80), maps.Service{ID: 1, RevNATID: 7}, 1, threeBackends()...)
	res := runHelper(t, ctr, helperRequest{TCPServers: threeTCP, Probes: []helperProbe{{Kind: "tcp", Dst: "10.96.0.10:80", Count: 1}}})
	checkOK(t, "probe", res[0][0])

	rd, err := ringbuf.NewReader(e.events)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	rd.SetDeadline(time.Now().Add(5 * time.Second))
	var got []loader.Event
	for {
		rec, err := rd.Read()
		if err != nil {
			break
		}
		ev, err := loader.DecodeEvent(rec.RawSample)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == loader.EventSockXlate {
			got = append(got, ev)
		}
	}
	want, err := cgroups.ID(ctr)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].CgroupID != want || got[0].SrcIdentity != 0 || got[0].DstIdentity != 0 {
		t.Fatalf("events %v (cgroup IDs %v), want one with cgroup %d and no identities", got, cgroupIDs(got), want)
	}
	cgs, err := cgroups.Scan(e.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range cgs {
		if c.ID == want {
			found = c.PodUID == uid && c.Container && c.Path == ctr
		}
	}
	if !found {
		t.Fatalf("scan of %s: %+v lacks container %s of pod %s (cgroup %d)", e.cgroup, cgs, ctr, uid, want)
	}
}

func cgroupIDs(evs []loader.Event) []uint64 {
	var out []uint64
	for _, ev := range evs {
		out = append(out, ev.CgroupID)
	}
	return out
}
