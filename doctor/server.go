package doctor

// The checks of the server's side of the node: GPUs, port, model, dump hook, and the
// SGLang install the server would run. The facts come from package sglang; these
// functions judge them.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/extract-dev/extract/sglang"
)

func (d *doctor) checkGPUs(ctx context.Context) []Check {
	if !d.usesGPUs() {
		return []Check{okCheck("gpu", "none needed (server.kind %s)", d.cfg.Server.Kind)}
	}
	wanted := d.cfg.GPUIndices()
	rep := d.opt.GPUs.Inspect(wanted)
	// A process that has just exited stays in NVML's list for a moment: a run started
	// right after another's server stopped was refused for it. Ask again a few times,
	// while only such processes stand in the way.
	for deadline := time.Now().Add(d.gpuSettle()); d.onlyExitedHolders(rep) && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return []Check{failCheck("gpu", "run doctor again", "stopped while waiting for exited processes to leave the GPUs: %v", ctx.Err())}
		case <-time.After(gpuSettleStep):
		}
		rep = d.opt.GPUs.Inspect(wanted)
	}
	if !rep.Available {
		return []Check{failCheck("gpu", "install or load the NVIDIA driver (`nvidia-smi` must work), or run doctor on the GPU node",
			"%s; server.kind %s needs GPUs %s", rep.Reason, d.cfg.Server.Kind, joinGPUIndices(wanted))}
	}
	var absent []int
	for _, g := range rep.GPUs {
		if !g.Present {
			absent = append(absent, g.Index)
		}
	}
	var checks []Check
	if len(absent) > 0 {
		checks = append(checks, failCheck("gpu", "set server.gpus (and server.tp_size) to GPUs this node has",
			"the job wants GPUs %s but NVML sees %d GPU(s) (driver %s): %s missing", joinGPUIndices(wanted), rep.Count, rep.Driver, joinGPUIndices(absent)))
	} else {
		checks = append(checks, okCheck("gpu", "driver %s, %d GPU(s); the job wants %s", rep.Driver, rep.Count, joinGPUIndices(wanted)))
	}
	for _, g := range rep.GPUs {
		if g.Present {
			checks = append(checks, d.checkGPU(g))
		}
	}
	return checks
}

// gpuSettleStep is how often GPUs held only by exited processes are asked again.
const gpuSettleStep = 250 * time.Millisecond

func (d *doctor) gpuSettle() time.Duration {
	if d.opt.GPUSettle > 0 {
		return d.opt.GPUSettle
	}
	return 10 * time.Second
}

// onlyExitedHolders is whether waiting could change the verdict: some wanted GPU lists a
// process that has exited, and every process on them that is not our server has.
func (d *doctor) onlyExitedHolders(rep sglang.GPUReport) bool {
	exited := false
	for _, g := range rep.GPUs {
		for _, p := range g.Processes {
			switch {
			case p.Exited:
				exited = true
			case !d.server.Owns(p.PID):
				return false
			}
		}
	}
	return exited
}

// checkGPU says whether one wanted GPU is free for our server, naming every other
// process on it and how to stop it.
func (d *doctor) checkGPU(g sglang.GPU) Check {
	name := fmt.Sprintf("gpu %d", g.Index)
	head := fmt.Sprintf("%s: %s of %s used", g.Name, fmtSize(int64(g.MemoryUsed)), fmtSize(int64(g.MemoryTotal)))
	if g.Utilization >= 0 {
		head += fmt.Sprintf(", %d%% busy", g.Utilization)
	}
	var ours, foreign []string
	var fixes []string
	for _, p := range g.Processes {
		if d.server.Owns(p.PID) {
			ours = append(ours, strconv.Itoa(p.PID))
			continue
		}
		foreign = append(foreign, p.Describe())
		if f := p.StopHint(); !slices.Contains(fixes, f) {
			fixes = append(fixes, f)
		}
	}
	switch {
	case len(foreign) > 0:
		return failCheck(name, strings.Join(fixes, "; "), "%s; held by %s: not our server", head, strings.Join(foreign, "; "))
	case g.Err != nil:
		return warnCheck(name, "run `nvidia-smi` to see who holds the GPU", "%s; %v", head, g.Err)
	case len(ours) > 0:
		return okCheck(name, "%s; held by our server (pid %s), which the run adopts or replaces", head, strings.Join(ours, ", "))
	case g.HiddenHolder():
		return warnCheck(name, "run `nvidia-smi` on the host: a process in another container or VM may hold the memory",
			"%s, but NVML lists no process on it", head)
	}
	return okCheck(name, "%s; no processes", head)
}

// checkPort says whether the server could listen on its port, and who holds it if not.
func (d *doctor) checkPort(context.Context) []Check {
	s := d.cfg.Server
	use, err := sglang.ProbePort(s.Host, s.Port)
	switch {
	case err != nil:
		return []Check{failCheck("port", "set server.host to an address of this machine", "cannot listen on %s: %v", use.Addr, err)}
	case !use.InUse:
		return []Check{okCheck("port", "%s is free", use.Addr)}
	case d.server != nil && d.server.Leader && d.server.Port == s.Port:
		return []Check{okCheck("port", "%s is held by our server (pid %d), which the run adopts or replaces", use.Addr, d.server.PID)}
	case d.server != nil && d.server.Launching && d.server.Port == s.Port:
		return []Check{okCheck("port", "%s is held by a server whose launch was interrupted (server id %s), which the run stops and replaces", use.Addr, d.server.ServerID)}
	}
	fix, who := d.portTaken(use, "server.port")
	return []Check{failCheck("port", fix, "%s is taken by %s", use.Addr, who)}
}

// checkModel compares the model's shape with the config: a mismatch would make every
// dump the wrong width, and every one of them rejected.
func (d *doctor) checkModel(context.Context) []Check {
	const name = "model"
	if !d.usesGPUs() {
		return []Check{okCheck(name, "none needed (server.kind %s)", d.cfg.Server.Kind)}
	}
	dir := d.cfg.Server.ModelPath
	fixPath := "set server.model_path to the model's local folder (config.json and weights)"
	shape, err := sglang.ReadModelShape(dir)
	switch {
	case errors.Is(err, sglang.ErrModelConfig):
		return []Check{failCheck(name, "repair or replace "+shape.ConfigPath, "%v", err)}
	case err != nil:
		return []Check{failCheck(name, fixPath, "server.model_path: %v", err)}
	}
	var wrong []string
	if shape.HiddenSize != 0 && shape.HiddenSize != d.cfg.Server.HiddenSize {
		wrong = append(wrong, fmt.Sprintf("hidden_size %d (server.hidden_size is %d)", shape.HiddenSize, d.cfg.Server.HiddenSize))
	}
	if shape.NumLayers != 0 && shape.NumLayers != d.cfg.Server.NumLayers {
		wrong = append(wrong, fmt.Sprintf("num_hidden_layers %d (server.num_layers is %d)", shape.NumLayers, d.cfg.Server.NumLayers))
	}
	where := shape.ConfigPath
	if shape.Nested != "" {
		where += " (" + shape.Nested + ")"
	}
	if len(wrong) > 0 {
		return []Check{failCheck(name, "set server.hidden_size, server.num_layers and server.layers for this model, or point server.model_path at the intended one",
			"%s says %s", where, strings.Join(wrong, ", "))}
	}
	arch := strings.Join(shape.Architectures, ",")
	if arch == "" {
		arch = "no architectures listed"
	}
	if shape.WeightFiles == 0 {
		return []Check{warnCheck(name, "download the weights into "+dir, "%s (%s, hidden %d, %d layers) has config.json but no *.safetensors or *.bin weights",
			dir, arch, d.cfg.Server.HiddenSize, d.cfg.Server.NumLayers)}
	}
	return []Check{okCheck(name, "%s (%s, hidden %d, %d layers, %d weight file(s))", dir, arch, d.cfg.Server.HiddenSize, d.cfg.Server.NumLayers, shape.WeightFiles)}
}

// checkHook reports the hook this binary ships and the ones armed in live servers.
func (d *doctor) checkHook(context.Context) []Check {
	const name = "hook"
	if !d.kindSGLang() && !d.kindTransformers() {
		return []Check{okCheck(name, "none needed (the simulator writes dumps itself)")}
	}
	ours := sglang.HookVersion()
	reason := fmt.Sprintf("dump hook %s shipped in this binary; installed at launch into %s", ours, filepath.Join(d.cfg.StateDir, sglang.HookDirName()))
	for _, m := range sglang.LiveHookMarkers(d.cfg.ShmDir) {
		if m.HookVersion != ours {
			return []Check{warnCheck(name, "stop that server so that the next run launches one with this binary's hook",
				"%s, but the server armed in pid %d runs hook %s (%s): its dumps carry that version", reason, m.PID, m.HookVersion, m.Path)}
		}
		reason += fmt.Sprintf("; armed in the live server (pid %d, layers %s)", m.PID, m.Layers)
	}
	return []Check{okCheck(name, "%s", reason)}
}

// checkSGLang asks server.python, in one probe that loads no model, which SGLang it
// has, whether the dump hook can patch each of its seams, and whether the files under
// sglang/srt are the ones the wheel's RECORD or the checkout's git HEAD says (issue 9):
// the incident's operator found by hand that the old dump patch was still applied.
//
// Unsupported seams fail: the hook's launch check would make the server exit at start.
// Modified files warn rather than fail: every dump is checked against its rid,
// protocol, layers, model and input_ids before it counts, so a second writer into
// staging costs staging room and rejected dumps, not wrong outputs; the seam check
// already fails when the hook cannot patch an edited seam module; and a site may carry
// a deliberate local fix. The warning names each file, and says so when the hook
// patches it.
func (d *doctor) checkSGLang(ctx context.Context) []Check {
	const name = "sglang"
	if !d.kindSGLang() {
		return nil
	}
	py := d.cfg.Server.Python
	fix := "install SGLang (pip install sglang) into a Python 3 and set server.python to it"
	path, err := exec.LookPath(py)
	if err != nil {
		return []Check{failCheck(name, fix, "server.python %q: %v", py, err)}
	}
	env := os.Environ()
	for k, v := range d.cfg.Server.Env {
		env = append(env, k+"="+v)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, doctorPythonTimeout, fmt.Errorf("no answer in %v", doctorPythonTimeout))
	defer cancel()
	// "": the probe imports the hook this binary ships, the one a launch installs.
	f, err := sglang.InspectInstall(ctx, path, env, "")
	if f.Location != "" {
		d.install = &f
	}
	var checks []Check
	switch {
	case err != nil && f.Location == "":
		return []Check{failCheck(name, fix, "%v", err)}
	case err != nil:
		checks = append(checks, failCheck(name, "repair the install (pip install --force-reinstall sglang=="+f.Version+"), or set server.python to a Python whose SGLang imports", "sglang %s in %s: %v", f.Version, f.Location, err))
	default:
		checks = append(checks, okCheck(name, "sglang %s in %s (%s)", f.Version, path, f.Location))
		checks = append(checks, seamCheck(f))
	}
	return append(checks, installCheck(f))
}

// seamCheck says whether the dump hook can patch every seam of the installed SGLang.
func seamCheck(f sglang.InstallFacts) Check {
	const name = "seams"
	fix := "use an SGLang release the dump hook supports (docs/server.md lists the seams and the SGLang changes behind each)"
	if f.SeamsError != "" {
		return failCheck(name, fix, "sglang %s: %s", f.Version, f.SeamsError)
	}
	if len(f.Unsupported) > 0 {
		var bad []string
		for _, s := range f.Seams {
			if !s.OK {
				bad = append(bad, s.Name+": "+s.Detail)
			}
		}
		return failCheck(name, fix, "the dump hook cannot patch %d of the %d seams of sglang %s (%s): the server would exit at start",
			len(f.Unsupported), len(f.Seams), f.Version, strings.Join(bad, "; "))
	}
	ok := make([]string, len(f.Seams))
	for i, s := range f.Seams {
		ok[i] = s.Detail
	}
	return okCheck(name, "the dump hook patches all %d seams of sglang %s: %s", len(f.Seams), f.Version, strings.Join(ok, "; "))
}

// installCheck reports the audit of the files under sglang/srt.
func installCheck(f sglang.InstallFacts) Check {
	const name = "sglang install"
	if !f.Audited {
		return warnCheck(name, "install SGLang with pip (a wheel records its files' hashes) or from a git checkout, so that a hand patch shows",
			"%s: %s", f.Location, f.Audit)
	}
	against := "the wheel's RECORD"
	undo := fmt.Sprintf("pip install --force-reinstall --no-deps sglang==%s", f.Version)
	if f.Editable {
		against = fmt.Sprintf("git HEAD %.12s of %s", f.GitHead, f.GitRoot)
		undo = fmt.Sprintf("git -C %s stash (or checkout) the changes under sglang/srt", f.GitRoot)
	}
	if len(f.Modified)+len(f.Missing) == 0 {
		return okCheck(name, "%s; no file under sglang/srt differs from %s", f.Audit, against)
	}
	var parts []string
	if len(f.Modified) > 0 {
		parts = append(parts, fmt.Sprintf("%d file(s) under sglang/srt differ from %s: %s", len(f.Modified), against, strings.Join(f.Modified, ", ")))
	}
	if len(f.Missing) > 0 {
		parts = append(parts, fmt.Sprintf("%d file(s) it lists are missing: %s", len(f.Missing), strings.Join(f.Missing, ", ")))
	}
	var seamFiles []string
	for _, s := range f.Seams {
		file := strings.ReplaceAll(s.Name, ".", "/") + ".py"
		if slices.Contains(f.Modified, file) || slices.Contains(f.Missing, file) {
			seamFiles = append(seamFiles, file)
		}
	}
	if len(seamFiles) > 0 {
		parts = append(parts, fmt.Sprintf("the dump hook patches %s itself: check what the edit does there", strings.Join(seamFiles, ", ")))
	}
	return warnCheck(name, "undo the hand patches unless you know why they are there ("+undo+"): a hand patch of deepseek_v2.py next to our hook means two writers into staging",
		"%s (%s)", strings.Join(parts, "; "), f.Location)
}

func joinGPUIndices(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
