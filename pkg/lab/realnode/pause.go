package realnode

import (
	"fmt"
	"time"

	"github.com/tendril-net/tendril/pkg/images"
)

// PauseImageRef is the lab's pod sandbox image: containerd's pinned
// sandbox image, imported into every node's store (no registry).
const PauseImageRef = "localhost/tendril/pause:lab"

// WritePauseImage builds the pause image from the tendril-pause binary
// (cmd/tendril-pause: it sleeps until SIGINT or SIGTERM) and writes it as
// an OCI archive at out, for `ctr images import`.
func WritePauseImage(pauseBinary, out string) error {
	created := time.Unix(0, 0).UTC()
	img, err := images.Build(images.Spec{
		Name:       "pause",
		Ref:        PauseImageRef,
		Files:      []images.File{{Path: "/pause", Source: pauseBinary, Mode: 0o755}},
		Entrypoint: []string{"/pause"},
		WorkingDir: "/",
		Created:    created,
	})
	if err != nil {
		return err
	}
	if _, err := images.WriteArchive(out, img, PauseImageRef, created); err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	return nil
}
