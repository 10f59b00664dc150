// Package crds embeds Tendril's CustomResourceDefinition manifests
// (generated into this directory by `make generate`), so the agent can
// install or update them at start without files on the node.
package crds

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
)

//go:embed *.yaml
var manifests embed.FS

// Manifests returns every CRD manifest, by file name, in name order.
func Manifests() ([]Manifest, error) {
	names, err := fs.Glob(manifests, "*.yaml")
	if err != nil {
		return nil, fmt.Errorf("list CRD manifests: %w", err)
	}
	sort.Strings(names)
	out := make([]Manifest, 0, len(names))
	for _, n := range names {
		b, err := manifests.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("read CRD manifest %s: %w", n, err)
		}
		out = append(out, Manifest{Name: n, YAML: b})
	}
	return out, nil
}

// Manifest is one CRD manifest.
type Manifest struct {
	Name string
	YAML []byte
}
