package lab

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/client"
	"github.com/tendril-net/tendril/pkg/controlplane"
	v1alpha1 "github.com/tendril-net/tendril/pkg/k8s/apis/tendril.io/v1alpha1"
	tendrilclient "github.com/tendril-net/tendril/pkg/k8s/client/clientset/versioned"
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

// clusterPoolCIDRs are the pod CIDRs in each node's TendrilNode, and a
// note for each node whose PodCIDRsAllocated condition is False (its
// agent waits for a CIDR that an exhausted pool cannot give).
func clusterPoolCIDRs(ctx context.Context, st *State) (cidrs map[string][]string, notes map[string]string, err error) {
	rc, err := controlplane.RESTConfig(st.Kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	tc, err := tendrilclient.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	list, err := tc.TendrilV1alpha1().TendrilNodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list TendrilNodes: %w", err)
	}
	cidrs, notes = map[string][]string{}, map[string]string{}
	for _, tn := range list.Items {
		cidrs[tn.Name] = tn.Spec.IPAM.PodCIDRs
		if c := meta.FindStatusCondition(tn.Status.Conditions, v1alpha1.NodeConditionPodCIDRsAllocated); c != nil && c.Status == metav1.ConditionFalse {
			notes[tn.Name] = fmt.Sprintf(" (TendrilNode %s=False, %s)", c.Type, c.Reason)
		}
	}
	return cidrs, notes, nil
}

// Summary prints the lab's nodes (address, pod CIDR, agent) and its pods
// (node, address, readiness).
func Summary(ctx context.Context, st *State, cs kubernetes.Interface, out io.Writer) error {
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	podCIDRs := map[string][]string{}
	for _, n := range nodes.Items {
		podCIDRs[n.Name] = n.Spec.PodCIDRs
	}
	header := "POD CIDR"
	notes := map[string]string{}
	if st.IPAM == "cluster-pool" {
		// The agents take their CIDRs from their TendrilNodes (the
		// operators' pool), not from Node.spec.podCIDRs, which
		// kube-controller-manager still fills from another range.
		header = "POD CIDR (cluster-pool)"
		if podCIDRs, notes, err = clusterPoolCIDRs(ctx, st); err != nil {
			return err
		}
	}
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\t"+header+"\tAGENT\tSOCKET")
	for _, n := range st.Nodes {
		agent := "not answering"
		if c, err := client.New(n.Socket); err == nil {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if _, err := c.ConfigGet(cctx); err == nil {
				agent = "serving"
			}
			cancel()
		}
		addr := n.Address
		if n.Address6 != "" {
			addr += "," + n.Address6
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Name, addr, cmp.Or(strings.Join(podCIDRs[n.Name], ","), "none yet"), agent+notes[n.Name], n.Socket)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if st.KVStorePort != 0 {
		fmt.Fprintf(out, "\nKVSTORE  etcd %s (in each node: %s), identities allocated there\n", st.KVStoreURL(), NodeKVStoreURL())
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
		gateway := fmt.Sprintf("gateway %s on the bridge (the nodes' default route)", w.Gateway)
		if st.Topology == TopologyRouted {
			gateway = "the router between the node subnets, each node's gateway at .1 of its subnet (the nodes' default route)"
		}
		fmt.Fprintf(out, "\nWORLD  %s: %s, server %s:%s tcp+udp %s, client %s; no route to the pod CIDRs\n",
			w.Netns, gateway, w.ServerIP, workload.FormatPorts(WorldServerPorts), server, w.ClientIP)
	}
	if st.Runtime == RuntimeContainerd {
		fmt.Fprintf(out, "\nHUBBLE RELAY  the chart's relay pod, port 4245 over TLS, from the nodes' networks (`tendril lab env` sets the client certificate)\n")
	} else {
		relay := "not answering"
		if rs, err := RelayStatus(ctx, st); err == nil {
			relay = fmt.Sprintf("%d/%d nodes connected", rs.GetNumConnectedNodes().GetValue(),
				rs.GetNumConnectedNodes().GetValue()+rs.GetNumUnavailableNodes().GetValue())
			if len(rs.GetUnavailableNodes()) > 0 {
				relay += ", unavailable: " + strings.Join(rs.GetUnavailableNodes(), ", ")
			}
		}
		fmt.Fprintf(out, "\nHUBBLE RELAY  unix://%s (and %s:%d in %s): %s\n", st.RelaySocket(), st.Nodes[0].Address, RelayPort, st.Nodes[0].Netns, relay)
	}
	if p := st.Prometheus; p != nil {
		up, err := PrometheusTargetsUp(&http.Client{Timeout: 2 * time.Second}, p)
		state := fmt.Sprintf("%d/%d targets up", up, len(p.Targets))
		if err != nil {
			state = err.Error()
		}
		fmt.Fprintf(out, "\nPROMETHEUS  %s: %s (dashboards: install/grafana)\n", p.URL(), state)
	}
	if u := st.UIURL(); u != "" {
		fmt.Fprintf(out, "\nWEB UI  %s (tendril ui: service map, flows, policy)\n", u)
	}
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
