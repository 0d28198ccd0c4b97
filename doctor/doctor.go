package doctor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/errclass"
	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/shm"
)

// The statuses of a Check.
const (
	CheckOK   = "ok"
	CheckWarn = "warn"
	CheckFail = "fail"
)

// Check is one finding of Run: what was looked at, how it stands, why, and what to do.
type Check struct {
	Name   string `json:"name"`
	Status string `json:"status"` // ok | warn | fail
	Reason string `json:"reason"`
	Fix    string `json:"fix,omitempty"`
}

// Report is every check Run made. OK is true when none failed: a run could start.
type Report struct {
	Checks []Check `json:"checks"`
	OK     bool    `json:"ok"`
	// RunningPID is the run that holds the lock, 0 for none: another `extract run`
	// would exit 0 at once, leaving it be.
	RunningPID int `json:"running_pid,omitempty"`
	// SGLang is what the install probe found (kind sglang): version, seams, and the
	// files under sglang/srt that differ from the install's record.
	SGLang *sglang.InstallFacts `json:"sglang,omitempty"`
}

// Failed lists the checks that failed.
func (r Report) Failed() []Check {
	var out []Check
	for _, c := range r.Checks {
		if c.Status == CheckFail {
			out = append(out, c)
		}
	}
	return out
}

// Err is nil when a run could start, else an errclass.ErrPreflight error (exit 3) that names each
// failed check with its fix.
func (r Report) Err() error {
	failed := r.Failed()
	if len(failed) == 0 {
		return nil
	}
	parts := make([]string, len(failed))
	for i, c := range failed {
		parts[i] = c.Name + ": " + c.Reason
		if c.Fix != "" {
			parts[i] += " (fix: " + c.Fix + ")"
		}
	}
	return fmt.Errorf("%w: %s", errclass.ErrPreflight, strings.Join(parts, "; "))
}

// Options are Run's inputs besides the config.
type Options struct {
	// GPUs reads the GPUs; nil means the system's NVML. Tests pass an inspector over
	// go-nvml's mock of an H200 node.
	GPUs *sglang.GPUInspector
	// Dataset, when set, is the job's dataset already opened (run's preflight); nil:
	// Run opens cfg.Dataset itself.
	Dataset *dataset.Dataset
	// Index, when set, is the job's index opened by a caller that holds the run lock;
	// nil: Run opens it read-only, and only when no run holds the lock.
	Index *checkpoint.Index
	// Log receives each check that is not ok; nil logs nothing.
	Log *slog.Logger
	// ConfigFile and Executable, when set, are the config file and the extract binary a
	// resume would use: Run warns when either lives where a reboot wipes it.
	ConfigFile string
	Executable string
	// Job is what only the run loop knows; orchestrator.Doctor fills it.
	Job JobFacts
}

// JobFacts are the run loop's facts about the job, passed in so that doctor judges them
// without importing orchestrator: who holds the lock, how it lays out files and sizes
// samples, how it would launch the server. Each is read when its check runs.
type JobFacts struct {
	// LockHolder is who holds the run lock now, and whether anyone does.
	LockHolder func() (Holder, bool)
	// RunStatusAddr is the status address run.json records for the run of pid, if any.
	RunStatusAddr func(pid int) (string, bool)
	// OutputFiles counts the job's output files under output_dir for the samples it owns
	// of ds (every sample when ds is nil): what a lost index leaves behind.
	OutputFiles func(ds *dataset.Dataset) (int, error)
	// SampleBytes is what admission reserves for a sample of tokens.
	SampleBytes func(tokens int) int64
	// CheckConversations refuses a conversation job prepare could not carry out.
	CheckConversations func() error
	// Launch is how the run would launch the server.
	Launch sglang.LaunchSpec
}

// Holder is who holds the run lock, as doctor names it.
type Holder struct {
	PID  int
	Run  bool   // a run, not a verify, import or export
	Name string // how messages name the holder
}

func (h Holder) String() string { return h.Name }

// Doctor limits. The stat check of the index samples this many done records, spread
// evenly, so it stays quick at a million samples; the probe of the server's Python is
// bounded because an interpreter on a hung network filesystem would never answer, and
// generously, because importing SGLang's seam modules imports torch and its kernels
// (tens of seconds on a cold page cache).
const (
	doctorStatSample    = 200
	doctorPythonTimeout = 2 * time.Minute
	doctorIndexTimeout  = time.Second
)

// Run checks whether a run of cfg could start on this machine: GPUs and who holds
// them, the server port, model, dump hook and Python, the output and state dirs, free
// space against what the remaining samples need, the staging dir and its leftovers, and
// the index. It never opens the index while a run holds the lock, and closes the index
// it opens before its slow checks; it never signals or changes anything, and returns an
// error only when ctx ends.
func Run(ctx context.Context, cfg *configs.Config, opt Options) (Report, error) {
	d := &doctor{cfg: cfg, opt: opt}
	defer d.close()
	if opt.Log == nil {
		d.opt.Log = slog.New(slog.DiscardHandler)
	}
	if opt.GPUs == nil {
		d.opt.GPUs = sglang.NewGPUInspector(nil)
	}
	datasetCheck := d.loadDataset(ctx)
	if err := ctx.Err(); err != nil {
		return Report{}, fmt.Errorf("%w: stopped (%v) during the checks", errclass.ErrTemporary, err)
	}
	// Read first, and closed at once: a run started while the probes below take their
	// time must not find the index locked (issue 8, item 10).
	d.loadIndex()
	var err error
	d.server, err = sglang.LoadServerIdentity(cfg.StateDir, d.opt.Log)
	if err != nil {
		d.opt.Log.Warn("doctor: cannot tell our server's processes", "state_dir", cfg.StateDir, "err", err)
	}

	var rep Report
	steps := []struct {
		server bool // needed only to run the server: moot once the job is complete
		run    func(context.Context) []Check
	}{
		{true, d.checkGPUs},
		{true, d.checkPort},
		{true, d.checkStatusPort}, // ports.go
		{true, d.checkReplicas},   // replicas.go: each replica's GPUs and port
		{true, d.checkModel},
		{true, d.checkHook},
		{true, d.checkSGLang},
		{true, d.checkTransformers},
		{false, func(context.Context) []Check { return []Check{datasetCheck} }},
		{false, d.checkTokenizer}, // prepare.go
		{false, d.checkDirs},
		{false, d.checkFiles},
		{false, d.checkDisk},
		{true, d.checkStaging},
		{false, d.checkIndex},
	}
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("%w: stopped (%v) during the checks", errclass.ErrTemporary, err)
		}
		for _, c := range s.run(ctx) {
			if s.server && d.complete && c.Status == CheckFail {
				c.Status = CheckWarn
				c.Reason += " (no server is needed: the job is complete)"
			}
			rep.Checks = append(rep.Checks, c)
		}
	}
	if err := ctx.Err(); err != nil {
		return rep, fmt.Errorf("%w: stopped (%v) during the checks", errclass.ErrTemporary, err)
	}
	rep.OK = len(rep.Failed()) == 0
	rep.RunningPID = d.running
	rep.SGLang = d.install
	for _, c := range rep.Checks {
		switch c.Status {
		case CheckFail:
			d.opt.Log.Error("preflight check failed", "check", c.Name, "reason", c.Reason, "fix", c.Fix)
		case CheckWarn:
			d.opt.Log.Warn("preflight check warns", "check", c.Name, "reason", c.Reason, "fix", c.Fix)
		}
	}
	return rep, nil
}

type doctor struct {
	cfg *configs.Config
	opt Options

	ds    *dataset.Dataset
	ownDS bool
	// index is what was read from the index; indexVerdict, when set, is the index
	// check's outcome decided without reading it (a run holds it, there is none, it
	// cannot be opened).
	index        checkpoint.IndexFacts
	indexVerdict []Check
	prog         *checkpoint.Progress // nil when the index was not read or is another dataset's
	running      int                  // pid of the run holding the lock, 0 for none
	complete     bool
	server       *sglang.ServerIdentity
	install      *sglang.InstallFacts // nil unless the install probe found one
}

func (d *doctor) close() {
	if d.ownDS && d.ds != nil {
		_ = d.ds.Close()
	}
}

func (d *doctor) kindSGLang() bool { return d.cfg.Server.Kind == sglang.KindSGLang }

func okCheck(name, format string, args ...any) Check {
	return Check{Name: name, Status: CheckOK, Reason: fmt.Sprintf(format, args...)}
}

func warnCheck(name, fix, format string, args ...any) Check {
	return Check{Name: name, Status: CheckWarn, Reason: fmt.Sprintf(format, args...), Fix: fix}
}

func failCheck(name, fix, format string, args ...any) Check {
	return Check{Name: name, Status: CheckFail, Reason: fmt.Sprintf(format, args...), Fix: fix}
}

func fmtSize(n int64) string { return configs.ByteSize(n).String() }

// loadDataset opens the dataset (unless the caller did) and says how it stands.
func (d *doctor) loadDataset(ctx context.Context) Check {
	d.ds = d.opt.Dataset
	if d.ds == nil {
		if c, done := d.loadConversations(); done { // prepare.go
			return c
		}
		ds, err := dataset.OpenJob(ctx, d.cfg)
		if err != nil {
			fix := "point dataset at the job's JSONL file"
			if strings.Contains(err.Error(), " line ") {
				fix = "fix that line (the sample index is the 0-based line number)"
			}
			return failCheck("dataset", fix, "%v", err)
		}
		d.ds, d.ownDS = ds, true
	}
	return okCheck("dataset", "%d samples, %d tokens, sha256 %.12s… (%s)", d.ds.Len(), d.ds.TotalTokens(nil), d.ds.Fingerprint, d.ds.Path)
}

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

// remaining lists the samples a run would still send.
func (d *doctor) remaining() []int {
	var out []int
	for i := range d.ds.Len() {
		if d.prog == nil || d.prog.State[i] != checkpoint.StateDone {
			out = append(out, i)
		}
	}
	return out
}

// checkDisk compares free space on the output disk with what the remaining samples
// will write plus disk.reserve: the incident was a disk that filled at half the job.
func (d *doctor) checkDisk(context.Context) []Check {
	const name = "disk"
	reserve := int64(d.cfg.Disk.Reserve)
	existing, err := existingAncestor(d.cfg.OutputDir)
	if err != nil {
		return []Check{failCheck(name, "", "output_dir %s: %v", d.cfg.OutputDir, err)}
	}
	fs, err := shm.StatFS(existing)
	if err != nil {
		return []Check{failCheck(name, "", "%v", err)}
	}
	if d.ds == nil {
		return []Check{warnCheck(name, "fix the dataset first", "%s free at %s; the need is unknown without a readable dataset", fmtSize(fs.Free), existing)}
	}
	if d.running > 0 {
		// The index, and so what is left, is not read while a run holds it.
		return []Check{okCheck(name, "%s free at %s (%s kept in reserve); a run is in progress (pid %d) and pauses at the reserve", fmtSize(fs.Free), existing, fmtSize(reserve), d.running)}
	}
	left := d.remaining()
	if len(left) == 0 {
		return []Check{okCheck(name, "%s free at %s; every sample is done, nothing is left to write", fmtSize(fs.Free), existing)}
	}
	var tokens int64
	text := 0
	for _, s := range left {
		tokens += int64(d.ds.Tokens(s))
		if d.ds.IsText(s) {
			text++
		}
	}
	need := tokens * d.cfg.OutputBytesPerToken()
	msg := fmt.Sprintf("%s free at %s; the %d remaining samples (%d tokens × %d bytes) need %s, plus %s kept in reserve",
		fmtSize(fs.Free), existing, len(left), tokens, d.cfg.OutputBytesPerToken(), fmtSize(need), fmtSize(reserve))
	if fs.Free >= need+reserve {
		return []Check{okCheck(name, "%s", msg)}
	}
	short := need + reserve - fs.Free
	fix := fmt.Sprintf("free %s on that disk, or set output_dir to a disk with room", fmtSize(short))
	if first := d.opt.Job.SampleBytes(d.ds.Tokens(left[0])); fs.Free < reserve+first {
		return []Check{failCheck(name, fix, "%s: not even the next sample (%s) fits above the reserve, so a run would admit nothing", msg, fmtSize(first))}
	}
	switch {
	case text > 0:
		// A text sample's tokens are counted as its bytes, several times too many.
		return []Check{warnCheck(name, fix, "%s (an upper bound: %d text samples are counted by bytes)", msg, text)}
	case d.cfg.Disk.WhenShort == "warn":
		return []Check{warnCheck(name, fix, "%s: the run pauses at the reserve, %s short, until room returns", msg, fmtSize(short))}
	}
	return []Check{failCheck(name, fix+", or set disk.when_short: warn to start anyway and pause at the reserve, "+fmtSize(short)+" short", "%s", msg)}
}

// StagingOwner is who may write the staging dirs: us, and the members of shm_group.
func StagingOwner(cfg *configs.Config) (shm.Owner, error) {
	gid, err := shm.LookupGroup(cfg.ShmGroup)
	if err != nil {
		return shm.Owner{}, fmt.Errorf("%w: %w", configs.ErrInvalid, err)
	}
	return shm.Owner{UID: os.Geteuid(), Group: gid}, nil
}

// checkStaging checks the staging dir: only we (and shm_group) may write it and every
// replica's subdir, a tmpfs, room for its budget and for the largest remaining dump, and
// what a crashed run left there.
func (d *doctor) checkStaging(context.Context) []Check {
	const name = "staging"
	dir := d.cfg.ShmDir
	owner, err := StagingOwner(d.cfg)
	if err != nil {
		return []Check{failCheck(name, "set shm_group to a group that exists here (getent group), or unset it", "%v", err)}
	}
	for _, sd := range d.cfg.StagingDirs() {
		var unsafe *shm.UnsafeDirError
		if err := shm.CheckDir(sd, owner); errors.As(err, &unsafe) {
			return []Check{failCheck(name, unsafe.Fix, "%s: a dump planted or rewritten there would be adopted as a sample's output", unsafe.Problem)}
		}
	}
	existing, err := existingAncestor(dir)
	if err != nil {
		return []Check{failCheck(name, "set shm_dir to a folder on /dev/shm", "shm_dir %s: %v", dir, err)}
	}
	fs, err := shm.StatFS(existing)
	if err != nil {
		return []Check{failCheck(name, "", "%v", err)}
	}
	budget := int64(d.cfg.ShmBudget)
	if budget == 0 {
		budget = fs.Total / 2
	}
	lo := d.leftovers(dir)
	// What the run reclaims before it needs the room: dumps it moves or removes.
	room := fs.Free + lo.completeBytes
	var parts []string
	if existing != dir {
		parts = append(parts, fmt.Sprintf("%s does not exist yet (created at launch)", dir))
	} else {
		parts = append(parts, dir)
	}
	parts = append(parts, fmt.Sprintf("%s free of %s, budget %s", fmtSize(fs.Free), fmtSize(fs.Total), fmtSize(budget)))
	if lo.complete+lo.partial+lo.other > 0 {
		parts = append(parts, lo.String())
	}
	reason := strings.Join(parts, "; ")
	if d.ds != nil && d.running == 0 {
		largest, sample := int64(0), -1
		for _, s := range d.remaining() {
			if b := d.opt.Job.SampleBytes(d.ds.Tokens(s)); b > largest {
				largest, sample = b, s
			}
		}
		if sample >= 0 && largest > room {
			return []Check{failCheck(name, "free space on that tmpfs, grow it (mount -o remount,size=…), or drop the sample from the dataset",
				"%s; the largest remaining sample (%d, %d tokens) makes a %s dump, more than the %s the staging filesystem can offer", reason, sample, d.ds.Tokens(sample), fmtSize(largest), fmtSize(room))}
		}
	}
	switch {
	case !fs.Tmpfs:
		return []Check{warnCheck(name, "set shm_dir to a folder on /dev/shm", "%s; not on tmpfs: every dump is written to a disk before it is copied", reason)}
	case room < budget:
		return []Check{warnCheck(name, "free space on that tmpfs or lower shm_budget; admission keeps fewer samples in flight meanwhile",
			"%s; only %s of the budget is available", reason, fmtSize(room))}
	}
	return []Check{okCheck(name, "%s", reason)}
}

type stagingLeftovers struct {
	complete, adopt, stale, partial, other int
	completeBytes, partialBytes            int64
	known                                  bool // adopt and stale are known (the index was read)
}

func (l stagingLeftovers) String() string {
	var s []string
	if l.complete > 0 {
		c := fmt.Sprintf("%d complete dump(s), %s", l.complete, fmtSize(l.completeBytes))
		if l.known {
			c += fmt.Sprintf(": %d to adopt, %d stale (removed by the run)", l.adopt, l.stale)
		} else {
			c += ": adopted when they are their sample's current attempt"
		}
		s = append(s, c)
	}
	if l.partial > 0 {
		s = append(s, fmt.Sprintf("%d partial dump(s), %s, discarded when the run launches a fresh server", l.partial, fmtSize(l.partialBytes)))
	}
	if l.other > 0 {
		s = append(s, fmt.Sprintf("%d other file(s), ignored", l.other))
	}
	return "leftovers: " + strings.Join(s, "; ")
}

// leftovers counts what the staging dir holds: complete dumps a run adopts (the current
// attempt of a sample not done) or removes, partial ones it discards, and other files.
func (d *doctor) leftovers(dir string) stagingLeftovers {
	var lo stagingLeftovers
	entries, err := os.ReadDir(dir)
	if err != nil {
		return lo
	}
	lo.known = d.prog != nil
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		name := e.Name()
		if rid, isDump := shm.ParseDumpName(name); isDump {
			lo.complete++
			lo.completeBytes += info.Size()
			if lo.known {
				if rid.Sample < len(d.prog.State) && d.prog.State[rid.Sample] != checkpoint.StateDone && int(d.prog.Attempt[rid.Sample]) == rid.Attempt {
					lo.adopt++
				} else {
					lo.stale++
				}
			}
			continue
		}
		switch {
		case strings.HasSuffix(name, shm.PartialSuffix):
			lo.partial++
			lo.partialBytes += info.Size()
		case strings.HasPrefix(name, ".hook-"):
			// The hook's marker: part of a server, not a leftover.
		default:
			lo.other++
		}
	}
	return lo
}
