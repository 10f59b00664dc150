package testutil

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFuzzTargetsListed: every Fuzz function in the tree is in
// hack/fuzz-targets.txt (so `make fuzz` and the short run of `make test`
// fuzz it), and every line there names one that exists.
func TestFuzzTargetsListed(t *testing.T) {
	root := filepath.Join("..", "..")
	f, err := os.Open(filepath.Join(root, "hack", "fuzz-targets.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var listed []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 && (len(fields) != 3 || fields[2] != "long") {
			t.Fatalf("hack/fuzz-targets.txt: %q: want a package and a target (and long for make fuzz only)", line)
		}
		listed = append(listed, filepath.Clean(fields[0])+" "+fields[1])
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	var found []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "vendor" || (strings.HasPrefix(d.Name(), ".") && path != root)) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		for _, obj := range file.Decls {
			fn, ok := obj.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Fuzz") {
				continue
			}
			found = append(found, filepath.Clean("./"+rel)+" "+fn.Name.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, fz := range found {
		if !slices.Contains(listed, fz) {
			t.Errorf("fuzz target %s is not in hack/fuzz-targets.txt", fz)
		}
	}
	for _, l := range listed {
		if !slices.Contains(found, l) {
			t.Errorf("hack/fuzz-targets.txt lists %s, which does not exist", l)
		}
	}
	if len(found) == 0 {
		t.Fatal("no fuzz targets found: is the walk rooted at the repository?")
	}
}
