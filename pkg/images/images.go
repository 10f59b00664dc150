// Package images builds Tendril's container images without a container
// engine: each image is one layer of static binaries assembled with
// go-containerregistry and written as an OCI image layout archive (a tar of
// oci-layout, index.json and blobs/sha256/…), the format `ctr images
// import` and `docker load` (24+) read and the one whose manifest digest is
// the digest the runtime stores. The build is reproducible: every
// timestamp is the given epoch, tar entries are sorted, owners are 0:0 and
// modes fixed, so the same binaries and metadata give the same digest.
package images

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotation and label keys (OCI image spec, annotations.md).
const (
	LabelVersion  = "org.opencontainers.image.version"
	LabelRevision = "org.opencontainers.image.revision"
	LabelSource   = "org.opencontainers.image.source"
	LabelTitle    = "org.opencontainers.image.title"
	// AnnotationRefName is the image's reference in index.json.
	AnnotationRefName = "org.opencontainers.image.ref.name"
	// AnnotationContainerdName is the full name `ctr images import` gives
	// the image (without it ctr needs --base-name).
	AnnotationContainerdName = "io.containerd.image.name"
)

// File is one file of an image's layer.
type File struct {
	// Path is the absolute path inside the image.
	Path string
	// Source is a file on this machine to copy; Data is used when empty.
	Source string
	Data   []byte
	// Mode is the permission bits (0755 for a binary).
	Mode fs.FileMode
}

// Spec describes one image.
type Spec struct {
	// Name is the image's short name (agent, operator, …).
	Name string
	// Ref is its full reference, repository:tag.
	Ref        string
	Files      []File
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	Labels     map[string]string
	// Created is every timestamp of the image (the layer's files, the
	// config's created): SOURCE_DATE_EPOCH, or the Unix epoch.
	Created time.Time
}

// Build assembles the image.
func Build(s Spec) (v1.Image, error) {
	layerTar, err := layerTar(s.Files, s.Created)
	if err != nil {
		return nil, fmt.Errorf("image %s: layer: %w", s.Name, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image %s: layer: %w", s.Name, err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: s.Created}, CreatedBy: "tendril pkg/images", Comment: s.Name},
	})
	if err != nil {
		return nil, fmt.Errorf("image %s: append layer: %w", s.Name, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", s.Name, err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: s.Created}
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.Cmd = s.Cmd
	cf.Config.Env = s.Env
	cf.Config.WorkingDir = s.WorkingDir
	cf.Config.Labels = s.Labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", s.Name, err)
	}
	return mutate.Annotations(img, s.Labels).(v1.Image), nil
}

// layerTar is the layer: the files and their parent directories, sorted,
// owned by 0:0, every time the epoch given.
func layerTar(files []File, created time.Time) ([]byte, error) {
	type entry struct {
		hdr  *tar.Header
		data []byte
	}
	entries := map[string]entry{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			return nil, fmt.Errorf("file path %q: not absolute and clean", f.Path)
		}
		data := f.Data
		if f.Source != "" {
			var err error
			if data, err = os.ReadFile(f.Source); err != nil {
				return nil, fmt.Errorf("read %s: %w", f.Source, err)
			}
		}
		name := strings.TrimPrefix(f.Path, "/")
		if _, dup := entries[name]; dup {
			return nil, fmt.Errorf("file %s given twice", f.Path)
		}
		entries[name] = entry{hdr: &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(f.Mode.Perm()), Size: int64(len(data))}, data: data}
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			if _, ok := entries[dir+"/"]; !ok {
				entries[dir+"/"] = entry{hdr: &tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755}}
			}
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		e.hdr.ModTime, e.hdr.Format = created, tar.FormatPAX
		if err := tw.WriteHeader(e.hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteArchive writes the image as an OCI image layout archive at out and
// returns the manifest's digest. The index names it by ref (both the OCI
// ref.name and containerd's name annotation).
func WriteArchive(out string, img v1.Image, ref string, created time.Time) (v1.Hash, error) {
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image digest: %w", err)
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{
		Add: img,
		Descriptor: v1.Descriptor{Annotations: map[string]string{
			AnnotationRefName:        ref,
			AnnotationContainerdName: ref,
		}},
	})
	dir, err := os.MkdirTemp(filepath.Dir(out), ".layout-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(dir)
	if _, err := layout.Write(dir, idx); err != nil {
		return v1.Hash{}, fmt.Errorf("write OCI layout: %w", err)
	}
	if err := tarDir(dir, out, created); err != nil {
		return v1.Hash{}, fmt.Errorf("archive %s: %w", out, err)
	}
	return digest, nil
}

// tarDir writes dir's tree as a tar at out (through a temporary file and
// a rename), sorted, 0:0, directories 0755 and files 0644, times created.
func tarDir(dir, out string, created time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			rel += "/"
		}
		names = append(names, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	for _, n := range names {
		hdr := &tar.Header{Name: n, ModTime: created, Format: tar.FormatPAX}
		var data []byte
		if strings.HasSuffix(n, "/") {
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
		} else {
			if data, err = os.ReadFile(filepath.Join(dir, n)); err != nil {
				return err
			}
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, int64(len(data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := errors.Join(tw.Close(), f.Close()); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// Archive is an image read back from an OCI layout archive.
type Archive struct {
	Image  v1.Image
	Digest v1.Hash
	// Ref is the index's ref.name annotation.
	Ref string
}

// ReadArchive extracts the archive into dir (which must exist and stays
// the image's storage) and opens its single image.
func ReadArchive(archive, dir string) (*Archive, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", archive, err)
		}
		name := path.Clean(hdr.Name)
		if !fs.ValidPath(name) {
			return nil, fmt.Errorf("read %s: entry %q outside the archive", archive, hdr.Name)
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return nil, err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return nil, err
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				return nil, fmt.Errorf("read %s: %s: %w", archive, hdr.Name, err)
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("read %s: entry %q of type %c", archive, hdr.Name, hdr.Typeflag)
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("open OCI layout of %s: %w", archive, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("index of %s: %w", archive, err)
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("index of %s: %d manifests, want 1", archive, len(m.Manifests))
	}
	d := m.Manifests[0]
	img, err := idx.Image(d.Digest)
	if err != nil {
		return nil, fmt.Errorf("image of %s: %w", archive, err)
	}
	return &Archive{Image: img, Digest: d.Digest, Ref: d.Annotations[AnnotationRefName]}, nil
}

// ExtractFiles writes the image's regular files and directories under dir
// (with their modes): what a runtime's snapshot of the image holds.
func ExtractFiles(img v1.Image, dir string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read layers: %w", err)
		}
		name := path.Clean(hdr.Name)
		if !fs.ValidPath(name) {
			return fmt.Errorf("layer entry %q outside the image", hdr.Name)
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, fs.FileMode(hdr.Mode).Perm()); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fs.FileMode(hdr.Mode).Perm())
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if err := errors.Join(err, f.Close()); err != nil {
				return fmt.Errorf("extract %s: %w", hdr.Name, err)
			}
		default:
			return fmt.Errorf("layer entry %q of type %c", hdr.Name, hdr.Typeflag)
		}
	}
}

// LayerFile is one entry of an image's file system.
type LayerFile struct {
	Mode int64
	Dir  bool
	Size int64
}

// Files lists the image's file system (its layers flattened).
func Files(img v1.Image) (map[string]LayerFile, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	out := map[string]LayerFile{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read layers: %w", err)
		}
		out["/"+strings.TrimSuffix(hdr.Name, "/")] = LayerFile{Mode: hdr.Mode, Dir: hdr.Typeflag == tar.TypeDir, Size: hdr.Size}
	}
}
