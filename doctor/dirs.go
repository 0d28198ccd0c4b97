// The job's folders and files: they exist or can be made, are ours, and survive a reboot.

package doctor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/errclass"
	"github.com/extract-dev/extract/shm"
)

// jobDirs are the folders a run creates, with the config key that sets each.
func jobDirs(cfg *configs.Config) []struct{ name, key, dir string } {
	return []struct{ name, key, dir string }{
		{"output", "output_dir", cfg.OutputDir},
		{"state", "state_dir", cfg.StateDir},
	}
}

func dirFix(key string) string {
	return fmt.Sprintf("create it and make it writable for this user, or set %s", key)
}

// MakeJobDirs creates the output and state dirs, for the run loop: it lives here so that
// one that cannot be made is the preflight refusal (ErrPreflight, exit 3) doctor's output
// and state checks report, with the same fix: the node is not fit to run.
func MakeJobDirs(cfg *configs.Config) error {
	for _, d := range jobDirs(cfg) {
		// Durably: a power cut must not take the state dir (and the index) with it.
		if err := atomicfile.MkdirAll(d.dir, 0o755); err != nil {
			return fmt.Errorf("%w: %s: cannot create %s %s: %w (fix: %s)", errclass.ErrPreflight, d.name, d.key, d.dir, err, dirFix(d.key))
		}
	}
	return nil
}

// checkDirs checks that the output and state dirs are (or can be made) writable, and
// flags them when a reboot would wipe them.
func (d *doctor) checkDirs(context.Context) []Check {
	var checks []Check
	for _, j := range jobDirs(d.cfg) {
		checks = append(checks, d.checkDir(j.name, j.key, j.dir))
	}
	return checks
}

func (d *doctor) checkDir(name, key, dir string) Check {
	fix := dirFix(key)
	existing, err := existingAncestor(dir)
	if err != nil {
		return failCheck(name, fix, "%s %s: %v", key, dir, err)
	}
	if err := unix.Access(existing, unix.W_OK|unix.X_OK); err != nil {
		return failCheck(name, fix, "%s %s: %s is not writable: %v", key, dir, existing, err)
	}
	where := dir
	if existing != dir {
		where = fmt.Sprintf("%s (does not exist yet; the run creates it in %s)", dir, existing)
	}
	if why := Volatile(existing); why != "" {
		return warnCheck(name, fmt.Sprintf("set %s to a folder on a durable disk", key), "%s is %s: lost on reboot", where, why)
	}
	return okCheck(name, "%s is writable", where)
}

// checkFiles flags a config file or extract binary that a reboot would wipe: the cron
// line that resumes the job would then find nothing to run, as the incident's script,
// kept in /tmp, was lost.
func (d *doctor) checkFiles(context.Context) []Check {
	var checks []Check
	for _, f := range []struct{ name, path, fix string }{
		{"config file", d.opt.ConfigFile, "keep the config on a durable disk (e.g. beside the output, or in a repository) and point --config there"},
		{"executable", d.opt.Executable, "install extract on a durable disk (e.g. /usr/local/bin) and run it from there"},
	} {
		if f.path == "" {
			continue
		}
		path, err := filepath.Abs(f.path)
		if err != nil {
			checks = append(checks, warnCheck(f.name, "", "%s: %v", f.path, err))
			continue
		}
		if f.name == "executable" && goRunBuild(path) {
			// The quick start's binary: go run builds it again each time, so a reboot loses
			// nothing; a warning on every demo run would teach to ignore the check.
			checks = append(checks, okCheck(f.name, "%s is a `go run` build, made again by each go run; for cron or systemd install one (go build -o /usr/local/bin/extract ./cmd/extract)", path))
			continue
		}
		if why := Volatile(filepath.Dir(path)); why != "" {
			checks = append(checks, warnCheck(f.name, f.fix, "%s is %s: lost on reboot, and a resume with it", path, why))
			continue
		}
		checks = append(checks, okCheck(f.name, "%s is on a durable disk", path))
	}
	return checks
}

// goRunBuild says whether exe is where `go run` puts the binary it builds:
// $GOTMPDIR/go-build<n>/b<k>/exe/<name>.
func goRunBuild(exe string) bool {
	dir := filepath.Dir(exe)
	if filepath.Base(dir) != "exe" {
		return false
	}
	return strings.HasPrefix(filepath.Base(filepath.Dir(filepath.Dir(dir))), "go-build")
}

// existingAncestor is dir itself if it exists, else its nearest existing parent; an
// existing path that is not a folder is an error.
func existingAncestor(dir string) (string, error) {
	p := filepath.Clean(dir)
	for {
		st, err := os.Stat(p)
		if err == nil {
			if !st.IsDir() {
				return "", fmt.Errorf("%s is not a folder", p)
			}
			return p, nil
		}
		// ENOTDIR: a file on the way; going up finds it and says so.
		if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return "", err
		}
		parent := filepath.Dir(p)
		if parent == p {
			return "", err
		}
		p = parent
	}
}

// Volatile says why an existing folder would not survive a reboot, or "".
func Volatile(dir string) string {
	if fs, err := shm.StatFS(dir); err == nil && fs.Tmpfs {
		return "on tmpfs"
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		real = dir
	}
	// /tmp is emptied at boot on most distributions (tmpfs, or systemd-tmpfiles).
	if real == "/tmp" || strings.HasPrefix(real, "/tmp/") {
		return "under /tmp"
	}
	return ""
}
