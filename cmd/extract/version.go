package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/extract-dev/extract/sglang"
)

// Set by a release build: go build -ldflags "-X main.version=v1.2.0 -X main.buildDate=…".
// Without them the module version, the VCS stamp Go records and the binary's own mtime
// stand in, so a bug report still names the commit.
var (
	version   = ""
	buildDate = ""
)

// versionLine is what `extract --version` prints: the version, the commit (and whether
// the tree was modified), when the binary was built, and the dump hook it ships, which is
// what a server's dumps name in hook_version.
func versionLine() string {
	v, commit, when := version, "unknown", buildDate
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			commit = rev[:min(len(rev), 12)]
			if modified == "true" {
				commit += " (modified)"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	if when == "" {
		when = "unknown"
		if exe, err := os.Executable(); err == nil {
			if st, err := os.Stat(exe); err == nil {
				when = st.ModTime().UTC().Format(time.RFC3339)
			}
		}
	}
	return fmt.Sprintf("extract %s\ncommit:     %s\nbuilt:      %s\ndump hook:  %s\ngo:         %s", v, commit, when, sglang.HookVersion(), runtime.Version())
}
