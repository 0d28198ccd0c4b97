package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/internal/lazyfs"
	"github.com/extract-dev/extract/internal/testsupport"
	"github.com/extract-dev/extract/sglang/simulator"
)

var (
	powerCuts = flag.Int("powercuts", 20, "power cuts in the power-cut test")
	powerSeed = flag.Int64("powercut-seed", 0, "seed of the power-cut test's timing (0: from the clock)")
)

// powerRig is a job whose output_dir and state_dir live on a lazyfs disk, so that a
// power cut loses what extract did not fsync.
type powerRig struct {
	t    *testing.T
	j    *job
	disk *lazyfs.FS
	mnt  string
	bin  string
	rng  *rand.Rand

	cuts, completedRuns int
	// doneAtCut is the durable done count read after each reboot.
	doneAtCut []int
	// lost, corrupt: samples done in the rebooted index whose file is missing, or is
	// empty, torn or wrong. regressed: cuts after which the index had fewer samples done
	// than the live run had reported before the cut.
	lost, corrupt, regressed int
}

func newPowerRig(t *testing.T, bin string, n, tokensPerSecond int) *powerRig {
	t.Helper()
	disk, mnt := mountLazyDisk(t)
	j := newJob(t, n, tokensPerSecond)
	// Both dirs are created by extract itself on the "disk": whatever it forgets to
	// fsync on the way is lost at the first cut.
	j.out = filepath.Join(mnt, "out")
	j.state = filepath.Join(mnt, "state")
	j.env = append(j.env, "EXTRACT_OUTPUT_DIR="+j.out, "EXTRACT_STATE_DIR="+j.state)
	seed := *powerSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("power-cut seed %d (rerun with -powercut-seed %d)", seed, seed)
	r := &powerRig{t: t, j: j, disk: disk, mnt: mnt, bin: bin, rng: rand.New(rand.NewSource(seed))}
	t.Cleanup(func() { r.killServers() }) // before the unmount: cleanups run last first
	return r
}

// mountLazyDisk mounts an empty lazyfs disk for the test, or skips the test where FUSE
// cannot be mounted.
func mountLazyDisk(t *testing.T) (*lazyfs.FS, string) {
	t.Helper()
	mnt := t.TempDir()
	disk := lazyfs.New()
	if err := disk.Mount(mnt); err != nil {
		if errors.Is(err, lazyfs.ErrUnavailable) {
			testsupport.Unavailable(t, testsupport.FUSE, "mount lazyfs: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := disk.Unmount(); err != nil {
			t.Errorf("unmount lazyfs: %v", err)
		}
	})
	return disk, mnt
}

// command is j.command with the rig's binary, in its own process group so that a cut
// kills it and anything it forked.
func (r *powerRig) command(args ...string) *exec.Cmd {
	cmd := exec.Command(r.bin, append(args, "--config", r.j.config)...)
	cmd.Env = r.j.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// runOnce runs `extract run --resume` and cuts the power at a random moment: either a
// random time after the start, or shortly after new output files appear (the moment an
// unsynced file would be lost). It reports whether the run finished before the cut.
func (r *powerRig) runOnce() (finished bool) {
	t := r.t
	cmd := r.command("run", "--resume")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()

	var deadline <-chan time.Time
	if r.rng.Intn(3) == 0 {
		deadline = time.After(time.Duration(50+r.rng.Intn(1500)) * time.Millisecond)
	} else {
		deadline = r.afterNewOutput(1+r.rng.Intn(4), time.Duration(r.rng.Intn(150))*time.Millisecond, exited)
	}
	// What the live run says is done was committed: it must survive the cut.
	liveDone := -1
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("run exited on its own with %v\n%s", waitErr, errb.String())
		}
		r.completedRuns++
		finished = true
	case <-deadline:
		if st, ok := r.liveStatus(); ok {
			liveDone = num(st["done"])
		}
	}
	// A finished job's disk is cut too: what it finished must stay finished.
	r.cut(cmd, exited)
	done := r.inspect()
	if liveDone > done {
		r.regressed++
		t.Errorf("cut %d: the live run reported %d done, the index after the reboot has %d", r.cuts, liveDone, done)
	}
	return finished
}

// afterNewOutput fires delay after k new data files show up in the live output dir.
func (r *powerRig) afterNewOutput(k int, delay time.Duration, exited <-chan struct{}) <-chan time.Time {
	fire := make(chan time.Time, 1)
	rows := filepath.Dir(checkpoint.OutputPath(r.j.out, 0))
	before := countData(rows)
	go func() {
		giveUp := time.Now().Add(10 * time.Second)
		for time.Now().Before(giveUp) && !isClosed(exited) {
			if countData(rows) >= before+k {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(delay)
		fire <- time.Now()
	}()
	return fire
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func countData(dir string) int {
	entries, _ := os.ReadDir(dir)
	n := 0
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "data_") {
			n++
		}
	}
	return n
}

// liveStatus asks the running process; ok is false if none answered.
func (r *powerRig) liveStatus() (map[string]any, bool) {
	cmd := r.command("status", "--json")
	out, err := cmd.Output()
	if err != nil {
		return nil, false
	}
	var st map[string]any
	if json.Unmarshal(out, &st) != nil || st["source"] != "live" {
		return nil, false
	}
	return st, true
}

// cut pulls the plug: every process of the job dies at once, the disk loses what was
// not synced, and the staging tmpfs is empty after the "reboot".
func (r *powerRig) cut(cmd *exec.Cmd, exited <-chan struct{}) {
	t := r.t
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
	for r.killServers() > 0 {
	}
	if err := r.disk.PowerCut(); err != nil {
		t.Fatalf("power cut %d: %v", r.cuts+1, err)
	}
	r.cuts++
	entries, _ := os.ReadDir(r.j.shmDir)
	for _, e := range entries {
		os.RemoveAll(filepath.Join(r.j.shmDir, e.Name()))
	}
}

// killServers kills every simulator serving this job. server.json may itself be lost
// in a cut, so they are found by their command line (the job's own staging dir), and
// killed by process group: the server runs in its own session. It returns how many it
// killed.
func (r *powerRig) killServers() int {
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i := 0; i+1 < len(args); i++ {
			// The server by its staging dir; a child forked by extract that has left the
			// process group but not yet exec'd by the job's config.
			if (args[i] == "--shm-dir" && args[i+1] == r.j.shmDir) || (args[i] == "--config" && args[i+1] == r.j.config) {
				pids = append(pids, pid)
				syscall.Kill(-pid, syscall.SIGKILL)
				syscall.Kill(pid, syscall.SIGKILL)
				break
			}
		}
	}
	// Until they are gone they hold files on the disk and the job's port.
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if alive(pid) {
			r.t.Fatalf("simulator pid %d survived SIGKILL", pid)
		}
	}
	return len(pids)
}

// inspect reads the rebooted disk: which samples the index says are done, and whether
// each of their files is there and exact. It returns the done count.
func (r *powerRig) inspect() int {
	t := r.t
	done := r.doneInIndex()
	var lost, corrupt []int
	for _, i := range done {
		path := checkpoint.OutputPath(r.j.out, i)
		b, err := os.ReadFile(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			lost = append(lost, i)
		case err != nil:
			t.Fatalf("read %s: %v", path, err)
		default:
			if err := r.checkOutput(b, i); err != nil {
				corrupt = append(corrupt, i)
				t.Logf("cut %d: sample %d is done in the index but its file is bad: %v", r.cuts, i, err)
			}
		}
	}
	r.lost += len(lost)
	r.corrupt += len(corrupt)
	r.doneAtCut = append(r.doneAtCut, len(done))
	t.Logf("cut %d: %d samples done in the index after the reboot, %d of them lost %v, %d corrupt %v", r.cuts, len(done), len(lost), lost, len(corrupt), corrupt)
	return len(done)
}

// doneInIndex opens a copy of the rebooted index (this process serves the FUSE mount,
// so it must not mmap a file on it) and lists the samples marked done.
func (r *powerRig) doneInIndex() []int {
	t := r.t
	b, err := os.ReadFile(filepath.Join(r.j.state, "index.db"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "index.db")
	if err := os.WriteFile(cp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	ix, err := checkpoint.Open(cp, checkpoint.OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("cut %d: the index does not open after the reboot: %v", r.cuts, err)
	}
	defer ix.Close()
	p, err := ix.Load(len(r.j.samples))
	if err != nil {
		t.Fatalf("cut %d: load the index: %v", r.cuts, err)
	}
	var done []int
	for i, s := range p.State {
		if s == checkpoint.StateDone {
			done = append(done, i)
		}
	}
	return done
}

// checkOutput parses an output file without extract's code (8-byte little-endian
// header length, JSON header, tensors) and compares every byte with the dataset and
// the simulator's function.
func (r *powerRig) checkOutput(b []byte, idx int) error {
	if len(b) < 8 {
		return fmt.Errorf("%d bytes", len(b))
	}
	hlen := binary.LittleEndian.Uint64(b)
	if hlen > uint64(len(b)-8) {
		return fmt.Errorf("header length %d in a %d-byte file", hlen, len(b))
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+hlen], &hdr); err != nil {
		return fmt.Errorf("header: %w", err)
	}
	data := b[8+hlen:]
	var md map[string]string
	if err := json.Unmarshal(hdr["__metadata__"], &md); err != nil {
		return fmt.Errorf("__metadata__: %w", err)
	}
	if md["sample"] != strconv.Itoa(idx) {
		return fmt.Errorf("metadata sample %q", md["sample"])
	}
	if sum := fmt.Sprintf("%08x", crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli))); md["crc32c"] != sum {
		return fmt.Errorf("crc32c %q in the metadata, %s of the data", md["crc32c"], sum)
	}
	s, H := r.j.samples[idx], r.j.hidden
	T := len(s.ids)
	ints := func(v []int64) []byte {
		out := make([]byte, 8*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint64(out[8*i:], uint64(x))
		}
		return out
	}
	hidden := make([]byte, 0, T*2*H)
	aux := make([]byte, 0, T*6*H)
	row := make([]byte, 2*H)
	for p, tok := range s.ids {
		simulator.FillRow(row, tok, p, 61, H)
		hidden = append(hidden, row...)
		for _, layer := range []int{2, 30, 58} {
			simulator.FillRow(row, tok, p, layer, H)
			aux = append(aux, row...)
		}
	}
	want := []struct {
		name, dtype string
		shape       []int
		bytes       []byte
	}{
		{"input_ids", "I64", []int{T}, ints(s.ids)},
		{"loss_mask", "I64", []int{T}, ints(s.mask)},
		{"hidden_state", "BF16", []int{T, H}, hidden},
		{"aux_hidden_state", "BF16", []int{T, 3 * H}, aux},
	}
	if len(hdr) != len(want)+1 {
		return fmt.Errorf("%d header entries, want %d tensors and __metadata__", len(hdr), len(want))
	}
	covered := 0
	for _, w := range want {
		var ti struct {
			DType   string `json:"dtype"`
			Shape   []int  `json:"shape"`
			Offsets [2]int `json:"data_offsets"`
		}
		if err := json.Unmarshal(hdr[w.name], &ti); err != nil {
			return fmt.Errorf("tensor %s: %w", w.name, err)
		}
		if ti.DType != w.dtype || fmt.Sprint(ti.Shape) != fmt.Sprint(w.shape) {
			return fmt.Errorf("tensor %s is %s %v, want %s %v", w.name, ti.DType, ti.Shape, w.dtype, w.shape)
		}
		lo, hi := ti.Offsets[0], ti.Offsets[1]
		if lo < 0 || hi < lo || hi > len(data) {
			return fmt.Errorf("tensor %s at [%d, %d) of %d data bytes", w.name, lo, hi, len(data))
		}
		if !bytes.Equal(data[lo:hi], w.bytes) {
			return fmt.Errorf("tensor %s differs from the expected bytes", w.name)
		}
		covered += hi - lo
	}
	if covered != len(data) {
		return fmt.Errorf("tensors cover %d of %d data bytes", covered, len(data))
	}
	return nil
}

// finalCheck walks the output dir: every sample once at its literal path and exact,
// nothing else. It returns the numbers of missing, corrupt and stray files.
func (r *powerRig) finalCheck() (missing, corrupt, stray int) {
	t := r.t
	want := map[string]int{}
	for i := range r.j.samples {
		want[filepath.Join(r.j.out, "rows_0-2000", fmt.Sprintf("data_%d.safetensors", i))] = i
	}
	seen := map[string]bool{}
	err := filepath.WalkDir(r.j.out, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		i, ok := want[path]
		if !ok {
			t.Errorf("stray file in the output: %s", path)
			stray++
			return nil
		}
		seen[path] = true
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := r.checkOutput(b, i); err != nil {
			t.Errorf("sample %d: %v", i, err)
			corrupt++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for path, i := range want {
		if !seen[path] {
			t.Errorf("sample %d: no file at %s", i, path)
			missing++
		}
	}
	return missing, corrupt, stray
}

func (r *powerRig) summary() string {
	return fmt.Sprintf("%d power cuts (%d runs finished between cuts), done in the index after each reboot %v", r.cuts, r.completedRuns, r.doneAtCut)
}

func TestPowerCutsAtRandomMomentsLoseNothingThatWasDone(t *testing.T) {
	start := time.Now()
	const n = 120
	// Slow enough that the job spans the cuts: a few samples per run.
	r := newPowerRig(t, extractBin, n, max(30000 / *powerCuts, 1))
	for r.cuts < *powerCuts {
		if r.runOnce() && r.completedRuns == 1 {
			t.Logf("the job completed before cut %d; the finished job is cut from now on", r.cuts)
		}
	}
	res := r.j.run("run", "--resume")
	if res.code != 0 {
		t.Fatalf("final run exit %d\n%s", res.code, res.stderr)
	}
	missing, corrupt, stray := r.finalCheck()
	st := r.j.status()
	dup := num(st["done"]) - n
	t.Logf("%s", r.summary())
	t.Logf("%d power cuts, %d samples, %d lost, %d duplicated, %d corrupt, %d stray, %d index regressions (%.1fs)",
		r.cuts, n, r.lost+missing, dup, r.corrupt+corrupt, stray, r.regressed, time.Since(start).Seconds())
	if r.lost+r.corrupt+r.regressed > 0 {
		t.Errorf("samples done in the index were lost to power cuts: %d missing, %d corrupt, %d regressions", r.lost, r.corrupt, r.regressed)
	}
	if missing+corrupt+stray > 0 || dup != 0 || st["state"] != "complete" || num(st["total"]) != n {
		t.Fatalf("job not exact after %d power cuts: status %v", r.cuts, st)
	}
	if v := r.j.run("verify", "--deep"); v.code != 0 {
		t.Fatalf("verify --deep: exit %d\n%s%s", v.code, v.stdout, v.stderr)
	}
}

var noFsyncBin = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(filepath.Dir(extractBin), "extract-skip-output-fsync")
	build := exec.Command("go", "build", "-tags", "extract_skip_output_fsync", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build with extract_skip_output_fsync: %w\n%s", err, out)
	}
	return bin, nil
})

// The twin proves the power-cut test bites: with the output file's fsync compiled out,
// some sample is done in the index while its file did not survive.
func TestPowerCutWithoutOutputFsyncIsCaught(t *testing.T) {
	testsupport.Require(t, testsupport.FUSE)
	bin, err := noFsyncBin()
	if err != nil {
		t.Fatal(err)
	}
	const n = 120
	r := newPowerRig(t, bin, n, max(30000 / *powerCuts, 1))
	for r.cuts < *powerCuts && r.lost+r.corrupt == 0 {
		r.runOnce()
	}
	t.Logf("%s", r.summary())
	t.Logf("without the output fsync: %d power cuts, %d samples done in the index with their file lost, %d with it empty or corrupt", r.cuts, r.lost, r.corrupt)
	if r.lost+r.corrupt == 0 {
		t.Fatalf("%d power cuts and no loss detected with the output fsync removed: the power-cut test does not bite", r.cuts)
	}
}
