package sglang

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/extract-dev/extract/internal/atomicfile"
)

// hookFiles is the dump hook as the server needs it at run time. The files are named
// one by one: a directory pattern would drop __init__.py (embed skips names starting
// with '_'), and the tests and README stay out of the binary.
//
//go:embed hook/sitecustomize.py hook/extract_hook/*.py
var hookFiles embed.FS

// HookFS is the dump hook folder shipped in this binary: sitecustomize.py and the
// extract_hook package, rooted so that the folder it is copied to goes on PYTHONPATH.
func HookFS() fs.FS {
	sub, err := fs.Sub(hookFiles, "hook")
	if err != nil {
		// fs.Sub fails only on an invalid path; "hook" is a constant.
		panic(err)
	}
	return sub
}

var hookVersionPattern = regexp.MustCompile(`(?m)^HOOK_VERSION\s*=\s*"([^"]+)"`)

// hookVersion is read once from the embedded __init__.py, so the Go side can never
// report a version other than the one the Python side writes into every dump.
var hookVersion = sync.OnceValue(func() string {
	const path = "hook/extract_hook/__init__.py"
	b, err := hookFiles.ReadFile(path)
	if err != nil {
		panic(fmt.Sprintf("embedded dump hook: %v", err))
	}
	m := hookVersionPattern.FindSubmatch(b)
	if m == nil {
		panic(fmt.Sprintf("embedded dump hook: %s has no HOOK_VERSION = \"...\" line", path))
	}
	return string(m[1])
})

// HookVersion is the version of the dump hook shipped in this binary (HOOK_VERSION in
// extract_hook/__init__.py), as it appears in the hook_version metadata of its dumps.
func HookVersion() string { return hookVersion() }

// HookMarker is the marker file `.hook-<pid>.json` that an armed hook writes into the
// staging dir on TP rank 0 (see hook/README.md).
type HookMarker struct {
	PID         int    `json:"pid"`
	HookVersion string `json:"hook_version"`
	Protocol    string `json:"protocol"`
	Layers      string `json:"layers"`
	Model       string `json:"model"`
	Path        string `json:"-"`
}

// LiveHookMarkers lists the markers in dir whose process is alive: the hooks armed in
// running servers. A marker that does not parse is skipped; the hook writes them by
// rename, so that is a foreign file, not a torn write.
func LiveHookMarkers(dir string) []HookMarker {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []HookMarker
	for _, e := range entries {
		name := e.Name()
		digits, ok := strings.CutPrefix(name, ".hook-")
		if !ok {
			continue
		}
		digits, ok = strings.CutSuffix(digits, ".json")
		pid, err := strconv.Atoi(digits)
		if !ok || err != nil || pid <= 0 {
			continue
		}
		if st, err := readStat(pid); err != nil || st.dead() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		var m HookMarker
		if json.Unmarshal(b, &m) != nil || m.PID != pid {
			continue
		}
		m.Path = filepath.Join(dir, name)
		out = append(out, m)
	}
	return out
}

// HookDirName is the folder, under the state dir, that holds the hook of this version.
func HookDirName() string { return filepath.Join("hook", HookVersion()) }

// InstallHook writes the shipped hook into dir (created if needed), replacing what is
// there, each file atomically so a server starting meanwhile never imports a torn file.
func InstallHook(dir string) error {
	return fs.WalkDir(HookFS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, path)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := fs.ReadFile(HookFS(), path)
		if err != nil {
			return err
		}
		if err := atomicfile.WriteFile(dst, b, 0o644); err != nil {
			return fmt.Errorf("install dump hook: %w", err)
		}
		return nil
	})
}

// ServerHook finds the marker of the hook armed in the server whose process group is
// pgid: the proof that dumps will come, and the hook version they will carry.
func ServerHook(shmDir string, pgid int) (HookMarker, bool) {
	for _, m := range LiveHookMarkers(shmDir) {
		if st, err := readStat(m.PID); err == nil && st.pgid == pgid {
			return m, true
		}
	}
	return HookMarker{}, false
}
