package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/datapath/maps"
	"github.com/tendril-net/tendril/pkg/lab"
)

// liveFlowsOf lists the conntrack entries in the node's pinned maps that
// the datapath would still match and that have addr on a side.
func liveFlowsOf(root string, addr netip.Addr) ([]string, error) {
	m, err := maps.OpenPinned(root, true)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	now := maps.MonotonicNow()
	var out []string
	err = m.CTMap().Iterate(func(e maps.CTEntry) bool {
		if (e.Src.Unmap() == addr || e.Dst.Unmap() == addr) && e.Expires > now {
			out = append(out, fmt.Sprintf("%d %s:%d -> %s:%d", e.Proto, e.Src, e.SrcPort, e.Dst, e.DstPort))
		}
		return true
	})
	return out, err
}

// TestPrivilegedLabRemotePodFlowsEnd: a pod on node2 streams TCP to a
// pod on node1 and is deleted mid-stream, its end never seen by node1
// (the namespace and veth go before the process that held the socket).
// node1's conntrack entries of the gone pod's address must go soon after
// its address leaves the ipcache: left until they expire (hours for an
// established TCP flow) they would admit a pod later given the address,
// on the same ports, as an established flow.
func TestPrivilegedLabRemotePodFlowsEnd(t *testing.T) {
	e := labUp(t)
	ctx := context.Background()
	const ns = "e2e-peergone"
	e.createNamespace(t, ns)
	t.Cleanup(func() { _ = e.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })
	node1, node2 := e.st.Nodes[0], e.st.Nodes[1]
	e.createPod(t, ns, "server", node1.Name, nil)
	e.createPod(t, ns, "client", node2.Name, nil)
	srv := e.waitReady(t, ns, "server")
	cl := e.waitReady(t, ns, "client")
	clientIP := netip.MustParseAddr(cl.Status.PodIP)
	rec, err := e.st.Pod(ns, "client")
	if err != nil {
		t.Fatal(err)
	}

	server := exec.Command(tendrilBin, "lab", "--name", labName, "exec", ns+"/server", "--", "iperf3", "-s", "-1", "-p", "5201")
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Process.Kill(); _ = server.Wait() })
	time.Sleep(500 * time.Millisecond) // iperf3 -s listening
	client := exec.Command(tendrilBin, "lab", "--name", labName, "exec", ns+"/client", "--",
		"iperf3", "-c", srv.Status.PodIP, "-p", "5201", "-t", "60", "-b", "10M")
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Process.Kill(); _ = client.Wait() })

	eventually(t, "node1 tracking the client's stream", func() (bool, error) {
		flows, err := liveFlowsOf(node1.BPFRoot, clientIP)
		return len(flows) > 0, fmt.Errorf("flows of %s: %v (%v)", clientIP, flows, err)
	})
	zero := int64(0)
	if err := e.cs.CoreV1().Pods(ns).Delete(ctx, "client", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the client pod's namespace removed", func() (bool, error) {
		_, err := os.Stat(lab.NetnsPath(rec.Netns))
		return errors.Is(err, os.ErrNotExist), err
	})
	// The process that held the socket ends only now: its FIN has no way
	// out of the deleted namespace. The server stays as it is (idle, its
	// connection open): its own close would end the flow on node1 too.
	_ = client.Process.Kill()
	_ = client.Wait()
	eventually(t, "node1's flows of the gone pod ended", func() (bool, error) {
		flows, err := liveFlowsOf(node1.BPFRoot, clientIP)
		return err == nil && len(flows) == 0, fmt.Errorf("flows of %s still live on node1: %v (%v)", clientIP, flows, err)
	})
}
