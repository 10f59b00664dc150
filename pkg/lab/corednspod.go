package lab

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/tendril-net/tendril/pkg/images"
)

// On real nodes the cluster DNS is CoreDNS as a real container: an image
// built at `lab up` from the cached CoreDNS binary (State.CoreDNSBin),
// imported into every node's containerd like the Tendril images, run by
// the upstream kubelet under a ServiceAccount of its own, with its
// Corefile from a ConfigMap and the API server reached in-cluster (the
// token and KUBERNETES_SERVICE_HOST, the kubernetes Service translated by
// the node's agent), as in a kubeadm cluster.

// CoreDNSImageRef is the CoreDNS image on real nodes.
const CoreDNSImageRef = images.DefaultRepository + "/coredns:" + CoreDNSVersion

// coreDNSConfDir is where the CoreDNS container finds its Corefile.
const coreDNSConfDir = "/etc/coredns"

// coreDNSServiceAccount names CoreDNS's ServiceAccount, ClusterRole and
// ConfigMap in DNSNamespace.
const coreDNSServiceAccount = "coredns"

// WriteCoreDNSImage builds the CoreDNS image from the binary bin and
// writes it as an OCI archive at out. A binary linked against the C
// library (hack/coredns.sh builds it with cgo on) brings its program
// interpreter and shared libraries, as this machine has them.
func WriteCoreDNSImage(bin, out string) error {
	files := []images.File{{Path: "/coredns", Source: bin, Mode: 0o755}}
	libs, err := sharedLibraries(bin)
	if err != nil {
		return fmt.Errorf("CoreDNS image: %w", err)
	}
	for _, l := range libs {
		src, err := filepath.EvalSymlinks(l)
		if err != nil {
			return fmt.Errorf("CoreDNS image: %w", err)
		}
		files = append(files, images.File{Path: l, Source: src, Mode: 0o755})
	}
	created := time.Unix(0, 0).UTC()
	img, err := images.Build(images.Spec{
		Name:       "coredns",
		Ref:        CoreDNSImageRef,
		Files:      files,
		Entrypoint: []string{"/coredns"},
		WorkingDir: "/",
		Created:    created,
	})
	if err != nil {
		return err
	}
	if _, err := images.WriteArchive(out, img, CoreDNSImageRef, created); err != nil {
		return fmt.Errorf("CoreDNS image: %w", err)
	}
	return nil
}

// libraryDirs are where the dynamic linker of this machine's C library
// finds the libraries a binary needs (Debian's multiarch layout first).
var libraryDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// sharedLibraries lists the absolute paths an ELF binary needs at run
// time: its program interpreter and its DT_NEEDED libraries (none for a
// static binary).
func sharedLibraries(bin string) ([]string, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return nil, fmt.Errorf("%s: program interpreter: %w", bin, err)
		}
		for len(b) > 0 && b[len(b)-1] == 0 {
			b = b[:len(b)-1]
		}
		out = append(out, string(b))
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	for _, lib := range needed {
		found := ""
		for _, d := range libraryDirs {
			if _, err := os.Stat(filepath.Join(d, lib)); err == nil {
				found = filepath.Join(d, lib)
				break
			}
		}
		if found == "" {
			return nil, fmt.Errorf("%s needs %s, not found in %v", bin, lib, libraryDirs)
		}
		out = append(out, found)
	}
	return out, nil
}

// coreDNSRBAC is what CoreDNS's kubernetes plugin reads (the rules of
// kubeadm's system:coredns): Services and EndpointSlices for the
// records, namespaces for their existence, pods for `pods insecure`.
func coreDNSRBAC() (*corev1.ServiceAccount, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: coreDNSServiceAccount, Namespace: DNSNamespace}}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: DNSNamespace}},
	}
	return sa, role, binding
}

// coreDNSPod is a CoreDNS pod bound to node, a real container of
// CoreDNSImageRef reading its Corefile from the coredns ConfigMap.
func coreDNSPod(node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: dnsPodPrefix + node, Namespace: DNSNamespace, Labels: map[string]string{DNSAppLabel: DNSAppValue}},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: coreDNSServiceAccount,
			// CoreDNS resolves nothing through itself.
			DNSPolicy:         corev1.DNSDefault,
			PriorityClassName: "system-cluster-critical",
			Containers: []corev1.Container{{
				Name:            "coredns",
				Image:           CoreDNSImageRef,
				ImagePullPolicy: corev1.PullNever,
				Args:            []string{"-conf", filepath.Join(coreDNSConfDir, "Corefile")},
				Ports: []corev1.ContainerPort{
					{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
					{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: coreDNSConfDir, ReadOnly: true}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(CoreDNSReadyPort)}}, PeriodSeconds: 2},
			}},
			Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: coreDNSServiceAccount}}}}},
		},
	}
}

// deployCoreDNSPods deploys the cluster DNS on real nodes: CoreDNS's
// ServiceAccount and RBAC, its Corefile, the kube-dns Service and a pod
// on each of the first nodes.
func deployCoreDNSPods(ctx context.Context, cs kubernetes.Interface, st *State) error {
	sa, role, binding := coreDNSRBAC()
	if _, err := cs.CoreV1().ServiceAccounts(DNSNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create CoreDNS's ServiceAccount: %w", err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ClusterRole %s: %w", role.Name, err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ClusterRoleBinding %s: %w", binding.Name, err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: coreDNSServiceAccount, Namespace: DNSNamespace},
		// No kubeconfig: the kubernetes plugin goes in-cluster.
		Data: map[string]string{"Corefile": Corefile("")},
	}
	if _, err := cs.CoreV1().ConfigMaps(DNSNamespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ConfigMap %s/%s: %w", DNSNamespace, cm.Name, err)
	}
	if err := createKubeDNSService(ctx, cs); err != nil {
		return err
	}
	for _, n := range dnsNodes(st) {
		if _, err := cs.CoreV1().Pods(DNSNamespace).Create(ctx, coreDNSPod(n.Name), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CoreDNS pod on %s: %w", n.Name, err)
		}
	}
	return nil
}
