package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tendril-net/tendril/pkg/lab/realnode"
)

// A real node's pods are not recorded by the lab (the upstream kubelet
// runs them): `lab exec`, `lab probe` and the connectivity test find a
// pod through the API server (its node, UID, addresses and first
// container) and the OCI bundle containerd wrote for that container
// (its network namespace and its resolv.conf). The bundle is a file of
// the node's own directory, readable from the machine's mount namespace.

// criPod builds the record of a running pod of a real node.
func (s *State) criPod(namespace, name string) (*PodRecord, error) {
	cs, err := s.Clientset()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%s/%s: %w", namespace, name, ErrNoPod)
	}
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", namespace, name, err)
	}
	return s.criPodRecord(p)
}

// criPodRecord is the record of p, a pod of a real node of this lab.
func (s *State) criPodRecord(p *corev1.Pod) (*PodRecord, error) {
	ref := p.Namespace + "/" + p.Name
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
		return nil, fmt.Errorf("%s is %s: %w", ref, p.Status.Phase, ErrNoPod)
	}
	if _, err := s.Node(p.Spec.NodeName); err != nil {
		return nil, fmt.Errorf("pod %s: %w", ref, err)
	}
	id, ok := strings.CutPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	if !ok || id == "" || strings.ContainsAny(id, "/.") {
		return nil, fmt.Errorf("pod %s: container ID %q is not containerd's", ref, p.Status.ContainerStatuses[0].ContainerID)
	}
	node := realnode.Node{Name: p.Spec.NodeName, Dir: filepath.Join(s.Dir, "nodes", p.Spec.NodeName)}
	bundle, err := readBundleSpec(node.TaskBundleSpec(id))
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", ref, err)
	}
	netns, err := bundle.netnsPath()
	if err != nil {
		return nil, fmt.Errorf("pod %s: container %s: %w", ref, id, err)
	}
	rec := &PodRecord{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Node: p.Spec.NodeName,
		NetnsPath: netns, ContainerID: id}
	for _, ip := range p.Status.PodIPs {
		rec.IPs = append(rec.IPs, ip.IP)
	}
	if PodUsesClusterDNS(p) && !p.Spec.HostNetwork {
		rec.ResolvConf = bundle.mountSource("/etc/resolv.conf")
	}
	return rec, nil
}

// bundleSpec is the part of an OCI runtime spec (config.json) the lab
// reads.
type bundleSpec struct {
	Mounts []struct {
		Destination string `json:"destination"`
		Source      string `json:"source"`
	} `json:"mounts"`
	Linux struct {
		Namespaces []struct {
			Type string `json:"type"`
			Path string `json:"path"`
		} `json:"namespaces"`
	} `json:"linux"`
}

func readBundleSpec(path string) (*bundleSpec, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no OCI bundle %s (the container is not running): %w", path, ErrNoPod)
	}
	if err != nil {
		return nil, err
	}
	b := &bundleSpec{}
	if err := json.Unmarshal(data, b); err != nil {
		return nil, fmt.Errorf("OCI bundle %s: %w", path, err)
	}
	return b, nil
}

// netnsPath is the container's network namespace as a path the machine's
// mount namespace can open: CRI joins a pod's containers to the
// sandbox's namespace by its process (/proc/<pid>/ns/net, one process
// namespace for the machine and its nodes).
func (b *bundleSpec) netnsPath() (string, error) {
	for _, ns := range b.Linux.Namespaces {
		if ns.Type != "network" {
			continue
		}
		if ns.Path == "" {
			return "", errors.New("its network namespace is a new one of its own, not its pod sandbox's")
		}
		if !strings.HasPrefix(ns.Path, "/proc/") {
			return "", fmt.Errorf("network namespace %s: want the sandbox's /proc/<pid>/ns/net", ns.Path)
		}
		return ns.Path, nil
	}
	return "", errors.New("no network namespace in its spec (host network)")
}

// mountSource is the source of the bind mount at dest ("" if none).
func (b *bundleSpec) mountSource(dest string) string {
	for _, m := range b.Mounts {
		if m.Destination == dest {
			return m.Source
		}
	}
	return ""
}
