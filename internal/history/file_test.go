package history

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/lazyfs"
)

// tmpfsDir is a temp dir on tmpfs where there is one: the 10-day test syncs 170,000
// records, which a real disk would take minutes over.
func tmpfsDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/dev/shm", "history-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func readAll(t *testing.T, path string) Decoded {
	t.Helper()
	d, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestOpenCutsOffATornLastRecordAndTheNextRecordFollowsTheLastGoodOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	w, err := Open(path, Options{Interval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	w.Append(rec(1000, 1))
	w.Close(rec(2000, 2))
	// A crash in the middle of the third record's frame.
	torn, _ := appendFrame(nil, rec(3000, 3))
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(torn[:len(torn)-7])
	f.Close()
	if d := readAll(t, path); len(d.Records) != 2 || d.Torn != int64(len(torn)-7) {
		t.Fatalf("reader: %d records, torn %d; want 2 and the torn frame ignored", len(d.Records), d.Torn)
	}
	w, err = Open(path, Options{Interval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	w.Close(rec(4000, 4))
	d := readAll(t, path)
	if len(d.Records) != 3 || d.Records[2].Done != 4 || d.Torn != 0 || d.Skipped != 0 {
		t.Fatalf("after reopening: %+v", d)
	}
}

func TestAHistoryIsNotWrittenThroughASymlinkOrIntoAForeignFile(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "precious")
	os.WriteFile(target, []byte("someone's data"), 0o644)
	link := filepath.Join(dir, FileName)
	os.Symlink(target, link)
	if _, err := Open(link, Options{}); err == nil {
		t.Fatal("opened a history through a symlink")
	}
	if _, err := ReadFile(link); err == nil {
		t.Fatal("read a history through a symlink")
	}
	foreign := filepath.Join(dir, "other.log")
	os.WriteFile(foreign, []byte("not a history\n"), 0o644)
	var nh *ErrNotHistory
	if _, err := Open(foreign, Options{}); !errors.As(err, &nh) {
		t.Fatalf("foreign file: err = %v, want ErrNotHistory", err)
	}
	for _, p := range []string{target, foreign} {
		if b, _ := os.ReadFile(p); string(b) != "someone's data" && string(b) != "not a history\n" {
			t.Errorf("%s was changed: %q", p, b)
		}
	}
}

// TestATenDayJobsHistoryStaysUnderOneMiBAndStillShowsEveryEvent drives a Writer with a
// clock the test controls: ten days of a run's snapshots once a second, two replicas,
// a pause every six hours, a restart a day, extract itself restarted every three days.
func TestATenDayJobsHistoryStaysUnderOneMiBAndStillShowsEveryEvent(t *testing.T) {
	const bound = 1 << 20
	path := filepath.Join(tmpfsDir(t), FileName)
	days := 10
	total := days * 86400 / 2 // a sample every two seconds
	var w *Writer
	var run int64
	largest := int64(0)
	restarts := 0
	for s := 0; s < days*86400; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		if s%(3*86400) == 0 {
			if w != nil {
				w.Close(Record{T: Millis(now) - 1000, Run: run, State: "stopped", Total: total, Done: s / 2})
			}
			var err error
			if w, err = Open(path, Options{}); err != nil {
				t.Fatal(err)
			}
			run, restarts = Millis(now), 0
		}
		if s%86400 == 43200 {
			restarts++
		}
		r := Record{T: Millis(now), Run: run, PID: 4242, State: "running", Total: total, Done: s / 2, Bytes: int64(s) * 300 << 10,
			Tokens: int64(s) * 900, Inflight: 16, Rate: 0.5, StagingBytes: 3 << 30, StagingBudget: 8 << 30,
			DiskFree: int64(days*86400-s) << 20, DiskReserve: 100 << 30,
			Replicas: []Replica{{State: "ready", Inflight: 8, Done: s / 4}, {State: "ready", Inflight: 8, Done: s / 4, Restarts: restarts}}}
		if s%(6*3600) < 600 {
			r.Paused = []string{"output disk behind"}
		}
		w.Append(r)
		if s%30 == 0 {
			// Faster than real time: give the writer the time the run would.
			w.Flush()
		}
		if s%3600 == 0 {
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			largest = max(largest, st.Size())
		}
	}
	w.Close(Record{T: Millis(t0.Add(time.Duration(days) * 24 * time.Hour)), Run: run, State: "complete", Total: total, Done: total})
	st, _ := os.Stat(path)
	largest = max(largest, st.Size())
	d := readAll(t, path)
	t.Logf("10 days: %d bytes at the end, %d at most, %d records", st.Size(), largest, len(d.Records))
	if largest > bound {
		t.Errorf("the history reached %d bytes, more than %d", largest, bound)
	}
	if first := d.Records[0].Time(); first.Sub(t0) > time.Hour {
		t.Errorf("the history starts at %v, %v after the job: its beginning was compacted away", first, first.Sub(t0))
	}
	evs := Events(d.Records, 0, "")
	if n := countKind(evs, RunStart); n != 4 {
		t.Errorf("%d run starts, want 4", n)
	}
	if n := countKind(evs, Restart); n != days {
		t.Errorf("%d restarts, want %d", n, days)
	}
	if n := countKind(evs, Pause); n != days*4 {
		t.Errorf("%d pauses, want %d", n, days*4)
	}
}

// The crash tests run a writer in a child process (this test binary again) that prints
// each record's number once Flush says it is synced.
const childEnv = "EXTRACT_HISTORY_TEST_CHILD"

func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		os.Exit(writeForever(path))
	}
	os.Exit(m.Run())
}

func writeForever(path string) int {
	// Tiers tight enough that the child compacts (rewrites and renames) every few
	// records: a kill lands in a compaction as often as in an append.
	w, err := Open(path, Options{Interval: time.Nanosecond, CompactEvery: 7, Tiers: []Tier{{Age: 20 * time.Millisecond, Step: 10 * time.Millisecond}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	last := 0
	if d, err := ReadFile(path); err == nil && len(d.Records) > 0 {
		last = d.Records[len(d.Records)-1].Done
	}
	var t int64
	for i := last + 1; ; i++ {
		// Records a millisecond apart at least: the sampler writes none closer.
		t = max(time.Now().UnixMilli(), t+1)
		w.Append(Record{T: t, Run: 1, State: "running", Done: i, Replicas: []Replica{{State: "ready", Done: i}}})
		w.Flush()
		fmt.Println(i)
	}
}

// crashRig starts writers and kills them.
type crashRig struct {
	t    *testing.T
	path string
	rng  *rand.Rand
}

// runAndKill starts a writer, lets it sync some records and SIGKILLs it; it returns
// the last record the writer said was synced.
func (c *crashRig) runAndKill() int {
	t := c.t
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+c.path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	want := 5 + c.rng.Intn(60)
	last := 0
	for n := 0; n < want && sc.Scan(); n++ {
		last, _ = strconv.Atoi(sc.Text())
	}
	cmd.Process.Signal(syscall.SIGKILL)
	for sc.Scan() { // what it synced before the signal landed
		last, _ = strconv.Atoi(sc.Text())
	}
	cmd.Wait()
	if last == 0 {
		t.Fatal("the writer synced nothing before it was killed")
	}
	return last
}

// check reads the history after a crash: it must read without error, in order, and
// hold every record the writer said it synced.
func (c *crashRig) check(synced int) {
	t := c.t
	t.Helper()
	d := readAll(t, c.path)
	if d.Skipped > 0 {
		t.Errorf("%d damaged bytes between good records", d.Skipped)
	}
	for i := 1; i < len(d.Records); i++ {
		if d.Records[i].Done <= d.Records[i-1].Done {
			t.Fatalf("records out of order: %d after %d", d.Records[i].Done, d.Records[i-1].Done)
		}
	}
	if len(d.Records) == 0 || d.Records[len(d.Records)-1].Done < synced {
		t.Fatalf("the writer synced record %d, the history holds %d records ending at %+v", synced, len(d.Records), d.Records[max(len(d.Records)-1, 0):])
	}
}

func TestTheHistorySurvivesSIGKILLMidWrite(t *testing.T) {
	c := &crashRig{t: t, path: filepath.Join(t.TempDir(), FileName), rng: rand.New(rand.NewSource(time.Now().UnixNano()))}
	for range 12 {
		c.check(c.runAndKill())
	}
	// A compaction killed before its rename leaves a temp file; the next writer removes it.
	os.WriteFile(filepath.Join(filepath.Dir(c.path), "."+FileName+".tmp123"), []byte("half a compaction"), 0o644)
	w, err := Open(c.path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Close(Record{T: time.Now().UnixMilli(), Run: 1, Done: 1 << 30})
	entries, _ := os.ReadDir(filepath.Dir(c.path))
	if len(entries) != 1 {
		t.Errorf("the state dir holds %v, want only %s", entries, FileName)
	}
}

func TestTheHistorySurvivesAPowerCut(t *testing.T) {
	mnt := t.TempDir()
	disk := lazyfs.New()
	if err := disk.Mount(mnt); err != nil {
		if errors.Is(err, lazyfs.ErrUnavailable) {
			t.Skipf("needs a FUSE mount: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { disk.Unmount() })
	state := filepath.Join(mnt, "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, _ := os.Open(mnt)
	dir.Sync()
	dir.Close()
	c := &crashRig{t: t, path: filepath.Join(state, FileName), rng: rand.New(rand.NewSource(time.Now().UnixNano()))}
	for range 8 {
		synced := c.runAndKill()
		if err := disk.PowerCut(); err != nil {
			t.Fatal(err)
		}
		c.check(synced)
	}
	t.Logf("lazyfs: %+v", disk.Stats())
}
