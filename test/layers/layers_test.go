// Package layers checks the import layering of the repository
// (docs/architecture.md, "Layers"): domain packages at the bottom, the
// kernel- and I/O-facing packages above them, the cells on top of those
// and the commands, labs and tests on top of everything. A package may
// import only from its own layer or a lower one; a domain package imports
// no hive, kernel, Kubernetes-client, etcd or network-server library; and
// only the cells' layer (and the commands above it) declares hive cells.
// Every package must be placed: a new one fails the test until it is
// given a layer here.
package layers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/tendril-net/tendril/"

// Layer is a package's place in the import order: a package imports only
// packages of its own layer or lower ones.
type Layer int

const (
	// Domain is pure logic and data types: no hive, no kernel, no clients.
	Domain Layer = iota
	// Kernel is what talks to the kernel, the API server, etcd or a socket:
	// maps, the loader, netlink, clients, tables and their operations.
	Kernel
	// Cells are the hive cells: each wires one subsystem (its config, its
	// tables, its reconcilers, its jobs) from the layers below.
	Cells
	// Commands are the composition roots (the cell lists), the binaries,
	// the CLI, the lab, benchmarks and tests.
	Commands
)

func (l Layer) String() string {
	return [...]string{"domain", "kernel", "cells", "commands"}[l]
}

// placement maps a package path (relative to the module) to its layer;
// a path ending in "/..." covers the folder and everything under it, and
// the longest match wins.
var placement = map[string]Layer{
	// Domain: the cores every subsystem shares.
	"api/v1/ext":                 Domain,
	"pkg/labels":                 Domain,
	"pkg/identity":               Domain,
	"pkg/identity/identitytable": Domain,
	"pkg/policy":                 Domain,
	"pkg/policy/api":             Domain,
	"pkg/policy/k8s":             Domain,
	"pkg/policy/observed":        Domain,
	"pkg/policy/policyfile":      Domain,
	"pkg/ipam":                   Domain,
	"pkg/endpoint":               Domain,
	"pkg/endpointmanager":        Domain,
	"pkg/loadbalancer":           Domain,
	"pkg/loadbalancer/maglev":    Domain,
	"pkg/loadbalancer/lbpool":    Domain,
	"pkg/k8s/apis/...":           Domain,
	"pkg/cni":                    Domain,
	"pkg/reconcile":              Domain,
	"pkg/version":                Domain,
	"pkg/hubble/flowmetrics":     Domain,
	"pkg/hubble/relay/merge":     Domain,
	"pkg/bgp":                    Domain,

	// Kernel and I/O: everything else under pkg/ that is not a cell.
	"pkg/...":    Kernel,
	"api/v1/...": Kernel,

	// Cells: the agent's subsystems (pkg/agent/<cell>), the operator's
	// and the relay's.
	"pkg/agent/...":    Cells,
	"pkg/operator/...": Cells,
	"pkg/hubble/relay": Cells,

	// Commands: the composition roots, binaries, CLI, lab, test helpers,
	// tests, benchmarks and tools.
	"pkg/agent":                       Commands,
	"pkg/operator":                    Commands,
	"pkg/operator/operatortest":       Commands,
	"pkg/cli":                         Commands,
	"pkg/connectivity":                Commands,
	"pkg/lab/...":                     Commands,
	"pkg/testutil/...":                Commands,
	"pkg/hubble/hubbletest":           Commands,
	"pkg/ipcache/ipcachetest":         Commands,
	"pkg/agent/epattach/epattachtest": Commands,
	"pkg/reconcile/reconciletest":     Commands,
	"pkg/ui/uitest":                   Commands,
	"cmd/...":                         Commands,
	"test/...":                        Commands,
	"bench/...":                       Commands,
	"hack/...":                        Commands,
	"deploy/...":                      Commands,
	"deploy/crds":                     Kernel, // the CRDs the agent and operator install
}

// impure are the libraries a domain package may not import (directly):
// they bring goroutines, the kernel or the network into pure logic.
var impure = []string{
	"github.com/cilium/hive",
	"github.com/cilium/ebpf",
	"github.com/vishvananda/",
	"k8s.io/client-go",
	"go.etcd.io/",
	"google.golang.org/grpc",
	"net/http",
	"os/exec",
}

// declaresCell matches a hive cell declared in a package's source.
var declaresCell = regexp.MustCompile(`\bcell\.(Module|Provide|ProvidePrivate|Invoke|Group|Config)\(`)

// layerOf returns the layer of a package path relative to the module,
// and whether it is placed.
func layerOf(rel string) (Layer, bool) {
	best, layer, ok := -1, Layer(0), false
	for pattern, l := range placement {
		n := -1
		if dir, all := strings.CutSuffix(pattern, "/..."); all {
			if rel == dir || strings.HasPrefix(rel, dir+"/") {
				n = len(dir)
			}
		} else if rel == pattern {
			n = len(pattern) + 1 // an exact path beats its folder's pattern
		}
		if n > best {
			best, layer, ok = n, l, true
		}
	}
	return layer, ok
}

type listedPackage struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
}

// listPackages is `go list -json ./...` from the repository root.
func listPackages(t *testing.T) []listedPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.String())
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p listedPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 50 {
		t.Fatalf("go list found %d packages: not the repository root?", len(pkgs))
	}
	return pkgs
}

// violations are the layering rules pkgs break, one line each.
func violations(pkgs []listedPackage, readFile func(string) ([]byte, error)) []string {
	var out []string
	for _, p := range pkgs {
		rel := strings.TrimPrefix(p.ImportPath, module)
		layer, ok := layerOf(rel)
		if !ok {
			out = append(out, fmt.Sprintf("%s: not placed in a layer (add it to placement in test/layers)", rel))
			continue
		}
		for _, imp := range p.Imports {
			if irel, internal := strings.CutPrefix(imp, module); internal {
				il, ok := layerOf(irel)
				if ok && il > layer {
					out = append(out, fmt.Sprintf("%s (%s) imports %s (%s): an upward import", rel, layer, irel, il))
				}
				continue
			}
			if layer == Domain {
				for _, lib := range impure {
					if imp == strings.TrimSuffix(lib, "/") || strings.HasPrefix(imp, lib) {
						out = append(out, fmt.Sprintf("%s (domain) imports %s: domain packages are pure logic", rel, imp))
					}
				}
			}
		}
		if layer < Cells {
			for _, f := range p.GoFiles {
				src, err := readFile(filepath.Join(p.Dir, f))
				if err != nil {
					out = append(out, fmt.Sprintf("%s: read %s: %v", rel, f, err))
					continue
				}
				if declaresCell.Match(src) {
					out = append(out, fmt.Sprintf("%s (%s) declares a hive cell in %s: cells live in the cells layer", rel, layer, f))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func TestNoUpwardImports(t *testing.T) {
	for _, v := range violations(listPackages(t), os.ReadFile) {
		t.Error(v)
	}
}

// TestViolationsFound checks the checker: each rule, broken once, is
// reported.
func TestViolationsFound(t *testing.T) {
	src := map[string]string{
		"/k/a.go": "package k\nvar Cell = cell.Module(\"k\", \"k\")\n",
		"/d/a.go": "package d\n",
	}
	read := func(p string) ([]byte, error) { return []byte(src[p]), nil }
	pkgs := []listedPackage{
		{ImportPath: module + "pkg/identity", Dir: "/d", GoFiles: []string{"a.go"},
			Imports: []string{module + "pkg/kvstore", "github.com/cilium/hive/cell", "fmt"}},
		{ImportPath: module + "pkg/kvstore", Dir: "/k", GoFiles: []string{"a.go"},
			Imports: []string{module + "pkg/agent/agentkv"}},
		{ImportPath: module + "nowhere/x"},
	}
	got := violations(pkgs, read)
	want := []string{
		"nowhere/x: not placed in a layer (add it to placement in test/layers)",
		"pkg/identity (domain) imports github.com/cilium/hive/cell: domain packages are pure logic",
		"pkg/identity (domain) imports pkg/kvstore (kernel): an upward import",
		"pkg/kvstore (kernel) declares a hive cell in a.go: cells live in the cells layer",
		"pkg/kvstore (kernel) imports pkg/agent/agentkv (cells): an upward import",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
