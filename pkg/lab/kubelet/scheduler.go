package kubelet

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// scheduler binds pods without a node to Ready nodes whose labels match
// the pod's nodeSelector, round robin.
type scheduler struct {
	cs   kubernetes.Interface
	log  *slog.Logger
	next int
}

func runScheduler(ctx context.Context, cs kubernetes.Interface, log *slog.Logger) {
	s := &scheduler{cs: cs, log: log}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", "").String()
	}))
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 5*time.Second))
	defer queue.ShutDown()
	pods := factory.Core().V1().Pods()
	_, _ = pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { enqueue(queue, obj) },
		UpdateFunc: func(_, obj any) { enqueue(queue, obj) },
	})
	factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	for {
		key, quit := queue.Get()
		if quit {
			return
		}
		err := s.schedule(ctx, pods.Lister(), key)
		if err != nil {
			log.Warn("Schedule pod", "pod", key, "error", err)
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}

func enqueue(q workqueue.TypedRateLimitingInterface[string], obj any) {
	if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
		q.Add(key)
	}
}

func (s *scheduler) schedule(ctx context.Context, lister corelisters.PodLister, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := lister.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil {
		return nil
	}
	nodes, err := s.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var fit []string
	for _, n := range nodes.Items {
		if nodeReady(&n) && matches(pod.Spec.NodeSelector, n.Labels) {
			fit = append(fit, n.Name)
		}
	}
	if len(fit) == 0 {
		return fmt.Errorf("no Ready node matches the pod's nodeSelector %v", pod.Spec.NodeSelector)
	}
	sort.Strings(fit)
	target := fit[s.next%len(fit)]
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: target},
	}
	err = s.cs.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // bound meanwhile, or gone
	}
	if err != nil {
		return fmt.Errorf("bind to %s: %w", target, err)
	}
	s.next++
	s.log.Info("Pod scheduled", "pod", key, "node", target)
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func matches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}
