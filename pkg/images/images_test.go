package images

import (
	"bytes"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// buildBinaries builds the real static binaries once for the test.
func buildBinaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := BuildBinaries(context.Background(), "../..", dir, "v0.0.0-test", "abc1234"); err != nil {
		t.Fatal(err)
	}
	return dir
}

func testMeta() Meta {
	return Meta{Repository: DefaultRepository, Version: "v0.0.0-test", Revision: "abc1234", Source: "https://example.invalid/tendril", Created: time.Unix(0, 0).UTC()}
}

// TestImages builds every image from the real binaries, reads each archive
// back (reference, digest, platform, entrypoint, labels, files and their
// modes, static binaries), and builds them again to prove the digests
// repeat, and change when an input does.
func TestImages(t *testing.T) {
	binDir := buildBinaries(t)
	out := t.TempDir()
	res, err := BuildAll(Specs(binDir, testMeta()), out)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		entrypoint []string
		files      []string
	}{
		"agent":    {[]string{"/usr/local/bin/tendril-agent"}, []string{"tendril", "tendril-agent", "tendril-cni"}},
		"operator": {[]string{"/usr/local/bin/tendril-operator"}, []string{"tendril-operator"}},
		"relay":    {[]string{"/usr/local/bin/tendril", "relay"}, []string{"tendril"}},
		"workload": {[]string{"/usr/local/bin/tendril-workload"}, []string{"tendril-workload"}},
	}
	if len(res) != len(want) {
		t.Fatalf("%d images, want %d", len(res), len(want))
	}
	for _, r := range res {
		t.Run(r.Name, func(t *testing.T) {
			w, ok := want[r.Name]
			if !ok {
				t.Fatalf("unexpected image %s", r.Name)
			}
			a, err := ReadArchive(r.Archive, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if a.Digest.String() != r.Digest {
				t.Errorf("archive's digest %s, built %s", a.Digest, r.Digest)
			}
			if d, err := a.Image.Digest(); err != nil || d != a.Digest {
				t.Errorf("image digest %s (%v), index says %s", d, err, a.Digest)
			}
			if wantRef := DefaultRepository + "/" + r.Name + ":v0.0.0-test"; a.Ref != wantRef {
				t.Errorf("ref %q, want %q", a.Ref, wantRef)
			}
			cf, err := a.Image.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.OS != "linux" || cf.Architecture != "amd64" {
				t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
			}
			if !reflect.DeepEqual(cf.Config.Entrypoint, w.entrypoint) {
				t.Errorf("entrypoint %q, want %q", cf.Config.Entrypoint, w.entrypoint)
			}
			if !cf.Created.Time.Equal(time.Unix(0, 0)) {
				t.Errorf("created %s, want the epoch", cf.Created.Time)
			}
			for k, v := range map[string]string{LabelVersion: "v0.0.0-test", LabelRevision: "abc1234", LabelSource: "https://example.invalid/tendril"} {
				if cf.Config.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, cf.Config.Labels[k], v)
				}
			}
			files, err := Files(a.Image)
			if err != nil {
				t.Fatal(err)
			}
			wantFiles := map[string]LayerFile{"/usr": {Mode: 0o755, Dir: true}, "/usr/local": {Mode: 0o755, Dir: true}, "/usr/local/bin": {Mode: 0o755, Dir: true}}
			for _, b := range w.files {
				fi, err := os.Stat(filepath.Join(binDir, b))
				if err != nil {
					t.Fatal(err)
				}
				wantFiles["/usr/local/bin/"+b] = LayerFile{Mode: 0o755, Size: fi.Size()}
			}
			if !reflect.DeepEqual(files, wantFiles) {
				t.Errorf("files %v, want %v", files, wantFiles)
			}
			for _, b := range w.files {
				checkStatic(t, filepath.Join(binDir, b))
			}
			runEntrypoint(t, a, cf.Config.Entrypoint)
		})
	}

	t.Run("reproducible", func(t *testing.T) {
		// The binaries built again, and the images from them.
		binDir2 := buildBinaries(t)
		for _, b := range Binaries {
			x, _ := os.ReadFile(filepath.Join(binDir, b))
			y, _ := os.ReadFile(filepath.Join(binDir2, b))
			if len(x) == 0 || !bytes.Equal(x, y) {
				t.Errorf("binary %s differs between two builds", b)
			}
		}
		out2 := t.TempDir()
		res2, err := BuildAll(Specs(binDir2, testMeta()), out2)
		if err != nil {
			t.Fatal(err)
		}
		for i := range res {
			if res[i].Digest != res2[i].Digest {
				t.Errorf("%s: digest %s, then %s", res[i].Name, res[i].Digest, res2[i].Digest)
			}
			x, _ := os.ReadFile(res[i].Archive)
			y, _ := os.ReadFile(res2[i].Archive)
			if !bytes.Equal(x, y) {
				t.Errorf("%s: archives differ", res[i].Name)
			}
		}
	})

	t.Run("changed input changes the digest", func(t *testing.T) {
		// One byte of one binary, the version, the timestamp: each must
		// give the agent another digest.
		changedBin := t.TempDir()
		for _, b := range Binaries {
			data, err := os.ReadFile(filepath.Join(binDir, b))
			if err != nil {
				t.Fatal(err)
			}
			if b == "tendril-cni" {
				data = append(data, 0)
			}
			if err := os.WriteFile(filepath.Join(changedBin, b), data, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		newer := testMeta()
		newer.Version = "v0.0.1-test"
		later := testMeta()
		later.Created = time.Unix(1700000000, 0).UTC()
		for name, specs := range map[string][]Spec{
			"binary":  Specs(changedBin, testMeta()),
			"version": Specs(binDir, newer),
			"created": Specs(binDir, later),
		} {
			r, err := BuildAll(specs[:1], t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if r[0].Name != "agent" || r[0].Digest == res[0].Digest {
				t.Errorf("changed %s: agent digest %s is the unchanged one's", name, r[0].Digest)
			}
		}
	})
}

// runEntrypoint extracts the image's files and runs its entrypoint (with
// --help, from the extracted tree, as a runtime would run it from its
// snapshot) and, in the agent's image, the init container's command
// `tendril cni install` with the image's tendril-cni.
func runEntrypoint(t *testing.T, a *Archive, entrypoint []string) {
	t.Helper()
	root := t.TempDir()
	if err := ExtractFiles(a.Image, root); err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{}, entrypoint[1:]...), "--help")
	out, err := exec.Command(filepath.Join(root, entrypoint[0]), args...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Usage:") {
		t.Errorf("%q --help: %v\n%s", entrypoint, err, out)
	}
	if entrypoint[0] != BinDir+"/tendril-agent" {
		return
	}
	host := t.TempDir()
	out, err = exec.Command(filepath.Join(root, BinDir, "tendril"), "cni", "install",
		"--source", filepath.Join(root, BinDir, "tendril-cni"),
		"--cni-bin-dir", filepath.Join(host, "bin"), "--cni-conf-dir", filepath.Join(host, "net.d")).CombinedOutput()
	if err != nil {
		t.Fatalf("tendril cni install from the image: %v\n%s", err, out)
	}
	// The installed plugin is the image's, and runs: asked for its
	// version it answers as a CNI plugin.
	cmd := exec.Command(filepath.Join(host, "bin", "tendril-cni"))
	cmd.Env = []string{"CNI_COMMAND=VERSION"}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
	out, err = cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "supportedVersions") {
		t.Errorf("installed tendril-cni VERSION: %v\n%s", err, out)
	}
}

// checkStatic fails unless path is an x86-64 ELF executable with no
// program interpreter (statically linked: the images have no libc).
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		t.Errorf("%s: machine %s", path, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s: dynamically linked (has an interpreter)", path)
		}
	}
}

// TestLayerRejectsBadPaths: a relative or unclean path, or a file given
// twice, is an error, not a layer with a stray entry.
func TestLayerRejectsBadPaths(t *testing.T) {
	for _, files := range [][]File{
		{{Path: "usr/bin/x", Mode: 0o755}},
		{{Path: "/usr/../etc/x", Mode: 0o644}},
		{{Path: "/x", Mode: 0o644}, {Path: "/x", Mode: 0o644}},
	} {
		if _, err := layerTar(files, time.Unix(0, 0)); err == nil {
			t.Errorf("%v: no error", files)
		}
	}
}
