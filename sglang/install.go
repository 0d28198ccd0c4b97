package sglang

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// installProbe is the Python that InspectInstall runs; see its docstring.
//
//go:embed hook/install_probe.py
var installProbe string

const installProbePrefix = "extract-install-probe: "

// srtDir is the part of SGLang the audit covers: the server runtime, where the hook's
// seams and the model files (deepseek_v2.py) are, and where hand patches go.
const srtDir = "sglang/srt/"

// InstallFacts is what InspectInstall found out about the SGLang a server would run.
type InstallFacts struct {
	// Version is sglang.__version__ (else the pip metadata's).
	Version string `json:"version"`
	// Location is the sglang package folder that `import sglang` loads.
	Location string `json:"location"`
	// DistInfo is the pip metadata folder of that package ("" for none).
	DistInfo string `json:"dist_info,omitempty"`
	// Editable: a source checkout (pip install -e, or the package folder on PYTHONPATH
	// inside a git work tree), audited against its git HEAD.
	Editable bool   `json:"editable"`
	GitRoot  string `json:"git_root,omitempty"`
	GitHead  string `json:"git_head,omitempty"`
	// Audit says how the files under sglang/srt were checked, or why they were not
	// (then Audited is false).
	Audit   string `json:"audit"`
	Audited bool   `json:"audited"`
	// Modified are files under sglang/srt whose bytes differ from what the wheel's
	// RECORD or git HEAD says, or that neither knows (an added .py file); Missing are
	// files they list that are gone. Both as "sglang/srt/...", sorted.
	Modified []string `json:"modified,omitempty"`
	Missing  []string `json:"missing,omitempty"`
	// Seams is the dump hook's verdict on each module it patches; Unsupported names
	// the ones it cannot patch (a server would exit at start). SeamsError says why the
	// seams are unknown, when they are.
	Seams       []SeamFact `json:"seams,omitempty"`
	Unsupported []string   `json:"unsupported,omitempty"`
	SeamsError  string     `json:"seams_error,omitempty"`
}

// SeamFact is the hook's verdict on one SGLang module it patches: OK with the variant
// it patched (Detail), or what is wrong.
type SeamFact struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// probeAnswer is install_probe.py's JSON line.
type probeAnswer struct {
	Missing     bool              `json:"missing"`
	Location    string            `json:"location"`
	Version     string            `json:"version"`
	ImportError string            `json:"import_error"`
	DistInfo    string            `json:"dist_info"`
	Site        string            `json:"site"`
	DistMatches bool              `json:"dist_matches"`
	Record      bool              `json:"record"`
	DirectURL   *directURL        `json:"direct_url"`
	DistError   string            `json:"dist_error"`
	HookError   string            `json:"hook_error"`
	Seams       map[string]string `json:"seams"`
}

// directURL is the part of PEP 610's direct_url.json that marks an editable install.
type directURL struct {
	URL     string `json:"url"`
	DirInfo struct {
		Editable bool `json:"editable"`
	} `json:"dir_info"`
}

// InspectInstall asks the interpreter python (a name on PATH or a path), run with env
// (nil: ours) as the server would be, about its SGLang in one process that loads no
// model: the version and folder, and the dump hook's verdict on each seam, with the
// hook imported from hookDir ("" installs this binary's hook into a temporary folder for
// the probe). It then audits the files under sglang/srt: a wheel install against its
// RECORD hashes, a source checkout against git HEAD. ctx bounds the probe and the git
// commands; the probe's process group is killed when it ends. An interpreter without
// SGLang is ErrNoSGLang; an SGLang that fails to import is an error returned with the
// facts found (the audit included).
func InspectInstall(ctx context.Context, python string, env []string, hookDir string) (InstallFacts, error) {
	var f InstallFacts
	path, err := exec.LookPath(python)
	if err != nil {
		return f, err
	}
	if hookDir == "" {
		tmp, err := os.MkdirTemp("", "extract-hook-probe-")
		if err != nil {
			return f, fmt.Errorf("install the dump hook for the probe: %w", err)
		}
		defer func() { _ = os.RemoveAll(tmp) }()
		if err := InstallHook(tmp); err != nil {
			return f, err
		}
		hookDir = tmp
	}
	a, err := runInstallProbe(ctx, path, probeEnv(env, hookDir))
	if err != nil {
		return f, err
	}
	if a.Missing {
		return f, fmt.Errorf("%s: %w", path, ErrNoSGLang)
	}
	f.Version, f.Location = a.Version, a.Location
	if a.DistMatches || (a.DirectURL != nil && a.DirectURL.DirInfo.Editable) {
		f.DistInfo = a.DistInfo
	}
	f.seams(a)
	if err := f.audit(ctx, a); err != nil {
		return f, err
	}
	if a.ImportError != "" {
		return f, fmt.Errorf("%s: import sglang (from %s): %s", path, a.Location, a.ImportError)
	}
	return f, nil
}

// probeEnv is env (nil: ours) with hookDir first on PYTHONPATH, as the server gets it,
// and no bytecode written: the probe must not add files to the install it audits.
func probeEnv(env []string, hookDir string) []string {
	if env == nil {
		env = os.Environ()
	}
	pythonPath := hookDir
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "PYTHONPATH":
			if v != "" {
				pythonPath = hookDir + ":" + v
			}
		case "PYTHONDONTWRITEBYTECODE":
		default:
			out = append(out, kv)
		}
	}
	return append(out, "PYTHONPATH="+pythonPath, "PYTHONDONTWRITEBYTECODE=1")
}

// runInstallProbe runs the probe and reads its last answer line. A probe that dies
// after its first answer (in a seam import) still gives what it said, with the seams
// unknown.
func runInstallProbe(ctx context.Context, path string, env []string) (probeAnswer, error) {
	var a probeAnswer
	cmd := exec.CommandContext(ctx, path, "-c", installProbe)
	// Not our working dir: Python puts it first on sys.path, and a folder there named
	// sglang (as in extract's own source tree) would pass for the package.
	cmd.Env, cmd.Dir = env, "/"
	// The whole group goes when ctx ends (SGLang's imports may start helpers), and a
	// child that kept stdout open cannot hold us past it either.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	if ctx.Err() != nil {
		return a, fmt.Errorf("%s -c <install probe>: %w", path, context.Cause(ctx))
	}
	answered := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), installProbePrefix)
		if !ok {
			continue
		}
		var next probeAnswer
		if err := json.Unmarshal([]byte(line), &next); err != nil {
			return a, fmt.Errorf("%s -c <install probe>: bad answer %q: %w", path, line, err)
		}
		a, answered = next, true
	}
	why := func(err error) string {
		if s := lastLine(stderr.Bytes()); s != "" {
			return fmt.Sprintf("%v: %s", err, s)
		}
		return err.Error()
	}
	switch {
	case runErr != nil && !answered:
		return a, fmt.Errorf("%s -c <install probe>: %s", path, why(runErr))
	case runErr != nil && a.Seams == nil && a.HookError == "":
		a.HookError = "the probe died while importing the seam modules: " + why(runErr)
	case !answered:
		return a, fmt.Errorf("%s -c <install probe>: no answer on stdout", path)
	}
	return a, nil
}

// seams turns the hook's report ("ok: <variant>" or the problem, per module) into facts.
func (f *InstallFacts) seams(a probeAnswer) {
	if a.HookError != "" {
		f.SeamsError = "the dump hook could not be asked: " + a.HookError
	} else if a.ImportError != "" {
		f.SeamsError = "sglang does not import"
	}
	names := make([]string, 0, len(a.Seams))
	for name := range a.Seams {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		detail, ok := strings.CutPrefix(a.Seams[name], "ok: ")
		f.Seams = append(f.Seams, SeamFact{Name: name, OK: ok, Detail: detail})
		if !ok {
			f.Unsupported = append(f.Unsupported, name)
		}
	}
}

// audit checks the files under sglang/srt against what the install says they are.
// Only a failure of ctx is an error; anything else leaves the install unaudited and
// says why.
func (f *InstallFacts) audit(ctx context.Context, a probeAnswer) error {
	if f.Location == "" {
		f.Audit = "not audited: the probe did not say where sglang is"
		return nil
	}
	editable := a.DirectURL != nil && a.DirectURL.DirInfo.Editable
	if !editable && a.DistMatches && a.Record {
		if err := f.auditRecord(a.Site, a.DistInfo); err != nil {
			f.Audit = fmt.Sprintf("not audited: %v", err)
		}
		return nil
	}
	root, err := git(ctx, f.Location, "rev-parse", "--show-toplevel")
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if err != nil {
		switch {
		case editable:
			f.Editable = true
			f.Audit = fmt.Sprintf("not audited: an editable install from %s, not in a git work tree (%v)", a.DirectURL.URL, err)
		case a.DistInfo != "":
			f.Audit = fmt.Sprintf("not audited: %s has no RECORD of this package, and %s is not in a git work tree", a.DistInfo, f.Location)
		default:
			f.Audit = fmt.Sprintf("not audited: no pip metadata (RECORD), and %s is not in a git work tree", f.Location)
		}
		return nil
	}
	f.Editable = true
	if err := f.auditGit(ctx, root); err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		f.Audit = fmt.Sprintf("not audited: %v", err)
	}
	return nil
}

// auditRecord re-hashes every file under sglang/srt that the wheel's RECORD lists, as
// pip wrote it (sha256, urlsafe base64 without padding), and looks for .py files it
// does not list.
func (f *InstallFacts) auditRecord(site, distInfo string) error {
	recordPath := filepath.Join(distInfo, "RECORD")
	b, err := os.ReadFile(recordPath)
	if err != nil {
		return err
	}
	r := csv.NewReader(bytes.NewReader(b))
	r.FieldsPerRecord = -1
	listed := map[string]bool{}
	checked := 0
	for {
		row, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", recordPath, err)
		}
		name := filepath.ToSlash(filepath.Clean(row[0]))
		if !strings.HasPrefix(name, srtDir) {
			continue
		}
		listed[name] = true
		algo, want, _ := strings.Cut(rowField(row, 1), "=")
		if algo != "sha256" {
			continue // .pyc and RECORD itself carry no hash
		}
		checked++
		got, err := fileSHA256(filepath.Join(site, name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			f.Missing = append(f.Missing, name)
		case err != nil:
			return err
		case got != want:
			f.Modified = append(f.Modified, name)
		}
	}
	added, err := unlistedPy(site, listed)
	if err != nil {
		return err
	}
	f.Modified = append(f.Modified, added...)
	slices.Sort(f.Modified)
	slices.Sort(f.Missing)
	f.Audited = true
	f.Audit = fmt.Sprintf("wheel install: %d files under %s checked against %s", checked, srtDir, recordPath)
	return nil
}

func rowField(row []string, i int) string {
	if i < len(row) {
		return row[i]
	}
	return ""
}

// fileSHA256 is the file's sha256 as RECORD writes it.
func fileSHA256(path string) (string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = fh.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)), nil
}

// unlistedPy lists the .py files under site/sglang/srt that RECORD does not: a hand-added
// module is as much a patch as an edited one.
func unlistedPy(site string, listed map[string]bool) ([]string, error) {
	var out []string
	root := filepath.Join(site, srtDir)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "__pycache__" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".py") {
			return nil
		}
		rel, err := filepath.Rel(site, p)
		if err != nil {
			return err
		}
		if rel = filepath.ToSlash(rel); !listed[rel] {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", root, err)
	}
	return out, nil
}

// auditGit compares the checkout's sglang/srt with its HEAD: `git status` names what
// was edited, added or deleted there.
func (f *InstallFacts) auditGit(ctx context.Context, root string) error {
	f.GitRoot = root
	head, err := git(ctx, root, "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	f.GitHead = head
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return err
	}
	pkg, err := filepath.Rel(real, f.Location)
	if err != nil || strings.HasPrefix(pkg, "..") {
		return fmt.Errorf("%s is not inside the git work tree %s", f.Location, root)
	}
	srt := filepath.ToSlash(filepath.Join(pkg, "srt"))
	// -z: paths verbatim (no quoting), renames as "new\0old\0".
	out, err := git(ctx, root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", srt)
	if err != nil {
		return err
	}
	fields := strings.Split(out, "\x00")
	for i := 0; i < len(fields); i++ {
		e := fields[i]
		if len(e) < 4 {
			continue
		}
		xy, p := e[:2], e[3:]
		if xy[0] == 'R' || xy[0] == 'C' {
			i++ // the old name
		}
		if strings.Contains(p, "/__pycache__/") || strings.HasSuffix(p, ".pyc") {
			continue
		}
		rel, ok := strings.CutPrefix(p, srt+"/")
		if !ok {
			continue
		}
		name := srtDir + rel
		if strings.Contains(xy, "D") {
			f.Missing = append(f.Missing, name)
		} else {
			f.Modified = append(f.Modified, name)
		}
	}
	slices.Sort(f.Modified)
	slices.Sort(f.Missing)
	f.Audited = true
	f.Audit = fmt.Sprintf("source checkout: %s checked against git HEAD %.12s of %s", srt, head, root)
	return nil
}

// git runs git -C dir args and returns its trimmed stdout; the error carries its stderr.
func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...)
	// No pager, no prompt, and the user's own config still applies (safe.directory).
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_PAGER=cat", "GIT_OPTIONAL_LOCKS=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if s := lastLine(stderr.Bytes()); s != "" {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, s)
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimRight(string(out), "\n"), nil
}
