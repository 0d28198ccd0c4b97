package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/sglang/simulator"
	"github.com/extract-dev/extract/shm"
)

var kills = flag.Int("kills", 20, "SIGKILLs of the orchestrator in the kill test")

// binary is the extract binary under test, built once by TestMain.
var extractBin string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "extract-e2e-bin-")
	if err != nil {
		panic(err)
	}
	extractBin = filepath.Join(dir, "extract")
	args := []string{"build", "-o", extractBin}
	if raceBuild {
		// The subprocesses are where the concurrency is: race-check them too.
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build extract:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// job is one extraction job laid out in temp dirs, configured the way an operator's
// cron job would be: a YAML file plus EXTRACT_* overrides.
type job struct {
	t       *testing.T
	dir     string
	config  string
	dataset string
	out     string
	state   string
	shmDir  string
	env     []string
	samples []sample
	hidden  int
	// format is output.format+compress as checkpoint names it ("" is safetensors); set it
	// with setFormat so that the env agrees.
	format string
}

// layout is where the job's files are, in its format.
func (j *job) layout() checkpoint.Layout {
	l, err := checkpoint.ParseLayout(j.out, j.format)
	if err != nil {
		j.t.Fatal(err)
	}
	return l
}

type sample struct {
	ids  []int64
	mask []int64
}

// newJob writes a dataset of n samples and a config for the simulator.
func newJob(t *testing.T, n int, tokensPerSecond int) *job {
	t.Helper()
	dir := t.TempDir()
	shmDir := filepath.Join(t.TempDir(), "shm")
	if fs, err := shm.StatFS("/dev/shm"); err == nil && fs.Tmpfs {
		d, err := os.MkdirTemp("/dev/shm", "extract-e2e-")
		if err != nil {
			t.Fatal(err)
		}
		shmDir = d
	}
	j := &job{t: t, dir: dir, config: filepath.Join(dir, "job.yaml"), dataset: filepath.Join(dir, "data.jsonl"),
		out: filepath.Join(dir, "out"), shmDir: shmDir, hidden: 32}
	j.state = filepath.Join(j.out, ".extract")
	r := rand.New(rand.NewSource(int64(n)))
	var buf bytes.Buffer
	for i := 0; i < n; i++ {
		k := 8 + r.Intn(300)
		s := sample{ids: make([]int64, k), mask: make([]int64, k)}
		for p := range s.ids {
			s.ids[p] = int64(r.Intn(163840))
			if p >= k/3 {
				s.mask[p] = 1
			}
		}
		j.samples = append(j.samples, s)
		line, _ := json.Marshal(map[string]any{"input_ids": s.ids, "loss_mask": s.mask})
		buf.Write(line)
		buf.WriteByte('\n')
	}
	if err := os.WriteFile(j.dataset, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := `dataset: data.jsonl
output_dir: out
server:
  kind: simulator
  layers: [2, 30, 58]
run:
  max_inflight: 8
  movers: 2
  dump_timeout: 20s
disk:
  reserve: 1MiB
`
	if err := os.WriteFile(j.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	j.env = append(os.Environ(),
		"EXTRACT_SHM_DIR="+shmDir,
		"EXTRACT_SERVER_PORT="+strconv.Itoa(freePort(t)),
		"EXTRACT_SERVER_SIMULATOR_HIDDEN_SIZE="+strconv.Itoa(j.hidden),
		"EXTRACT_SERVER_SIMULATOR_TOKENS_PER_SECOND="+strconv.Itoa(tokensPerSecond),
		"EXTRACT_STATUS_LISTEN=127.0.0.1:0",
		"EXTRACT_SERVER_SIMULATOR_REQUEST_LOG="+j.requestLog(),
	)
	t.Cleanup(func() {
		stopRecordedServer(j.state)
		os.RemoveAll(shmDir)
	})
	return j
}

// freePort picks a free port below the kernel's ephemeral range (32768 and up), so that
// no outgoing connection of another test can take it between this check and the launch.
func freePort(t *testing.T) int {
	t.Helper()
	for range 1000 {
		port := 20000 + rand.Intn(12000)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			ln.Close()
			return port
		}
	}
	t.Fatal("no free port in 20000..31999")
	return 0
}

// stopRecordedServer kills the server a test left behind, by its recorded process group.
func stopRecordedServer(stateDir string) {
	stopRecordedServerFile(filepath.Join(stateDir, "server.json"))
}

// command prepares `extract args...` with the job's config and env.
func (j *job) command(args ...string) *exec.Cmd {
	cmd := exec.Command(extractBin, append(args, "--config", j.config)...)
	cmd.Env = j.env
	return cmd
}

type result struct {
	code           int
	stdout, stderr string
}

func (j *job) run(args ...string) result {
	j.t.Helper()
	cmd := j.command(args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		j.t.Fatal(err)
	}
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// check verifies the whole output against the dataset and the simulator's function:
// every sample present once, complete, with the predicted content and a correct crc32c,
// and nothing else left in the output or staging dirs.
func (j *job) check() (lost, corrupt, extra int) {
	j.t.Helper()
	want := map[string]int{}
	for i := range j.samples {
		want[j.layout().Path(i)] = i
	}
	filepath.WalkDir(j.out, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			if d != nil && d.IsDir() && path == j.state {
				return filepath.SkipDir
			}
			return err
		}
		if _, ok := want[path]; !ok {
			j.t.Errorf("unexpected file in output: %s", path)
			extra++
		}
		return nil
	})
	for i, s := range j.samples {
		path := j.layout().Path(i)
		if _, err := os.Stat(path); err != nil {
			j.t.Errorf("sample %d: %v", i, err)
			lost++
			continue
		}
		if err := j.checkFile(path, i, s); err != nil {
			j.t.Errorf("sample %d: %v", i, err)
			corrupt++
		}
	}
	entries, _ := os.ReadDir(j.shmDir)
	for _, e := range entries {
		if e.IsDir() && replicaDirName(e.Name()) {
			// A replica's staging dir (server.replicas > 1) stays, and must be empty.
			sub, _ := os.ReadDir(filepath.Join(j.shmDir, e.Name()))
			for _, f := range sub {
				j.t.Errorf("staging dir not empty: %s/%s", e.Name(), f.Name())
			}
			continue
		}
		j.t.Errorf("staging dir not empty: %s", e.Name())
	}
	return lost, corrupt, extra
}

// replicaDirName says whether name is a replica's staging dir: r<k>.
func replicaDirName(name string) bool {
	k, err := strconv.Atoi(strings.TrimPrefix(name, "r"))
	return strings.HasPrefix(name, "r") && err == nil && "r"+strconv.Itoa(k) == name
}

func (j *job) checkFile(path string, idx int, s sample) error {
	info, err := checkpoint.ReadOutput(path, true)
	if err != nil {
		return err
	}
	if info.Sample != idx || info.Tokens != len(s.ids) {
		return fmt.Errorf("metadata says sample %d with %d tokens", info.Sample, info.Tokens)
	}
	tensors, err := checkpoint.ReadTensors(path)
	if err != nil {
		return err
	}
	read := func(name string) []byte { return tensors[name] }
	ints := func(b []byte) []int64 {
		v := make([]int64, len(b)/8)
		for i := range v {
			v[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
		return v
	}
	if got := ints(read("input_ids")); fmt.Sprint(got) != fmt.Sprint(s.ids) {
		return errors.New("input_ids differ from the dataset")
	}
	if got := ints(read("loss_mask")); fmt.Sprint(got) != fmt.Sprint(s.mask) {
		return errors.New("loss_mask differs from the dataset")
	}
	H := j.hidden
	hidden, aux := read("hidden_state"), read("aux_hidden_state")
	row := make([]byte, 2*H)
	for p, tok := range s.ids {
		simulator.FillRow(row, tok, p, 61, H)
		if !bytes.Equal(hidden[p*2*H:(p+1)*2*H], row) {
			return fmt.Errorf("hidden_state row %d differs from the simulator's", p)
		}
		for k, layer := range []int{2, 30, 58} {
			simulator.FillRow(row, tok, p, layer, H)
			off := p*6*H + k*2*H
			if !bytes.Equal(aux[off:off+2*H], row) {
				return fmt.Errorf("aux_hidden_state row %d layer %d differs from the simulator's", p, layer)
			}
		}
	}
	return nil
}

// requestLog is where the simulator appends the rid of every request it receives.
func (j *job) requestLog() string { return filepath.Join(j.dir, "requests.log") }

// requests lists the rids the simulator received, across every server of the job.
func (j *job) requests() []string {
	var rids []string
	for _, l := range j.requestLines() {
		rids = append(rids, l[0])
	}
	return rids
}

// requestLines are the request log's lines split into fields: rid, then the port of the
// server (replica) that received it.
func (j *job) requestLines() [][]string {
	b, err := os.ReadFile(j.requestLog())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		j.t.Fatal(err)
	}
	var lines [][]string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			lines = append(lines, f)
		}
	}
	return lines
}

func (j *job) status() map[string]any {
	j.t.Helper()
	r := j.run("status", "--json")
	// A run that is starting (reading its dataset) holds no lock and has no index yet:
	// status says there is none (exit 2) until it has.
	for deadline := time.Now().Add(20 * time.Second); r.code == 2 && strings.Contains(r.stderr, "no index at") && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		r = j.run("status", "--json")
	}
	if r.code != 0 {
		j.t.Fatalf("status exit %d: %s", r.code, r.stderr)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		j.t.Fatalf("status JSON: %v\n%s", err, r.stdout)
	}
	return st
}

func serverPID(stateDir string) int {
	b, err := os.ReadFile(filepath.Join(stateDir, "server.json"))
	if err != nil {
		return 0
	}
	var rec struct {
		PID int `json:"pid"`
	}
	json.Unmarshal(b, &rec)
	return rec.PID
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func TestDemoSizedJobCompletesAndEveryOutputIsExact(t *testing.T) {
	j := newJob(t, 120, 0)
	r := j.run("run")
	if r.code != 0 {
		t.Fatalf("run exit %d\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, j.out) {
		t.Errorf("run does not say where the output is: %q", r.stdout)
	}
	if lost, corrupt, extra := j.check(); lost+corrupt+extra > 0 {
		t.Fatalf("lost %d, corrupt %d, extra %d", lost, corrupt, extra)
	}
	st := j.status()
	if st["state"] != "complete" || st["done"].(float64) != 120 || st["total"].(float64) != 120 || st["pending"].(float64) != 0 {
		t.Errorf("status after the job: %v", st)
	}
	for _, key := range []string{"failed", "bytes_written", "samples_per_second", "eta_seconds"} {
		if _, ok := st[key]; !ok {
			t.Errorf("status JSON lacks %q", key)
		}
	}
	if pid := serverPID(j.state); alive(pid) {
		t.Errorf("server pid %d still running after the job completed", pid)
	}
	for _, args := range [][]string{{"run", "--resume"}, {"run"}} {
		again := j.run(args...)
		if again.code != 0 || !strings.Contains(again.stdout, "already complete") {
			t.Errorf("extract %v on a complete job: exit %d, %q %q", args, again.code, again.stdout, again.stderr)
		}
	}
}

func TestKilledAnyNumberOfTimesFinishesExact(t *testing.T) {
	// Slow enough that the job spans all the kills: about 0.4 s of simulated GPU time
	// per kill.
	j := newJob(t, 200, max(80000 / *kills, 1))
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	killed, serverKills := 0, 0
	for killed < *kills {
		cmd := j.command("run", "--resume")
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("run exited on its own with %v\n%s", err, errb.String())
			}
			t.Logf("job finished after %d kills", killed)
			goto finished
		case <-time.After(time.Duration(30+rng.Intn(900)) * time.Millisecond):
		}
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		killed++
		// One kill in four takes the server down with the orchestrator, as an OOM kill or
		// a power cut would: its partial dumps stay behind and a new server is launched.
		if rng.Intn(4) == 0 {
			stopRecordedServer(j.state)
			serverKills++
		}
	}
	{
		r := j.run("run", "--resume")
		if r.code != 0 {
			t.Fatalf("final run exit %d\n%s", r.code, r.stderr)
		}
	}
finished:
	// Judged from outside: literal paths, a hand-parsed header, the crc32c recomputed,
	// and duplicates counted from the files on disk, not from the index.
	outside := j.checkFromOutside()
	for _, p := range outside.problems {
		t.Error(p)
	}
	lost, corrupt, duplicated, extra := outside.lost, outside.corrupt, outside.duplicated, outside.stray
	st := j.status()
	// Counted from outside the index: requests the simulator received, and leftovers the
	// runs adopted instead of sending again.
	requests := len(j.requests())
	adopted := strings.Count(mustRead(t, filepath.Join(j.state, "logs", "extract.log")), "adopting leftover dump")
	t.Logf("kill test: %d kills (%d with the server), %d samples, %d requests received (%d beyond one per sample), %d leftover dumps adopted, %d lost, %d corrupt, %d duplicated, %d stray files",
		killed, serverKills, len(j.samples), requests, requests-len(j.samples), adopted, lost, corrupt, duplicated, extra)
	if lost+corrupt+duplicated+extra > 0 || st["state"] != "complete" || int(st["done"].(float64)) != len(j.samples) {
		t.Fatalf("job not exact after %d kills: status %v", killed, st)
	}
	// A kill can cost at most what was in flight (max_inflight 8), sent once more by the
	// next run and once more by a client retry to a restarted server.
	if limit := len(j.samples) + 2*8*(killed+1); requests > limit || requests < len(j.samples) {
		t.Errorf("%d requests for %d samples over %d kills; want between %d and %d", requests, len(j.samples), killed, len(j.samples), limit)
	}
}

func TestBadDatasetLineIsRefusedBeforeAnythingIsWritten(t *testing.T) {
	tests := []struct {
		name, line, want string
	}{
		{"bad JSON", `{"input_ids": [1, 2,}`, "line 3 (sample 2): invalid JSON"},
		{"missing field", `{"ids": [1, 2]}`, "line 3 (sample 2)"},
		{"loss_mask length", `{"input_ids": [1, 2, 3], "loss_mask": [1, 1]}`, `line 3 (sample 2): "loss_mask" has 2 values, "input_ids" has 3`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := newJob(t, 5, 0)
			lines := strings.SplitAfter(mustRead(t, j.dataset), "\n")
			lines[2] = tt.line + "\n"
			os.WriteFile(j.dataset, []byte(strings.Join(lines, "")), 0o644)
			r := j.run("run")
			if r.code != 2 || !strings.Contains(r.stderr, tt.want) || !strings.Contains(r.stderr, j.dataset) {
				t.Fatalf("exit %d, stderr %q; want exit 2 naming %s and %q", r.code, r.stderr, j.dataset, tt.want)
			}
			if _, err := os.Stat(j.out); !os.IsNotExist(err) {
				t.Errorf("output dir was created: %v", err)
			}
		})
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// interrupted starts a run and stops it gracefully once some samples are done.
func (j *job) interrupted() {
	j.t.Helper()
	cmd := j.command("run")
	if err := cmd.Start(); err != nil {
		j.t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if st := j.status(); st["done"].(float64) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 75 {
		j.t.Fatalf("graceful stop: %v, want exit 75", err)
	}
}

func TestRunWithoutResumeOverProgressIsRefusedWithHowToResume(t *testing.T) {
	j := newJob(t, 100, 5000)
	j.interrupted()
	r := j.run("run")
	if r.code != 2 || !strings.Contains(r.stderr, "--resume") {
		t.Fatalf("exit %d, stderr %q; want 2 and a hint to use --resume", r.code, r.stderr)
	}
}

func TestResumeAgainstAChangedDatasetIsRefusedNamingIt(t *testing.T) {
	j := newJob(t, 100, 5000)
	j.interrupted()
	f, _ := os.OpenFile(j.dataset, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"input_ids": [5, 6, 7]}` + "\n")
	f.Close()
	r := j.run("run", "--resume")
	if r.code != 2 || !strings.Contains(r.stderr, j.dataset) || !strings.Contains(r.stderr, "--fresh") {
		t.Fatalf("exit %d, stderr %q; want 2 naming the dataset", r.code, r.stderr)
	}
}

func TestSecondRunWhileOneHoldsTheLockExitsZeroNamingThePID(t *testing.T) {
	j := newJob(t, 100, 3000)
	first := j.command("run")
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		first.Process.Signal(syscall.SIGTERM)
		first.Wait()
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if st := j.status(); st["state"] == "running" && st["source"] == "live" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("first run never reported live status")
		}
		time.Sleep(50 * time.Millisecond)
	}
	r := j.run("run", "--resume")
	if r.code != 0 || !strings.Contains(r.stdout, strconv.Itoa(first.Process.Pid)) {
		t.Fatalf("second run: exit %d, stdout %q; want 0 naming pid %d", r.code, r.stdout, first.Process.Pid)
	}
}

func TestStatusWhileRunningIsLiveAndDoesNotWaitForTheIndex(t *testing.T) {
	j := newJob(t, 100, 3000)
	cmd := j.command("run")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		start := time.Now()
		st := j.status()
		took := time.Since(start)
		if st["source"] == "live" && st["done"].(float64) > 0 {
			if took > 2*time.Second {
				t.Errorf("status took %s while running", took)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no live progress: %v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestCommandLineMistakesExitTwo(t *testing.T) {
	j := newJob(t, 3, 0)
	for _, args := range [][]string{{"run", "--resume", "--fresh"}, {"run", "--no-such-flag"}, {"run", "extra-arg"}} {
		if r := j.run(args...); r.code != 2 {
			t.Errorf("extract %v: exit %d, want 2 (%s)", args, r.code, r.stderr)
		}
	}
	bad := j.command("run")
	bad.Env = append(bad.Env, "EXTRACT_SERVER_KIND=vllm")
	var errb bytes.Buffer
	bad.Stderr = &errb
	err := bad.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(errb.String(), "server.kind") {
		t.Errorf("bad server.kind from env: %v, %q; want exit 2 naming server.kind", err, errb.String())
	}
}

func TestVerifyFindsACorruptFileAndRepairSendsItBack(t *testing.T) {
	j := newJob(t, 30, 0)
	if r := j.run("run"); r.code != 0 {
		t.Fatalf("run exit %d\n%s", r.code, r.stderr)
	}
	if r := j.run("verify", "--deep"); r.code != 0 || !strings.Contains(r.stdout, "30 ok") {
		t.Fatalf("verify of a good job: exit %d, %q", r.code, r.stdout)
	}
	// One flipped bit in sample 7's hidden states: same size, so only --deep sees it.
	path := checkpoint.OutputPath(j.out, 7)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := f.Stat()
	b := make([]byte, 1)
	f.ReadAt(b, info.Size()-100)
	b[0] ^= 1
	f.WriteAt(b, info.Size()-100)
	f.Close()
	if r := j.run("verify"); r.code != 0 {
		t.Errorf("quick verify should not read the data: exit %d %q", r.code, r.stdout)
	}
	r := j.run("verify", "--deep")
	if r.code != 1 || !strings.Contains(r.stdout, "sample 7") || !strings.Contains(r.stderr, "--repair") {
		t.Fatalf("deep verify: exit %d, stdout %q, stderr %q; want 1 naming sample 7 and --repair", r.code, r.stdout, r.stderr)
	}
	if r := j.run("verify", "--deep", "--repair"); r.code != 0 {
		t.Fatalf("repair: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if st := j.status(); num(st["done"]) != 29 {
		t.Fatalf("after repair: %v; want sample 7 back to pending", st)
	}
	if r := j.run("run", "--resume"); r.code != 0 {
		t.Fatalf("resume exit %d\n%s", r.code, r.stderr)
	}
	j.requireExact()
}

func TestTextSamplesTakeTheServersTokensAsTheTruth(t *testing.T) {
	j := newJob(t, 3, 0)
	texts := []string{"hello, world", "EAGLE-3 drafts", "x"}
	var buf bytes.Buffer
	for i, text := range texts {
		line, _ := json.Marshal(map[string]any{"text": text, "id": i})
		buf.Write(line)
		buf.WriteByte('\n')
		ids := simulator.Tokenize(text)
		mask := make([]int64, len(ids))
		for k := range mask {
			mask[k] = 1
		}
		j.samples[i] = sample{ids: ids, mask: mask}
	}
	if err := os.WriteFile(j.dataset, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := j.run("run"); r.code != 0 {
		t.Fatalf("run exit %d\n%s", r.code, r.stderr)
	}
	j.requireExact()
}
