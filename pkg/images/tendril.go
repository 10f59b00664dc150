package images

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Binaries are the static binaries the images are made of.
var Binaries = []string{"tendril", "tendril-agent", "tendril-cni", "tendril-operator", "tendril-workload"}

// BinDir is where the binaries live inside every image.
const BinDir = "/usr/local/bin"

// DefaultRepository is the repository prefix of the images' names; the
// chart's default image repositories use it.
const DefaultRepository = "localhost/tendril"

// Meta is what the images say about their build.
type Meta struct {
	// Repository is the prefix of the names (DefaultRepository).
	Repository string
	// Version is the images' tag and their version label.
	Version string
	// Revision is the source commit.
	Revision string
	// Source is the project's URL.
	Source string
	// Created is every timestamp (SOURCE_DATE_EPOCH, else the epoch).
	Created time.Time
}

// Specs are Tendril's images, built from the binaries in binDir:
//   - agent: tendril-agent, with tendril-cni (the init container copies it
//     to the node) and the tendril CLI (probes: tendril status --brief;
//     the CNI install and uninstall);
//   - operator: tendril-operator;
//   - relay: `tendril relay` (the relay is a subcommand of the CLI);
//   - workload: tendril-workload, the server the lab's pods run (it
//     answers each TCP connection and UDP datagram with the pod's name;
//     the connectivity test's probes talk to it). Its own small binary,
//     not the CLI: every pod runs one.
func Specs(binDir string, m Meta) []Spec {
	bin := func(name string) File {
		return File{Path: BinDir + "/" + name, Source: filepath.Join(binDir, name), Mode: 0o755}
	}
	spec := func(name, title string, entrypoint []string, files ...File) Spec {
		return Spec{
			Name:       name,
			Ref:        fmt.Sprintf("%s/%s:%s", m.Repository, name, m.Version),
			Files:      files,
			Entrypoint: entrypoint,
			Env:        []string{"PATH=" + BinDir + ":/usr/bin:/bin"},
			WorkingDir: "/",
			Labels: map[string]string{
				LabelTitle:    title,
				LabelVersion:  m.Version,
				LabelRevision: m.Revision,
				LabelSource:   m.Source,
			},
			Created: m.Created,
		}
	}
	return []Spec{
		spec("agent", "tendril-agent", []string{BinDir + "/tendril-agent"},
			bin("tendril"), bin("tendril-agent"), bin("tendril-cni")),
		spec("operator", "tendril-operator", []string{BinDir + "/tendril-operator"},
			bin("tendril-operator")),
		spec("relay", "tendril relay", []string{BinDir + "/tendril", "relay"},
			bin("tendril")),
		spec("workload", "tendril-workload", []string{BinDir + "/tendril-workload"},
			bin("tendril-workload")),
	}
}

// BuildBinaries builds the static binaries (CGO off, -trimpath, no build
// ID, no VCS stamp, linux/amd64) of the module at moduleDir into outDir:
// the same source and Go toolchain give the same bytes.
func BuildBinaries(ctx context.Context, moduleDir, outDir, version, revision string) error {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	ldflags := "-s -w -buildid= -X github.com/tendril-net/tendril/pkg/version.Version=" + version +
		" -X github.com/tendril-net/tendril/pkg/version.Commit=" + revision
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", outDir + "/"}
	for _, b := range Binaries {
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=-buildvcs=false")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build of %v: %w\n%s", Binaries, err, out.String())
	}
	return nil
}

// Result is one image written.
type Result struct {
	Name, Ref, Archive string
	Digest             string
}

// BuildAll builds every spec and writes <outDir>/<name>.tar.
func BuildAll(specs []Spec, outDir string) ([]Result, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	var res []Result
	for _, s := range specs {
		img, err := Build(s)
		if err != nil {
			return nil, err
		}
		archive := filepath.Join(outDir, s.Name+".tar")
		d, err := WriteArchive(archive, img, s.Ref, s.Created)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", s.Name, err)
		}
		res = append(res, Result{Name: s.Name, Ref: s.Ref, Archive: archive, Digest: d.String()})
	}
	return res, nil
}
