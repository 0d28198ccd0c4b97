package extract_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocs holds that every package has exactly one doc comment, the place that
// states what the package keeps and what it leaves to its callers (tailscale's
// pkgdoc_test.go does the same): none is a package nobody explained, two drift apart.
func TestPackageDocs(t *testing.T) {
	docs := map[string][]string{} // dir → files with a package doc
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir // what the go command ignores too
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		dir := filepath.Dir(path)
		if _, ok := docs[dir]; !ok {
			docs[dir] = nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		if f.Doc == nil {
			return nil
		}
		text := f.Doc.Text()
		if strings.HasPrefix(strings.ToLower(text), "copyright") {
			t.Errorf("%s: the package doc is a license header; leave a blank line between them", path)
		}
		docs[dir] = append(docs[dir], path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("found no Go package below the module root")
	}
	for dir, files := range docs {
		switch len(files) {
		case 0:
			t.Errorf("%s has no package doc: add a doc.go (\"// Package x …\") saying what it keeps", dir)
		case 1:
		default:
			t.Errorf("%s has %d package docs (%s): keep one", dir, len(files), strings.Join(files, ", "))
		}
	}
	if _, err := os.Stat("go.mod"); err != nil {
		t.Errorf("run from the module root: %v", err)
	}
}
