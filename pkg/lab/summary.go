package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/lab/workload"
)

// Clientset is an admin client of the lab's API server.
func (s *State) Clientset() (kubernetes.Interface, error) {
	rc, err := controlplane.RESTConfig(s.Kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

// Summary prints the lab's nodes (address, pod CIDR, agent) and its pods
// (node, address, readiness).
func Summary(ctx context.Context, st *State, cs kubernetes.Interface, out io.Writer) error {
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	byName := map[string]corev1.Node{}
	for _, n := range nodes.Items {
		byName[n.Name] = n
	}
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tPOD CIDR\tAGENT\tSOCKET")
	for _, n := range st.Nodes {
		agent := "not answering"
		if c, err := client.New(n.Socket); err == nil {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if _, err := c.ConfigGet(cctx); err == nil {
				agent = "serving"
			}
			cancel()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Name, n.Address, strings.Join(byName[n.Name].Spec.PodCIDRs, ","), agent, n.Socket)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	relay := "not answering"
	if rs, err := RelayStatus(ctx, st); err == nil {
		relay = fmt.Sprintf("%d/%d nodes connected", rs.GetNumConnectedNodes().GetValue(),
			rs.GetNumConnectedNodes().GetValue()+rs.GetNumUnavailableNodes().GetValue())
		if len(rs.GetUnavailableNodes()) > 0 {
			relay += ", unavailable: " + strings.Join(rs.GetUnavailableNodes(), ", ")
		}
	}
	if w := st.World; w != nil {
		server := "not answering"
		target := net.JoinHostPort(w.ServerIP, strconv.Itoa(WorldServerPorts[0]))
		_ = InNetns(NetnsPath(w.Netns), func() error {
			if a, err := workload.Probe(ctx, target, false, 2*time.Second); err == nil {
				server = fmt.Sprintf("answering (%q)", a)
			}
			return nil
		})
		fmt.Fprintf(out, "\nWORLD  %s: gateway %s on the bridge (the nodes' default route), server %s:%s tcp+udp %s, client %s; no route to the pod CIDRs\n",
			w.Netns, w.Gateway, w.ServerIP, workload.FormatPorts(WorldServerPorts), server, w.ClientIP)
	}
	fmt.Fprintf(out, "\nHUBBLE RELAY  unix://%s (and %s:%d in %s): %s\n", st.RelaySocket(), st.Nodes[0].Address, RelayPort, st.Nodes[0].Netns, relay)
	pods, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	if len(pods.Items) == 0 {
		return nil
	}
	sort.Slice(pods.Items, func(i, j int) bool {
		a, b := pods.Items[i], pods.Items[j]
		if a.Spec.NodeName != b.Spec.NodeName {
			return a.Spec.NodeName < b.Spec.NodeName
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tNODE\tIP\tSTATUS")
	for i := range pods.Items {
		p := &pods.Items[i]
		status := string(p.Status.Phase)
		if PodReady(p) {
			status += ", Ready"
		}
		if p.DeletionTimestamp != nil {
			status = "Terminating"
		}
		fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\n", p.Namespace, p.Name, p.Spec.NodeName, p.Status.PodIP, status)
	}
	return tw.Flush()
}
