package policyfile

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tendril-net/tendril/pkg/policy"
	"github.com/tendril-net/tendril/pkg/policy/api"
)

func mustRules(t *testing.T, doc string) api.Rules {
	t.Helper()
	rules, err := api.ParseRules([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

const (
	apiRule = `[{"endpointSelector":{"matchLabels":{"app":"a"}},"labels":["team=a"],"ingress":[{"fromEntities":["host"]}]}]`
	k8sRule = `[{"endpointSelector":{"matchLabels":{"app":"b"}},"labels":["k8s:io.cilium.k8s.policy.name=p"],"ingress":[{}]}]`
)

func TestLoadRefusesACorruptFileAndSaysHowToRecover(t *testing.T) {
	for name, content := range map[string]string{
		"truncated":     `[{"endpointSelector":{"matchLabels":{"app":"a"}},"ingr`,
		"trailing data": `[{"endpointSelector":{}}] ]}`,
		"empty":         ``,
		"invalid rule":  `[{"endpointSelector":{},"ingress":[{"fromEntities":["nowhere"]}]}]`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "policy.json")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			f := New(path, policy.NewRepository(), "api", nil)
			_, err := f.Load()
			if err == nil {
				t.Fatal("a corrupt file loaded")
			}
			for _, want := range []string{"policy file " + path + " is corrupt: ", "move it away to start without the policies imported through the API, then import them again"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if got, _ := os.ReadFile(path); string(got) != content {
				t.Errorf("Load changed the corrupt file: %q", got)
			}
		})
	}
}

func TestWriteKeepsOnlyTheSourceAndOnlyOnChange(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.json")
	repo := policy.NewRepository()
	f := New(path, repo, "api", nil)
	if rules, err := f.Load(); err != nil || rules != nil {
		t.Fatalf("Load of no file = %v, %v", rules, err)
	}
	// Nothing imported through the API: no file.
	if _, err := repo.ReplaceSource("k8s/x/p", "x", mustRules(t, k8sRule)); err != nil {
		t.Fatal(err)
	}
	if err := f.Write(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a file was written with no API rules: %v", err)
	}
	if _, err := repo.Add(mustRules(t, apiRule), "", "api", false); err != nil {
		t.Fatal(err)
	}
	if err := f.Write(); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if rules, err := api.ParseRules(data); err != nil || len(rules) != 1 || strings.Contains(string(data), "io.cilium.k8s.policy.name") {
		t.Fatalf("file holds %s (%v), want only the API rule", data, err)
	}
	// A Kubernetes change leaves the file alone (same inode: not replaced).
	if _, err := repo.ReplaceSource("k8s/x/p", "x", nil); err != nil {
		t.Fatal(err)
	}
	if err := f.Write(); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(path); !os.SameFile(before, after) {
		t.Fatal("a Kubernetes-only change rewrote the file")
	}
	// Deleting the last API rule leaves an empty list, which loads.
	repo.DeleteByLabels(nil)
	if err := f.Write(); err != nil {
		t.Fatal(err)
	}
	if rules, err := New(path, policy.NewRepository(), "api", nil).Load(); err != nil || len(rules) != 0 {
		t.Fatalf("Load of the emptied file = %v, %v", rules, err)
	}
	if files, _ := os.ReadDir(dir); len(files) != 1 {
		t.Fatalf("temporary files left behind: %v", files)
	}
}

func TestRunWritesTheLastChangesOnStop(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.json")
	// A temporary file a crash left behind goes on Load.
	if err := os.WriteFile(filepath.Join(dir, ".policy.json.tmp-123"), []byte("[{"), 0o600); err != nil {
		t.Fatal(err)
	}
	repo := policy.NewRepository()
	f := New(path, repo, "api", nil)
	if _, err := f.Load(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Run(ctx)
	}()
	for i := 0; i < 20; i++ {
		if _, err := repo.Add(mustRules(t, apiRule), "", "api", false); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	<-done
	rules, err := New(path, policy.NewRepository(), "api", nil).Load()
	if err != nil || len(rules) != 20 {
		t.Fatalf("after stop the file holds %d rules (%v), want 20", len(rules), err)
	}
	if files, _ := os.ReadDir(dir); len(files) != 1 {
		t.Fatalf("files in the directory: %v, want only the policy file", files)
	}
}

// TestEncodeEmpty: the empty list's encoding, written without the JSON
// encoder, is the encoder's.
func TestEncodeEmpty(t *testing.T) {
	want, err := json.MarshalIndent(api.Rules{}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	for _, rules := range []api.Rules{nil, {}} {
		if got := encode(rules); !bytes.Equal(got, want) {
			t.Fatalf("encode(%#v) = %q, want %q", rules, got, want)
		}
	}
}
