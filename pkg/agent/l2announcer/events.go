package l2announcer

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// ReasonRefused is the reason of the Event that says why an address of a
// Service is not announced.
const ReasonRefused = "L2AnnouncementRefused"

// newRefusalRecorder returns the runner's reporter: a Warning Event on
// the refused address's Service, from tendril-agent on node. client-go's
// recorder aggregates repeats and rate-limits each object's events; the
// runner reports each refusal once while it lasts.
func newRefusalRecorder(kube Kubernetes, node string) func(ctx context.Context) (func(Refusal), func()) {
	return func(ctx context.Context) (func(Refusal), func()) {
		b := record.NewBroadcaster(record.WithContext(ctx))
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube().CoreV1().Events("")})
		rec := b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "tendril-agent", Host: node})
		return func(r Refusal) {
			ref := &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: r.Service.Namespace, Name: r.Service.Name, UID: types.UID(r.UID)}
			rec.Eventf(ref, corev1.EventTypeWarning, ReasonRefused, "L2 announcement of %s refused on node %s: %s", r.Addr, node, r.Reason)
		}, b.Shutdown
	}
}
