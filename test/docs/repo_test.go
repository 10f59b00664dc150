// Package docs_test checks the documentation against the tree: the agent
// API's routes against docs/api.md, the names docs/benchmarks.md cites
// against the tests, benchmarks and scripts that exist, and the README's
// command lines against the binaries' --help.
package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// repoRoot is the repository's top directory, found from this file.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate this test's source")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// readDoc returns a file of the repository as text.
func readDoc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// goFile is one parsed Go source file of the tree.
type goFile struct {
	rel  string // path from the repository root
	dir  string // its directory, from the root
	test bool
	ast  *ast.File
}

// parseTree parses every Go file of the repository (not .git, not
// testdata), test files included.
func parseTree(t *testing.T) []goFile {
	t.Helper()
	root := repoRoot(t)
	fset := token.NewFileSet()
	var files []goFile
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		files = append(files, goFile{rel: rel, dir: filepath.Dir(rel), test: strings.HasSuffix(path, "_test.go"), ast: f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// funcDeclName is the name of a top-level function (not a method).
func funcDeclName(d ast.Decl) (string, bool) {
	fd, ok := d.(*ast.FuncDecl)
	if !ok || fd.Recv != nil {
		return "", false
	}
	return fd.Name.Name, true
}
