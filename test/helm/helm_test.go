// Package helm tests the Helm chart deploy/helm/tendril: rendered with helm
// (hack/helm.sh) for several values sets, its values schema rejects typos,
// the agent's ConfigMap and the operator's arguments are options the
// binaries accept, and every manifest passes a server-side dry run against
// a real kube-apiserver (pkg/testutil/k8senv) with strict field validation,
// after the chart's CRDs are created for real.
package helm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/tendril-net/tendril/pkg/agent"
	"github.com/tendril-net/tendril/pkg/operator"
	"github.com/tendril-net/tendril/pkg/option"
	"github.com/tendril-net/tendril/pkg/testutil"
	"github.com/tendril-net/tendril/pkg/testutil/k8senv"
)

var env k8senv.Package

func TestMain(m *testing.M) { os.Exit(env.Main(m, k8senv.Options{}, nil)) }

const (
	chart       = "../../deploy/helm/tendril"
	kubeVersion = "v1.36.3"
	namespace   = "kube-system"
)

// valuesSets are the values files rendered in every test: the chart's
// defaults and each file of deploy/helm/values.
func valuesSets(t *testing.T) map[string][]string {
	t.Helper()
	sets := map[string][]string{"default": nil}
	files, err := filepath.Glob("../../deploy/helm/values/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no values files in deploy/helm/values")
	}
	for _, f := range files {
		sets[strings.TrimSuffix(filepath.Base(f), ".yaml")] = []string{"-f", f}
	}
	return sets
}

// helmBin builds helm (cached) with the project's script.
func helmBin(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("../../hack/helm.sh").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("hack/helm.sh: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("hack/helm.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// render runs helm template; the error carries helm's message.
func render(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), append([]string{"template", "tendril", chart, "--namespace", namespace, "--kube-version", kubeVersion}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm template %v: %w: %s", args, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// decode splits a rendered stream into objects.
func decode(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("decode rendered manifests: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s in the rendered chart", kind, name)
	return nil
}

// TestSchemaRejectsTypos: a misspelt key, at the top or nested, and a
// value outside its enum fail the render with helm's schema message; the
// correct spelling renders.
func TestSchemaRejectsTypos(t *testing.T) {
	for _, set := range []string{"kubeProxyReplacment=false", "agent.capabilitiez[0]=NET_ADMIN", "hubble.tls.enable=false", "ipam.mode=aws", "ui.enabeld=true", "hubble.relay.tls.server.enable=true"} {
		_, err := render(t, "--set", set)
		if err == nil {
			t.Errorf("--set %s rendered", set)
			continue
		}
		if !strings.Contains(err.Error(), "schema") {
			t.Errorf("--set %s: error does not name the schema: %v", set, err)
		}
	}
	if _, err := render(t, "--set", "kubeProxyReplacement=false"); err != nil {
		t.Errorf("the correct key: %v", err)
	}
	// Checks across values the schema cannot express.
	for _, set := range [][]string{{"--set", "identityAllocationMode=kvstore"}, {"--set", "ipam.mode=cluster-pool"}} {
		if _, err := render(t, set...); err == nil {
			t.Errorf("%v rendered", set)
		}
	}
}

// TestAgentConfigAndOperatorArgs: the agent's ConfigMap, written out as
// the config directory it is mounted as, resolves against the agent's own
// flags (an unknown key or a bad value fails, as it would at the agent's
// start), with the node name from the DaemonSet's environment; the
// operator's arguments parse with the operator's flags.
func TestAgentConfigAndOperatorArgs(t *testing.T) {
	for name, args := range valuesSets(t) {
		t.Run(name, func(t *testing.T) {
			data, err := render(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			objs := decode(t, data)
			cm := find(t, objs, "ConfigMap", "tendril-config")
			values, _, err := unstructured.NestedStringMap(cm.Object, "data")
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			for k, v := range values {
				if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			fs := pflag.NewFlagSet("tendril-agent", pflag.ContinueOnError)
			agent.New().RegisterFlags(fs)
			env := map[string]string{}
			ds := find(t, objs, "DaemonSet", "tendril-agent")
			containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
			for _, e := range containers[0].(map[string]any)["env"].([]any) {
				e := e.(map[string]any)
				if e["name"] == option.EnvName("node-name") {
					path, _, _ := unstructured.NestedString(e, "valueFrom", "fieldRef", "fieldPath")
					if path != "spec.nodeName" {
						t.Errorf("%s from %q, want the downward API's spec.nodeName", e["name"], path)
					}
					env[option.EnvName("node-name")] = "node-a"
				}
			}
			sources, err := option.Resolver{ConfigDir: dir, LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}.Resolve(fs)
			if err != nil {
				t.Fatalf("the agent refuses the chart's configuration: %v", err)
			}
			if n, _ := fs.GetString("node-name"); n != "node-a" || sources["node-name"] != option.SourceEnv {
				t.Errorf("node name %q from %s, want node-a from the environment", n, sources["node-name"])
			}
			for k := range values {
				if sources[k] != option.SourceConfigDir {
					t.Errorf("option %s from %s, want the config directory", k, sources[k])
				}
			}
			if v, _ := fs.GetBool("k8s-install-crds"); v {
				t.Error("the agent would install CRDs (the chart does)")
			}

			dep := find(t, objs, "Deployment", "tendril-operator")
			oc, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
			opArgs, _, _ := unstructured.NestedStringSlice(oc[0].(map[string]any), "args")
			cmd := operator.NewCommand(io.Discard)
			if err := cmd.ParseFlags(opArgs); err != nil {
				t.Fatalf("the operator refuses the chart's arguments %q: %v", opArgs, err)
			}
			if v, _ := cmd.Flags().GetBool("k8s-install-crds"); v {
				t.Error("the operator would install CRDs (the chart does)")
			}
		})
	}
}

// TestServerSideDryRun creates the chart's CRDs for real, then submits
// every other rendered object with dryRun=All and strict field validation:
// the API server runs its defaulting, validation and admission on each
// without storing it.
func TestServerSideDryRun(t *testing.T) {
	e := env.Need(t)
	c := newApplier(t, e)
	for name, args := range valuesSets(t) {
		t.Run(name, func(t *testing.T) {
			data, err := render(t, append([]string{"--include-crds"}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			objs := decode(t, data)
			c.createCRDs(t, objs)
			n := 0
			for _, o := range objs {
				if o.GetKind() == "CustomResourceDefinition" {
					continue
				}
				if err := c.dryRun(t, o); err != nil {
					t.Errorf("%s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
				n++
			}
			if n < 10 {
				t.Errorf("only %d objects besides the CRDs", n)
			}
		})
	}
}

// TestServerSideDryRunRejectsBrokenManifests: the dry run is not a rubber
// stamp: a DaemonSet with a field the API does not have, one asking for
// bidirectional mount propagation without privilege (why the chart's
// bpffs mount is HostToContainer), and a ClusterRole rule without verbs
// are each refused.
func TestServerSideDryRunRejectsBrokenManifests(t *testing.T) {
	e := env.Need(t)
	c := newApplier(t, e)
	data, err := render(t, "--include-crds")
	if err != nil {
		t.Fatal(err)
	}
	objs := decode(t, data)
	c.createCRDs(t, objs)
	breaks := map[string]struct {
		kind, name string
		edit       func(o *unstructured.Unstructured)
	}{
		"unknown field": {"DaemonSet", "tendril-agent", func(o *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(o.Object, true, "spec", "template", "spec", "hostNetwrok")
		}},
		"bidirectional without privilege": {"DaemonSet", "tendril-agent", func(o *unstructured.Unstructured) {
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			mounts := cs[0].(map[string]any)["volumeMounts"].([]any)
			for _, m := range mounts {
				if m.(map[string]any)["name"] == "bpf-maps" {
					m.(map[string]any)["mountPropagation"] = string(corev1.MountPropagationBidirectional)
				}
			}
			_ = unstructured.SetNestedSlice(o.Object, cs, "spec", "template", "spec", "containers")
		}},
		"rule without verbs": {"ClusterRole", "tendril-agent", func(o *unstructured.Unstructured) {
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			delete(rules[0].(map[string]any), "verbs")
			_ = unstructured.SetNestedSlice(o.Object, rules, "rules")
		}},
	}
	for name, b := range breaks {
		t.Run(name, func(t *testing.T) {
			o := find(t, objs, b.kind, b.name).DeepCopy()
			if err := c.dryRun(t, o); err != nil {
				t.Fatalf("unchanged %s refused: %v", b.kind, err)
			}
			b.edit(o)
			err := c.dryRun(t, o)
			if err == nil {
				t.Fatalf("broken %s accepted", b.kind)
			}
			t.Logf("refused: %v", err)
		})
	}
}

type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier(t *testing.T, e *k8senv.Env) *applier {
	t.Helper()
	rc := e.RESTConfig()
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// createCRDs creates (or updates) the CRDs for real and waits until each
// is established: a dry run of anything else needs them served.
func (a *applier) createCRDs(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	var names []string
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		names = append(names, o.GetName())
		cur, err := a.dyn.Resource(crdGVR).Get(ctx, o.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = a.dyn.Resource(crdGVR).Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"})
		case err == nil:
			o = o.DeepCopy()
			o.SetResourceVersion(cur.GetResourceVersion())
			_, err = a.dyn.Resource(crdGVR).Update(ctx, o, metav1.UpdateOptions{FieldValidation: "Strict"})
		}
		if err != nil {
			t.Fatalf("CRD %s: %v", o.GetName(), err)
		}
	}
	// Every CRD of deploy/crds, counted there so that a new one is not a
	// failure here.
	files, err := filepath.Glob("../../deploy/crds/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != len(files) {
		t.Fatalf("%d CRDs rendered, want the %d of deploy/crds", len(names), len(files))
	}
	testutil.Eventually(t, time.Minute, "the CRDs established", func() bool {
		for _, n := range names {
			cur, err := a.dyn.Resource(crdGVR).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false
			}
			conds, _, _ := unstructured.NestedSlice(cur.Object, "status", "conditions")
			ok := false
			for _, c := range conds {
				c := c.(map[string]any)
				ok = ok || c["type"] == "Established" && c["status"] == "True"
			}
			if !ok {
				return false
			}
		}
		return true
	})
	a.mapper.Reset()
}

// dryRun submits o with dryRun=All and strict field validation, creating
// its namespace first (for real) if it is not there: the lease namespace
// of L2 announcements is the user's to create (docs/install.md).
func (a *applier) dryRun(t *testing.T, o *unstructured.Unstructured) error {
	t.Helper()
	ctx := context.Background()
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("no resource for %s: %w", gvk, err)
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := o.GetNamespace()
		if ns == "" {
			return fmt.Errorf("namespaced %s without a namespace", gvk.Kind)
		}
		nsObj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}
		if _, err := a.dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(ctx, nsObj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("namespace %s: %w", ns, err)
		}
		ri = a.dyn.Resource(m.Resource).Namespace(ns)
	}
	_, err = ri.Create(ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
	return err
}

// TestEncryptionValues: encryption.* become the agent's WireGuard flags,
// and the agent pod gets the node's /dev/net/tun and /var/run/wireguard
// (the device's UAPI socket directory, so a restarted container finds the
// device process it starts again); without them neither flag nor mount;
// strict mode or node encryption without encryption, and a type other
// than wireguard, fail the render; no encryption values at all (a release
// upgraded with --reuse-values from a chart without them) renders.
func TestEncryptionValues(t *testing.T) {
	hostPaths := func(objs []*unstructured.Unstructured) (flags map[string]string, mounts map[string]string) {
		t.Helper()
		cm := find(t, objs, "ConfigMap", "tendril-config")
		data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
		flags = map[string]string{}
		for k, v := range data {
			if strings.HasPrefix(k, "wireguard-") || k == "enable-wireguard" {
				flags[k] = v
			}
		}
		ds := find(t, objs, "DaemonSet", "tendril-agent")
		volumes, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
		paths := map[string]string{}
		for _, v := range volumes {
			v := v.(map[string]any)
			if p, ok, _ := unstructured.NestedString(v, "hostPath", "path"); ok {
				typ, _, _ := unstructured.NestedString(v, "hostPath", "type")
				paths[v["name"].(string)] = p + " " + typ
			}
		}
		containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
		mounts = map[string]string{}
		for _, m := range containers[0].(map[string]any)["volumeMounts"].([]any) {
			m := m.(map[string]any)
			if p, ok := paths[m["name"].(string)]; ok {
				mounts[m["mountPath"].(string)] = p
			}
		}
		return flags, mounts
	}
	data, err := render(t, "-f", "../../deploy/helm/values/wireguard.yaml", "--set", "encryption.wireguard.port=51999")
	if err != nil {
		t.Fatal(err)
	}
	flags, mounts := hostPaths(decode(t, data))
	want := map[string]string{"enable-wireguard": "true", "wireguard-port": "51999", "wireguard-strict": "true", "wireguard-encrypt-node": "true", "wireguard-device-external": "true"}
	if !maps.Equal(flags, want) {
		t.Errorf("agent options %v, want %v", flags, want)
	}
	if mounts["/dev/net/tun"] != "/dev/net/tun CharDevice" || mounts["/var/run/wireguard"] != "/var/run/wireguard DirectoryOrCreate" {
		t.Errorf("agent container's host paths %v lack /dev/net/tun or /var/run/wireguard", mounts)
	}
	// The agent's securityContext has NET_ADMIN (the TUN device, its
	// routes) by default.
	if data, err = render(t, "--set", "encryption.enabled=true"); err != nil {
		t.Fatal(err)
	}
	objs := decode(t, data)
	flags, _ = hostPaths(objs)
	if want := map[string]string{"enable-wireguard": "true", "wireguard-port": "51871", "wireguard-strict": "false", "wireguard-encrypt-node": "false", "wireguard-device-external": "true"}; !maps.Equal(flags, want) {
		t.Errorf("encryption.enabled alone: agent options %v, want %v", flags, want)
	}
	ds := find(t, objs, "DaemonSet", "tendril-agent")
	containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	caps, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "securityContext", "capabilities", "add")
	if !slices.Contains(caps, "NET_ADMIN") {
		t.Errorf("agent capabilities %v lack NET_ADMIN", caps)
	}
	// The device in a container of its own (it outlives a restart of the
	// agent's): the agent's image, the device subcommand, NET_ADMIN, the
	// TUN device and the UAPI socket's directory.
	if len(containers) != 2 {
		t.Fatalf("agent pod: %d containers, want the agent and wireguard-device", len(containers))
	}
	dev := containers[1].(map[string]any)
	cmd, _, _ := unstructured.NestedStringSlice(dev, "command")
	devCaps, _, _ := unstructured.NestedStringSlice(dev, "securityContext", "capabilities", "add")
	var devMounts []string
	for _, m := range dev["volumeMounts"].([]any) {
		devMounts = append(devMounts, m.(map[string]any)["mountPath"].(string))
	}
	if dev["name"] != "wireguard-device" || dev["image"] != containers[0].(map[string]any)["image"] || !slices.Equal(cmd, []string{"/usr/local/bin/tendril-agent", "wireguard-device", "--name=tendril_wg"}) ||
		!slices.Equal(devCaps, []string{"NET_ADMIN"}) || !slices.Equal(devMounts, []string{"/dev/net/tun", "/var/run/wireguard"}) {
		t.Errorf("the device container: name %v, image %v (agent's %v), command %v, capabilities %v, mounts %v", dev["name"], dev["image"], containers[0].(map[string]any)["image"], cmd, devCaps, devMounts)
	}

	if data, err = render(t); err != nil {
		t.Fatal(err)
	}
	objs = decode(t, data)
	flags, mounts = hostPaths(objs)
	if len(flags) != 0 || mounts["/dev/net/tun"] != "" || mounts["/var/run/wireguard"] != "" {
		t.Errorf("default values: WireGuard options %v, host paths %v", flags, mounts)
	}
	ds = find(t, objs, "DaemonSet", "tendril-agent")
	if containers, _, _ = unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers"); len(containers) != 1 {
		t.Errorf("default values: %d containers in the agent pod, want 1", len(containers))
	}
	// A release upgraded with --reuse-values from a chart without
	// encryption values has no .Values.encryption at all.
	if data, err = render(t, "--set", "encryption=null"); err != nil {
		t.Fatalf("without encryption values: %v", err)
	}
	if flags, mounts = hostPaths(decode(t, data)); len(flags) != 0 || mounts["/dev/net/tun"] != "" {
		t.Errorf("without encryption values: WireGuard options %v, host paths %v", flags, mounts)
	}
	for _, set := range []string{"encryption.strictMode.enabled=true", "encryption.nodeEncryption=true", "encryption.type=ipsec", "encryption.wireguard.port=0"} {
		if _, err := render(t, "--set", set); err == nil {
			t.Errorf("--set %s rendered", set)
		}
	}
}
