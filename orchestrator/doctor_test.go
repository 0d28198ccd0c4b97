package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/doctor"
	"github.com/extract-dev/extract/internal/testsupport"
	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/sglang/sglangtest"
)

const testHidden = 64 // 528 bytes a token in the output: 3 aux layers + final in bf16, the id and the loss mask

// tokenLines is a dataset of n samples of the given number of tokens each.
func tokenLines(n, tokens int) string {
	ids := strings.TrimSuffix(strings.Repeat("7,", tokens), ",")
	return strings.Repeat(`{"input_ids":[`+ids+`]}`+"\n", n)
}

// doctorConfig is a job that passes every check on a healthy node: a dataset, an
// output dir, a staging dir on /dev/shm, a free port and, for kind sglang, the 8 GPUs
// of an H200 node, a model folder and a Python that has SGLang.
func doctorConfig(t *testing.T, kind, dataset string) *configs.Config {
	t.Helper()
	dir := t.TempDir()
	cfg := configs.Default()
	cfg.Dataset = writeDataset(t, dataset)
	cfg.OutputDir = filepath.Join(dir, "out")
	cfg.StateDir = filepath.Join(cfg.OutputDir, ".extract")
	shmDir, err := os.MkdirTemp("/dev/shm", "doctor-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shmDir) })
	cfg.ShmDir = shmDir
	cfg.ShmBudget = 1 << 20
	cfg.Disk.Reserve = 1 << 20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Server.Port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg.Server.Kind = kind
	cfg.Server.HiddenSize, cfg.Server.Simulator.HiddenSize = testHidden, testHidden
	if kind == sglang.KindSGLang {
		cfg.Server.GPUs, cfg.Server.TPSize = []int{0, 1, 2, 3, 4, 5, 6, 7}, 8
		cfg.Server.ModelPath = filepath.Join(dir, "model")
		mustWriteFile(t, filepath.Join(cfg.Server.ModelPath, "config.json"), fmt.Sprintf(`{"architectures":["DeepseekV3ForCausalLM"],"hidden_size":%d,"num_hidden_layers":61}`, testHidden))
		mustWriteFile(t, filepath.Join(cfg.Server.ModelPath, "model-00001-of-00001.safetensors"), "weights")
		// A stand-in interpreter that answers the install probe as one with a pristine
		// SGLang 0.5.8 wheel whose seams the hook all supports.
		cfg.Server.Python = filepath.Join(dir, "python3")
		mustWriteFile(t, cfg.Server.Python, "#!/bin/sh\n"+probeAnswer(t)+"\n")
		if err := os.Chmod(cfg.Server.Python, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return &cfg
}

// probeAnswer is a shell command that prints what sglang.InspectInstall's probe prints
// for a real (fake) SGLang 0.5.8 wheel, installed afresh, whose seams are all supported:
// the audit then runs for real against that wheel's RECORD.
func probeAnswer(t *testing.T) string {
	t.Helper()
	site := sglangtest.Wheel(t, "0.5.8", sglangtest.Files("0.5.8"))
	seams := map[string]string{}
	for _, m := range []string{"server_args", "layers.logits_processor", "model_executor.forward_batch_info", "model_executor.model_runner", "managers.schedule_batch"} {
		seams["sglang.srt."+m] = "ok: " + m
	}
	b, err := json.Marshal(map[string]any{
		"location": filepath.Join(site, "sglang"), "version": "0.5.8", "site": site,
		"dist_info": filepath.Join(site, "sglang-0.5.8.dist-info"), "dist_matches": true, "record": true, "seams": seams,
	})
	if err != nil {
		t.Fatal(err)
	}
	return "echo 'extract-install-probe: " + string(b) + "'"
}

func mustWriteFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// h200Node is go-nvml's mock of an 8×H200 node where holders[i] hold GPU i. The mock
// leaves the process and utilisation queries unset (calling them panics), so every
// device gets them here.
func h200Node(holders map[int][]nvml.ProcessInfo) *server.Server {
	node := dgxh200.New()
	for i, d := range node.Devices {
		dev := d.(*server.Device)
		procs := holders[i]
		var used uint64
		for _, p := range procs {
			used += p.UsedGpuMemory
		}
		dev.MemoryInfo.Used, dev.MemoryInfo.Free = used, dev.MemoryInfo.Total-used
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS }
		dev.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 97}, nvml.SUCCESS }
	}
	return node
}

// startSleep starts a real process, so that /proc has its command line, with extra
// environment; it is killed when the test ends.
func startSleep(t *testing.T, env ...string) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	// Under load the new process may not show its command line in /proc at once.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid)); strings.HasPrefix(string(b), "sleep") {
			break
		}
	}
	return cmd.Process.Pid
}

func runDoctor(t *testing.T, cfg *configs.Config, opt doctor.Options) doctor.Report {
	t.Helper()
	rep, err := Doctor(context.Background(), cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// check returns the named check, failing the test (with the whole report) without it.
func findCheck(t *testing.T, rep doctor.Report, name string) doctor.Check {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %s", name, reportJSON(rep))
	return doctor.Check{}
}

func reportJSON(rep doctor.Report) string {
	b, _ := json.MarshalIndent(rep, "", "  ")
	return string(b)
}

func wantCheck(t *testing.T, rep doctor.Report, name, status string, reasonHas ...string) doctor.Check {
	t.Helper()
	c := findCheck(t, rep, name)
	if c.Status != status {
		t.Errorf("check %s is %s, want %s: %s (fix: %s)", name, c.Status, status, c.Reason, c.Fix)
	}
	for _, s := range reasonHas {
		if !strings.Contains(c.Reason, s) {
			t.Errorf("check %s reason %q lacks %q", name, c.Reason, s)
		}
	}
	return c
}

const gpuGiB = 1 << 30

func TestDoctorFailsNamingTheForeignProcessOnGPU3AndHowToStopIt(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSGLang, tokenLines(4, 10))
	pid := startSleep(t)
	node := h200Node(map[int][]nvml.ProcessInfo{3: {{Pid: uint32(pid), UsedGpuMemory: 75 * gpuGiB}}})

	rep := runDoctor(t, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(node)})

	if rep.OK {
		t.Fatalf("report OK with a foreign process on GPU 3:\n%s", reportJSON(rep))
	}
	if failed := rep.Failed(); len(failed) != 1 || failed[0].Name != "gpu 3" {
		t.Fatalf("failed checks = %+v; want only gpu 3\n%s", failed, reportJSON(rep))
	}
	c := wantCheck(t, rep, "gpu 3", doctor.CheckFail, fmt.Sprintf("pid %d (sleep 60)", pid), "75.0 GiB", "not our server", "NVIDIA H200")
	if !strings.Contains(c.Fix, fmt.Sprintf("kill %d", pid)) {
		t.Errorf("fix %q does not say how to stop pid %d", c.Fix, pid)
	}
	wantCheck(t, rep, "gpu", doctor.CheckOK, "8 GPU(s)", "driver 550.54.15")
	for _, i := range []int{0, 1, 2, 4, 5, 6, 7} {
		wantCheck(t, rep, fmt.Sprintf("gpu %d", i), doctor.CheckOK, "no processes")
	}
	if err := rep.Err(); !errors.Is(err, ErrPreflight) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", pid)) {
		t.Errorf("Err() = %v; want ErrPreflight naming pid %d", err, pid)
	}
}

func TestDoctorAcceptsOurOwnServerOnTheGPUs(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSGLang, tokenLines(4, 10))
	const serverID = "feedfacecafebeef"
	pid := startSleep(t, "EXTRACT_SERVER_ID="+serverID)
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(map[string]any{"pid": pid, "pgid": pid, "boot_id": strings.TrimSpace(string(boot)), "server_id": serverID, "port": cfg.Server.Port, "argv": []string{"sleep", "60"}})
	mustWriteFile(t, filepath.Join(cfg.StateDir, "server.json"), string(rec))
	holders := map[int][]nvml.ProcessInfo{}
	for i := range 8 {
		holders[i] = []nvml.ProcessInfo{{Pid: uint32(pid), UsedGpuMemory: 120 * gpuGiB}}
	}

	rep := runDoctor(t, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(h200Node(holders))})

	if !rep.OK {
		t.Fatalf("our own server on the GPUs fails the report:\n%s", reportJSON(rep))
	}
	wantCheck(t, rep, "gpu 3", doctor.CheckOK, fmt.Sprintf("held by our server (pid %d)", pid), "120.0 GiB")
}

func TestDoctorWithoutNVMLFailsOnlyWhenTheJobNeedsGPUs(t *testing.T) {
	if rep := sglang.NewGPUInspector(nil).Inspect(nil); rep.Available {
		t.Skipf("this machine has an NVIDIA driver (%s)", rep.Driver)
	}
	for _, tc := range []struct {
		kind, status, reason string
	}{
		{sglang.KindSGLang, doctor.CheckFail, "NVML unavailable: "},
		{sglang.KindSimulator, doctor.CheckOK, "none needed"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			rep := runDoctor(t, doctorConfig(t, tc.kind, tokenLines(4, 10)), doctor.Options{})
			c := wantCheck(t, rep, "gpu", tc.status, tc.reason)
			if rep.OK != (tc.status != doctor.CheckFail) {
				t.Errorf("report OK = %v with gpu %s:\n%s", rep.OK, c.Status, reportJSON(rep))
			}
		})
	}
}

// smallDisk mounts a tmpfs of size for the test (root only).
func mountSmallDisk(t *testing.T, size string) string {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "disk")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	testsupport.Require(t, testsupport.Root)
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size="+size); err != nil {
		testsupport.Unavailable(t, testsupport.Root, "mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	return mnt
}

// indexJob creates the job's index for cfg's dataset with the given samples done, each
// with an output file of 100 bytes.
func indexJob(t *testing.T, cfg *configs.Config, done []int) {
	t.Helper()
	ds, err := dataset.Open(cfg.Dataset)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ix, err := checkpoint.Open(filepath.Join(cfg.StateDir, "index.db"), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	err = ix.Init(checkpoint.Meta{DatasetFingerprint: ds.Fingerprint, DatasetPath: ds.Path, ConfigFingerprint: cfg.Fingerprint(), Total: ds.Len(), Created: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range done {
		mustWriteFile(t, checkpoint.OutputPath(cfg.OutputDir, s), strings.Repeat("x", 100))
		if err := ix.CommitDone(checkpoint.Record{Sample: s, Attempt: 1, RID: fmt.Sprintf("s%09d-a1", s), Bytes: 100, Tokens: ds.Tokens(s)}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDoctorWeighsTheRemainingSamplesAgainstFreeSpace(t *testing.T) {
	const perToken = 4*testHidden*2 + 16
	big := tokenLines(40, 500) // 20,000 tokens: 10.4 MB, more than the 8 MiB disk
	for _, tc := range []struct {
		name      string
		dataset   string
		done      []int
		reserve   configs.ByteSize
		whenShort string
		status    string
		reason    string
	}{
		{name: "the rest of the job fits", dataset: tokenLines(10, 100), status: doctor.CheckOK, reason: "(1000 tokens × 528 bytes) need 515.6 KiB"},
		{name: "the rest of the job does not fit", dataset: big, whenShort: "refuse", status: doctor.CheckFail, reason: "the 40 remaining samples (20000 tokens × 528 bytes) need 10.1 MiB"},
		{name: "disk.when_short warn: admission pauses at the reserve", dataset: big, whenShort: "warn", status: doctor.CheckWarn, reason: "the run pauses at the reserve"},
		{name: "done samples need no room", dataset: big, done: samplesRange(0, 30), status: doctor.CheckOK, reason: "the 10 remaining samples"},
		{name: "text samples are counted as an upper bound", dataset: strings.Repeat(`{"text":"`+strings.Repeat("a", 500)+`"}`+"\n", 40), status: doctor.CheckWarn, reason: "upper bound: 40 text samples"},
		{name: "no room for even the next sample", dataset: tokenLines(10, 100), reserve: 8 << 20, whenShort: "warn", status: doctor.CheckFail, reason: "not even the next sample"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := doctorConfig(t, sglang.KindSimulator, tc.dataset)
			cfg.OutputDir = filepath.Join(mountSmallDisk(t, "8m"), "out")
			cfg.StateDir = filepath.Join(t.TempDir(), "state")
			if tc.reserve > 0 {
				cfg.Disk.Reserve = tc.reserve
			}
			indexJob(t, cfg, tc.done)
			if cfg.OutputBytesPerToken() != perToken {
				t.Fatalf("OutputBytesPerToken = %d, want %d", cfg.OutputBytesPerToken(), perToken)
			}

			if tc.whenShort != "" {
				cfg.Disk.WhenShort = tc.whenShort
			}
			rep := runDoctor(t, cfg, doctor.Options{})

			c := wantCheck(t, rep, "disk", tc.status, tc.reason)
			if c.Status != doctor.CheckOK && !strings.Contains(c.Fix, "free ") {
				t.Errorf("fix %q does not say how much to free", c.Fix)
			}
			if rep.OK != (tc.status != doctor.CheckFail) {
				t.Errorf("report OK = %v with disk %s:\n%s", rep.OK, c.Status, reportJSON(rep))
			}
		})
	}
}

func samplesRange(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

func TestDoctorFlagsOutputThatARebootWouldWipe(t *testing.T) {
	durable, err := os.MkdirTemp("/var/tmp", "doctor-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(durable) })
	notAFolder := filepath.Join(t.TempDir(), "file")
	mustWriteFile(t, notAFolder, "")
	for _, tc := range []struct {
		name, dir, status, reason string
	}{
		{"under /tmp", filepath.Join(t.TempDir(), "out"), doctor.CheckWarn, "is under /tmp: lost on reboot"},
		{"on tmpfs", filepath.Join(doctorConfig(t, sglang.KindSimulator, tokenLines(1, 1)).ShmDir, "out"), doctor.CheckWarn, "is on tmpfs: lost on reboot"},
		{"on a durable disk", filepath.Join(durable, "out"), doctor.CheckOK, "does not exist yet; the run creates it in " + durable},
		{"below a file", filepath.Join(notAFolder, "out"), doctor.CheckFail, "is not a folder"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if fs, err := os.Stat(durable); tc.name == "on a durable disk" && (err != nil || !fs.IsDir() || doctor.Volatile(durable) != "") {
				t.Skip("/var/tmp is not on a durable disk here")
			}
			cfg := doctorConfig(t, sglang.KindSimulator, tokenLines(1, 1))
			cfg.OutputDir = tc.dir
			rep := runDoctor(t, cfg, doctor.Options{})
			c := wantCheck(t, rep, "output", tc.status, tc.reason)
			if c.Status == doctor.CheckWarn && !strings.Contains(c.Fix, "output_dir") {
				t.Errorf("fix %q does not name output_dir", c.Fix)
			}
		})
	}
}

func TestDoctorCountsStagingLeftoversToAdoptAndToDiscard(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSimulator, tokenLines(4, 10))
	indexJob(t, cfg, []int{0})
	ix, err := checkpoint.Open(filepath.Join(cfg.StateDir, "index.db"), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Samples 1 and 2 were in flight (attempt 1) when the last run died.
	if _, err := beginAttempts(ix, []int{1, 2}); err != nil {
		t.Fatal(err)
	}
	ix.Close()
	for name, size := range map[string]int{
		"s000000001-a1.safetensors":         300, // current attempt of a pending sample: adopted
		"s000000000-a1.safetensors":         200, // sample 0 is done: removed
		"s000000002-a1.safetensors.partial": 50,  // half written: discarded
		"notes.txt":                         1,
		".hook-4242.json":                   10, // a hook marker: not a leftover
	} {
		mustWriteFile(t, filepath.Join(cfg.ShmDir, name), strings.Repeat("x", size))
	}

	rep := runDoctor(t, cfg, doctor.Options{})

	wantCheck(t, rep, "staging", doctor.CheckOK, "2 complete dump(s), 500 B: 1 to adopt, 1 stale (removed by the run)",
		"1 partial dump(s), 50 B, discarded", "1 other file(s), ignored")
}

func TestDoctorIndexStatCheckFindsMissingAndTruncatedOutputs(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSimulator, tokenLines(10, 10))
	indexJob(t, cfg, samplesRange(0, 10))

	rep := runDoctor(t, cfg, doctor.Options{})
	wantCheck(t, rep, "index", doctor.CheckOK, "10 of 10 samples done", "10 of 10 done files checked by stat: all present")

	if err := os.Remove(checkpoint.OutputPath(cfg.OutputDir, 4)); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(checkpoint.OutputPath(cfg.OutputDir, 7), 10); err != nil {
		t.Fatal(err)
	}
	rep = runDoctor(t, cfg, doctor.Options{})
	c := wantCheck(t, rep, "index", doctor.CheckFail, "2 of 10 sampled done files", "sample 4: "+checkpoint.OutputPath(cfg.OutputDir, 4)+" missing", "sample 7:", "is 10 bytes, the index recorded 100")
	if !strings.Contains(c.Fix, "extract verify --repair") {
		t.Errorf("fix %q does not point at verify --repair", c.Fix)
	}
}

func TestDoctorNeverOpensTheIndexWhileARunHoldsTheLock(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSimulator, tokenLines(4, 10))
	indexJob(t, cfg, nil)
	lock, err := AcquireLock(cfg.StateDir, "run")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	// Held read-write as a run holds it: a read-only open would wait for it.
	ix, err := checkpoint.Open(filepath.Join(cfg.StateDir, "index.db"), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()

	start := time.Now()
	rep := runDoctor(t, cfg, doctor.Options{})

	wantCheck(t, rep, "index", doctor.CheckWarn, fmt.Sprintf("a run is in progress (pid %d)", os.Getpid()))
	if !rep.OK || rep.RunningPID != os.Getpid() {
		t.Errorf("report OK %v, running pid %d; want OK naming pid %d:\n%s", rep.OK, rep.RunningPID, os.Getpid(), reportJSON(rep))
	}
	if took := time.Since(start); took > 500*time.Millisecond { // half of doctor's index timeout (a second)
		t.Errorf("doctor took %v: it waited for the index", took)
	}
}

func TestDoctorRefusesAResumeTheIndexWouldRefuse(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSimulator, tokenLines(4, 10))
	indexJob(t, cfg, []int{0})
	cfg.Dataset = writeDataset(t, tokenLines(5, 10))

	rep := runDoctor(t, cfg, doctor.Options{})

	c := wantCheck(t, rep, "index", doctor.CheckFail, "was started on another dataset", "`extract run --resume` would refuse")
	if !strings.Contains(c.Fix, "--fresh") {
		t.Errorf("fix %q does not offer --fresh", c.Fix)
	}
}

func TestDoctorOnACompleteJobNeedsNoFreeGPU(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSGLang, tokenLines(4, 10))
	indexJob(t, cfg, samplesRange(0, 4))
	pid := startSleep(t)
	node := h200Node(map[int][]nvml.ProcessInfo{3: {{Pid: uint32(pid), UsedGpuMemory: 75 * gpuGiB}}})

	rep := runDoctor(t, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(node)})

	if !rep.OK {
		t.Fatalf("a complete job fails the report:\n%s", reportJSON(rep))
	}
	wantCheck(t, rep, "gpu 3", doctor.CheckWarn, fmt.Sprintf("pid %d", pid), "no server is needed: the job is complete")
}

func TestDoctorChecksTheModelShapeAgainstTheConfig(t *testing.T) {
	for _, tc := range []struct {
		name, config, status, reason string
	}{
		{"flat config.json", `{"hidden_size":64,"num_hidden_layers":61}`, doctor.CheckOK, "hidden 64, 61 layers, 1 weight file(s)"},
		{"multimodal text_config", `{"architectures":["KimiK25ForConditionalGeneration"],"text_config":{"hidden_size":64,"num_hidden_layers":61}}`, doctor.CheckOK, "KimiK25ForConditionalGeneration"},
		{"Kimi-K2.5 text_config of another width", `{"architectures":["KimiK25ForConditionalGeneration"],"text_config":{"hidden_size":7168,"num_hidden_layers":61}}`, doctor.CheckFail, "config.json (text_config) says hidden_size 7168 (server.hidden_size is 64)"},
		{"another width", `{"hidden_size":4096,"num_hidden_layers":32}`, doctor.CheckFail, "hidden_size 4096 (server.hidden_size is 64), num_hidden_layers 32 (server.num_layers is 61)"},
		{"not JSON", `{`, doctor.CheckFail, "is not valid JSON"},
		{"no config.json", "", doctor.CheckFail, "config.json: no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := doctorConfig(t, sglang.KindSGLang, tokenLines(1, 1))
			path := filepath.Join(cfg.Server.ModelPath, "config.json")
			if tc.config == "" {
				os.Remove(path)
			} else {
				mustWriteFile(t, path, tc.config)
			}
			rep := runDoctor(t, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(h200Node(nil))})
			wantCheck(t, rep, "model", tc.status, tc.reason)
		})
	}
}

func TestDoctorNamesAStrangerOnTheServerPort(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSimulator, tokenLines(1, 1))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg.Server.Port = ln.Addr().(*net.TCPAddr).Port

	rep := runDoctor(t, cfg, doctor.Options{})

	wantCheck(t, rep, "port", doctor.CheckFail, fmt.Sprintf("is taken by pid %d", os.Getpid()), "which extract did not start")
}

func TestDoctorClosesTheIndexBeforeItsSlowChecksSoARunCanStart(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSGLang, tokenLines(4, 10))
	indexJob(t, cfg, []int{0, 1})
	// A Python that answers only when the test lets it: doctor is inside its slow part
	// from "started" until "go".
	dir := t.TempDir()
	started, goOn := filepath.Join(dir, "started"), filepath.Join(dir, "go")
	mustWriteFile(t, cfg.Server.Python, fmt.Sprintf("#!/bin/sh\ntouch %s\nwhile [ ! -e %s ]; do sleep 0.02; done\n%s\n", started, goOn, probeAnswer(t)))
	t.Cleanup(func() { os.WriteFile(goOn, nil, 0o644) })
	type result struct {
		rep doctor.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := Doctor(context.Background(), cfg, doctor.Options{GPUs: sglang.NewGPUInspector(h200Node(nil))})
		done <- result{rep, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("doctor never probed the Python")
		}
	}

	// What a run does first: open the index read-write, which needs the exclusive flock.
	ix, err := checkpoint.Open(filepath.Join(cfg.StateDir, "index.db"), checkpoint.OpenOptions{Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatalf("a run could not open the index while doctor probed Python: %v", err)
	}
	ix.Close()
	mustWriteFile(t, goOn, "")
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	wantCheck(t, r.rep, "index", doctor.CheckOK, "2 of 4 samples done", "2 of 2 done files checked by stat")
	wantCheck(t, r.rep, "sglang", doctor.CheckOK, "sglang 0.5.8")
}

func TestDoctorWarnsWhenTheConfigFileOrTheBinaryWouldNotSurviveAReboot(t *testing.T) {
	shmDir, err := os.MkdirTemp("/dev/shm", "doctor-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shmDir) })
	durable, err := os.MkdirTemp("/var/tmp", "doctor-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(durable) })
	for _, tc := range []struct {
		name, config, exe string
		want              map[string]string // check name → status
		reason            string
	}{
		{"the script kept in /tmp", filepath.Join(t.TempDir(), "job.yaml"), "", map[string]string{"config file": doctor.CheckWarn}, "is under /tmp: lost on reboot"},
		{"the binary on tmpfs", "", filepath.Join(shmDir, "extract"), map[string]string{"executable": doctor.CheckWarn}, "is on tmpfs: lost on reboot"},
		{"both on a durable disk", filepath.Join(durable, "job.yaml"), filepath.Join(durable, "extract"), map[string]string{"config file": doctor.CheckOK, "executable": doctor.CheckOK}, "is on a durable disk"},
		// The quick start: go run's binary is rebuilt by every go run, so no warning.
		{"a go run build", "", "/tmp/go-build1230200047/b001/exe/extract", map[string]string{"executable": doctor.CheckOK}, "is a `go run` build"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.config != "" && strings.HasPrefix(tc.config, durable) && doctor.Volatile(durable) != "" {
				t.Skip("/var/tmp is not on a durable disk here")
			}
			cfg := doctorConfig(t, sglang.KindSimulator, tokenLines(1, 1))
			rep := runDoctor(t, cfg, doctor.Options{ConfigFile: tc.config, Executable: tc.exe})
			for name, status := range tc.want {
				c := wantCheck(t, rep, name, status, tc.reason)
				if status == doctor.CheckWarn && c.Fix == "" {
					t.Errorf("check %s warns without a fix", name)
				}
			}
			for _, c := range rep.Checks {
				if _, want := tc.want[c.Name]; !want && (c.Name == "config file" || c.Name == "executable") {
					t.Errorf("check %s made without its path: %+v", c.Name, c)
				}
			}
			if !rep.OK {
				t.Errorf("a volatile config or binary fails the report; it should only warn:\n%s", reportJSON(rep))
			}
		})
	}
}

func TestAnUncreatableOutputDirIsAPreflightRefusalForRunAndDoctorAlike(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	mustWriteFile(t, file, "")
	for _, tc := range []struct{ key, check string }{{"output_dir", "output"}, {"state_dir", "state"}} {
		t.Run(tc.key, func(t *testing.T) {
			cfg := doctorConfig(t, sglang.KindSimulator, tokenLines(1, 1))
			if tc.key == "output_dir" {
				cfg.OutputDir = filepath.Join(file, "out")
			} else {
				cfg.StateDir = filepath.Join(file, "state")
			}

			err := doctor.MakeJobDirs(cfg)
			rep := runDoctor(t, cfg, doctor.Options{})

			if !errors.Is(err, ErrPreflight) || !strings.Contains(err.Error(), tc.key) || !errors.Is(err, syscall.ENOTDIR) {
				t.Errorf("makeJobDirs = %v; want ErrPreflight naming %s and wrapping ENOTDIR", err, tc.key)
			}
			wantCheck(t, rep, tc.check, doctor.CheckFail, "is not a folder")
			if !errors.Is(rep.Err(), ErrPreflight) {
				t.Errorf("doctor's Err() = %v; want ErrPreflight", rep.Err())
			}
		})
	}
}

func TestDoctorReportsATruncatedIndexAsAFailedCheckNamingTheFileAndTheRepair(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSimulator, tokenLines(50, 10))
	indexJob(t, cfg, samplesRange(0, 30))
	path := filepath.Join(cfg.StateDir, "index.db")
	// As in issue 8 (item 6): `truncate -s 10000 index.db` made every command die of SIGBUS.
	if err := os.Truncate(path, 10000); err != nil {
		t.Fatal(err)
	}

	rep, err := Doctor(context.Background(), cfg, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := wantCheck(t, rep, "index", doctor.CheckFail, path, "damaged", "truncated")
	for _, want := range []string{"extract verify --repair", "index.db.broken-", "rebuilds the index from the output files"} {
		if !strings.Contains(c.Fix, want) {
			t.Errorf("fix %q does not say %q", c.Fix, want)
		}
	}
	if rep.OK {
		t.Errorf("report OK with a damaged index:\n%s", reportJSON(rep))
	}
	if st, err := os.Stat(path); err != nil || st.Size() != 10000 {
		t.Errorf("doctor changed the damaged index: %v, %v", st, err)
	}
}

func TestDoctorReportsTheSGLangVersionItsUnsupportedSeamsAndEveryHandPatchedFile(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skipf("no python3: %v", err)
	}
	cfg := doctorConfig(t, sglang.KindSGLang, tokenLines(4, 10))
	// A real Python importing a fake SGLang wheel: the probe and the audit run for real.
	site := sglangtest.Wheel(t, "0.0.7", sglangtest.Files("0.0.7"))
	cfg.Server.Python = py
	cfg.Server.Env = map[string]string{"PYTHONPATH": site}
	node := sglang.NewGPUInspector(h200Node(nil))

	rep := runDoctor(t, cfg, doctor.Options{GPUs: node})
	wantCheck(t, rep, "sglang", doctor.CheckOK, "sglang 0.0.7 in "+py, filepath.Join(site, "sglang"))
	wantCheck(t, rep, "sglang install", doctor.CheckOK, "no file under sglang/srt differs from the wheel's RECORD")
	// The fake has only ScheduleBatch of the five seams.
	wantCheck(t, rep, "seams", doctor.CheckFail, "cannot patch 4 of the 5 seams of sglang 0.0.7",
		"sglang.srt.server_args: cannot be imported", "the server would exit at start")

	// The incident: the old dump patch still applied, in the model file and in a seam.
	for _, f := range []string{"sglang/srt/models/deepseek_v2.py", "sglang/srt/layers/logits_processor.py"} {
		fh, err := os.OpenFile(filepath.Join(site, f), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		fh.WriteString("# HS dump patch\n")
		fh.Close()
	}
	rep = runDoctor(t, cfg, doctor.Options{GPUs: node})
	c := wantCheck(t, rep, "sglang install", doctor.CheckWarn,
		"2 file(s) under sglang/srt differ from the wheel's RECORD: sglang/srt/layers/logits_processor.py, sglang/srt/models/deepseek_v2.py",
		"the dump hook patches sglang/srt/layers/logits_processor.py itself")
	if !strings.Contains(c.Fix, "two writers into staging") || !strings.Contains(c.Fix, "pip install --force-reinstall --no-deps sglang==0.0.7") {
		t.Errorf("fix %q", c.Fix)
	}
	if rep.SGLang == nil || len(rep.SGLang.Modified) != 2 || len(rep.SGLang.Unsupported) != 4 {
		t.Fatalf("report's sglang facts %+v", rep.SGLang)
	}
	var back struct {
		SGLang struct {
			Version  string   `json:"version"`
			Modified []string `json:"modified"`
			Seams    []struct {
				Name string `json:"name"`
				OK   bool   `json:"ok"`
			} `json:"seams"`
		} `json:"sglang"`
	}
	if err := json.Unmarshal([]byte(reportJSON(rep)), &back); err != nil || back.SGLang.Version != "0.0.7" || len(back.SGLang.Modified) != 2 || len(back.SGLang.Seams) != 5 {
		t.Errorf("JSON report's sglang: %+v (%v)", back.SGLang, err)
	}
}

func TestDoctorWithTheSimulatorNeverProbesSGLang(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSimulator, tokenLines(4, 10))
	touched := filepath.Join(t.TempDir(), "probed")
	cfg.Server.Python = filepath.Join(t.TempDir(), "python3")
	mustWriteFile(t, cfg.Server.Python, "#!/bin/sh\ntouch "+touched+"\n")
	if err := os.Chmod(cfg.Server.Python, 0o755); err != nil {
		t.Fatal(err)
	}

	rep := runDoctor(t, cfg, doctor.Options{})
	for _, c := range rep.Checks {
		if c.Name == "sglang" || c.Name == "seams" || c.Name == "sglang install" {
			t.Errorf("kind simulator reports %+v", c)
		}
	}
	if _, err := os.Stat(touched); err == nil || rep.SGLang != nil {
		t.Errorf("kind simulator ran server.python (facts %+v)", rep.SGLang)
	}
}
