// Package crdinstall creates Tendril's CustomResourceDefinitions when they
// are missing and updates them when their schema changed, then waits until
// the API server serves them. Each installed CRD carries the hash of the
// manifest it came from, so an agent of the same version leaves it alone
// and a newer agent replaces an older schema.
package crdinstall

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/tendril-net/tendril/deploy/crds"
)

// SchemaHashAnnotation holds the sha256 of the manifest a CRD was installed from.
const SchemaHashAnnotation = "tendril.io/crd-schema-hash"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Result says what Install did with each CRD, by name.
type Result map[string]string

// Install creates or updates every embedded CRD and waits until each is
// Established, or ctx ends.
func Install(ctx context.Context, client dynamic.Interface, log *slog.Logger) (Result, error) {
	ms, err := crds.Manifests()
	if err != nil {
		return nil, err
	}
	res := Result{}
	for _, m := range ms {
		name, action, err := apply(ctx, client, m)
		if err != nil {
			return res, fmt.Errorf("install CRD %s: %w", m.Name, err)
		}
		res[name] = action
		if action != "unchanged" {
			log.Info("CRD installed", "crd", name, "action", action)
		}
	}
	for name := range res {
		if err := waitEstablished(ctx, client, name); err != nil {
			return res, fmt.Errorf("CRD %s: %w", name, err)
		}
	}
	return res, nil
}

func apply(ctx context.Context, client dynamic.Interface, m crds.Manifest) (name, action string, err error) {
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(m.YAML, &obj.Object); err != nil {
		return "", "", fmt.Errorf("parse manifest: %w", err)
	}
	sum := sha256.Sum256(m.YAML)
	hash := hex.EncodeToString(sum[:])
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[SchemaHashAnnotation] = hash
	obj.SetAnnotations(ann)
	name = obj.GetName()

	crdClient := client.Resource(crdGVR)
	// Conflicts (another agent updating at the same moment) re-read and retry.
	for attempt := 0; attempt < 5; attempt++ {
		cur, err := crdClient.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = crdClient.Create(ctx, obj, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return name, "", fmt.Errorf("create: %w", err)
			}
			return name, "created", nil
		case err != nil:
			return name, "", fmt.Errorf("get: %w", err)
		}
		if cur.GetAnnotations()[SchemaHashAnnotation] == hash {
			return name, "unchanged", nil
		}
		obj.SetResourceVersion(cur.GetResourceVersion())
		_, err = crdClient.Update(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return name, "", fmt.Errorf("update: %w", err)
		}
		return name, "updated", nil
	}
	return name, "", fmt.Errorf("gave up after repeated conflicts")
}

func waitEstablished(ctx context.Context, client dynamic.Interface, name string) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		cur, err := client.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(cur.Object, "status", "conditions")
		for _, c := range conds {
			cm, _ := c.(map[string]any)
			if cm["type"] == "Established" && cm["status"] == "True" {
				return true, nil
			}
			if cm["type"] == "NamesAccepted" && cm["status"] == "False" {
				last = fmt.Sprint(cm["message"])
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("not established: %w (%s)", err, last)
	}
	return nil
}
