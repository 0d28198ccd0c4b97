package doctor

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/internal/errclass"
	"github.com/extract-dev/extract/sglang"
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
	// GPUSettle bounds the wait for a GPU that lists only processes that have exited
	// (0: 10 s).
	GPUSettle time.Duration
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
