package configs

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The configuration doc lists the EXTRACT_* variables that are no key; an operator who
// meets one in a script checks it there, so the list must be the one checkEnv accepts.
func TestTheDocListsExactlyTheEnvVariablesThatAreNoKey(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "The `EXTRACT_*` variables that are not keys")
	if start < 0 {
		t.Fatal("docs/configuration.md has no list of the EXTRACT_* variables that are not keys")
	}
	block := text[start:]
	if end := strings.Index(block, "\n\n"); end >= 0 {
		if rest := block[end+2:]; strings.HasPrefix(rest, "- ") {
			end += 2 + strings.Index(rest+"\n\n", "\n\n")
		}
		block = block[:end]
	}
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^- `(EXTRACT_[A-Z_]+)`").FindAllStringSubmatch(block, -1) {
		documented = append(documented, m[1])
	}
	var inCode []string
	for name := range envNotKeys {
		inCode = append(inCode, name)
	}
	slices.Sort(documented)
	slices.Sort(inCode)
	if !slices.Equal(documented, inCode) {
		t.Errorf("docs/configuration.md lists %v; configs/env.go accepts %v", documented, inCode)
	}
}

// Every key in Default has a row in the doc's table, and no row names a key that does
// not exist: the table is where an operator looks a key up.
func TestTheDocsKeyTableMatchesTheConfig(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	// A row's first cell names one key or several ("`server.host`, `server.port`"); a
	// name without a dot after the first is in the first one's section.
	rows := map[string]bool{}
	// A row "`prepare.*`" covers a whole section (its keys listed in its own doc).
	var wholeSections []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z0-9_.]+)\\.\\*` \\|").FindAllStringSubmatch(string(doc), -1) {
		wholeSections = append(wholeSections, m[1]+".")
	}
	for _, m := range regexp.MustCompile("(?m)^\\| (`[a-z0-9_.]+`(?:, `[a-z0-9_.]+`)*) \\|").FindAllStringSubmatch(string(doc), -1) {
		names := strings.Split(strings.ReplaceAll(m[1], "`", ""), ", ")
		section := ""
		if i := strings.LastIndexByte(names[0], '.'); i >= 0 {
			section = names[0][:i+1]
		}
		for i, n := range names {
			if i > 0 && !strings.Contains(n, ".") {
				n = section + n
			}
			rows[n] = true
		}
	}
	shape := shapeOf(Default())
	for key := range shape.leaves {
		if !rows[key] && !slices.ContainsFunc(wholeSections, func(sec string) bool { return strings.HasPrefix(key, sec) }) {
			t.Errorf("key %s has no row in docs/configuration.md", key)
		}
	}
	for key := range rows {
		if shape.leaves[key] == nil && !shape.sections[key] {
			t.Errorf("docs/configuration.md has a row for %s, which is no key", key)
		}
	}
}

// deliberateTypos are the misspelt names the docs show being refused.
var deliberateTypos = map[string]bool{"EXTRACT_RUN_MAX_INFLGHT": true}

// Every EXTRACT_* name that the repo's scripts, docs, configs and code (tests aside, which
// misspell on purpose) use is one the binary accepts: a script that sets another stops
// every extract it starts with exit 2 (scripts/device_transformers.sh's EXTRACT_BIN did).
func TestEveryEnvNameTheReposScriptsAndDocsUseIsAccepted(t *testing.T) {
	known := map[string]bool{}
	for key := range flatten(Default()) {
		known[EnvName(key)] = true
	}
	// \b: DEVICE_EXTRACT_BIN is another name, not EXTRACT_BIN.
	name := regexp.MustCompile(`\bEXTRACT_[A-Z0-9_]*[A-Z0-9]`)
	checked := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".wt", "out", "node_modules", "testdata", "__pycache__":
				return filepath.SkipDir
			}
			return nil
		}
		ext := filepath.Ext(path)
		if strings.HasSuffix(path, "_test.go") || strings.HasPrefix(d.Name(), "test_") ||
			!slices.Contains([]string{".sh", ".md", ".py", ".yaml", ".go", ""}, ext) || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if ext == "" && !bytes.HasPrefix(b, []byte("#!")) {
			return nil
		}
		checked++
		for _, n := range name.FindAllString(string(b), -1) {
			if !known[n] && envNotKeys[n] == "" && !deliberateTypos[n] {
				t.Errorf("%s uses %s, which extract refuses (no config key, not in configs/env.go's envNotKeys)", path, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 20 {
		t.Fatalf("checked only %d files: is the walk rooted at the repo?", checked)
	}
}
