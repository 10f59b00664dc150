// Command images builds Tendril's OCI image archives (pkg/images) without
// a container engine: the static binaries, then one archive per image under
// --out, and a digests file naming each image's reference and digest.
// `make images` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tendril-net/tendril/pkg/images"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run() error {
	m := images.Meta{}
	var out, binDir string
	flag.StringVar(&out, "out", "_output/images", "Directory for the archives")
	flag.StringVar(&binDir, "bin-dir", "", "Static binaries to use (default: build them into <out>/bin)")
	flag.StringVar(&m.Repository, "repository", images.DefaultRepository, "Repository prefix of the images' names")
	flag.StringVar(&m.Version, "version", "dev", "Version: the images' tag and version label")
	flag.StringVar(&m.Revision, "revision", "unknown", "Source revision label")
	flag.StringVar(&m.Source, "source", "https://github.com/tendril-net/tendril", "Source URL label")
	flag.Parse()
	// Every timestamp: SOURCE_DATE_EPOCH (reproducible-builds.org), else 0.
	m.Created = time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		m.Created = time.Unix(sec, 0).UTC()
	}
	if binDir == "" {
		binDir = filepath.Join(out, "bin")
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if err := images.BuildBinaries(context.Background(), wd, binDir, m.Version, m.Revision); err != nil {
			return err
		}
	}
	res, err := images.BuildAll(images.Specs(binDir, m), out)
	if err != nil {
		return err
	}
	var sb strings.Builder
	for _, r := range res {
		fmt.Fprintf(&sb, "%s %s %s\n", r.Ref, r.Digest, r.Archive)
	}
	fmt.Print(sb.String())
	return os.WriteFile(filepath.Join(out, "digests.txt"), []byte(sb.String()), 0o644)
}
