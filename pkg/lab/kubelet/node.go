package kubelet

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/tendril-net/tendril/pkg/lab"
	"github.com/tendril-net/tendril/pkg/version"
)

// leaseDuration is the Node lease's duration; the heartbeat renews it at a
// quarter of it, as the real kubelet does.
const leaseDuration = 40 * time.Second

// registerNode creates or updates this node's Node with its labels,
// address and a Ready condition.
func registerNode(ctx context.Context, cs kubernetes.Interface, st *lab.State, n *lab.Node, log *slog.Logger) error {
	labels := map[string]string{
		"kubernetes.io/hostname": n.Name,
		"kubernetes.io/os":       "linux",
		lab.LabelLab:             st.Name,
	}
	obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels}}
	err := retry.OnError(retry.DefaultBackoff, func(err error) bool { return !apierrors.IsAlreadyExists(err) }, func() error {
		_, err := cs.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
		return err
	})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register node %s: %w", n.Name, err)
	}
	err = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for k, v := range labels {
			if cur.Labels == nil {
				cur.Labels = map[string]string{}
			}
			cur.Labels[k] = v
		}
		if cur, err = cs.CoreV1().Nodes().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return err
		}
		setNodeStatus(cur, n)
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("write status of node %s: %w", n.Name, err)
	}
	log.Info("Node registered", "address", n.Address)
	return nil
}

func setNodeStatus(obj *corev1.Node, n *lab.Node) {
	now := metav1.Now()
	obj.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.Address}}
	if n.Address6 != "" {
		// A dual-stack lab: the peers route this node's IPv6 pod CIDR
		// via its IPv6 address.
		obj.Status.Addresses = append(obj.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: n.Address6})
	}
	obj.Status.Addresses = append(obj.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.Name})
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "tendril lab kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}
	replaced := false
	for i, c := range obj.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status == corev1.ConditionTrue {
				ready.LastTransitionTime = c.LastTransitionTime
			}
			obj.Status.Conditions[i] = ready
			replaced = true
		}
	}
	if !replaced {
		obj.Status.Conditions = append(obj.Status.Conditions, ready)
	}
	capacity := corev1.ResourceList{
		corev1.ResourcePods:   resource.MustParse("110"),
		corev1.ResourceCPU:    resource.MustParse("2"),
		corev1.ResourceMemory: resource.MustParse("4Gi"),
	}
	obj.Status.Capacity, obj.Status.Allocatable = capacity, capacity
	obj.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "tendril-lab/" + version.Version,
		OperatingSystem: "linux", Architecture: "amd64", ContainerRuntimeVersion: "tendril-lab://" + version.Version}
}

// heartbeat renews the node's Lease, so that anything watching node
// liveness (a node lifecycle controller, if one ran) sees the node alive.
func heartbeat(ctx context.Context, cs kubernetes.Interface, node string, log *slog.Logger) {
	leases := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	seconds := int32(leaseDuration / time.Second)
	holder := node
	t := time.NewTicker(leaseDuration / 4)
	defer t.Stop()
	for {
		now := metav1.NewMicroTime(time.Now())
		l, err := leases.Get(ctx, node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds, RenewTime: &now},
			}, metav1.CreateOptions{})
		case err == nil:
			l.Spec.RenewTime = &now
			l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &holder, &seconds
			_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("Renew node lease", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
