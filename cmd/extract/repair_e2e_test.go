package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// blockWithDir puts a non-empty directory at path: nothing extract does may remove it.
func blockWithDir(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(path, "keep"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// A directory at a sample's output path is that sample's failure: the run stores every
// other sample, fails this one naming the path, and exits 1 (not a store error retried
// for minutes and then exit 75, which cron would repeat forever).
func TestADirectoryAtAnOutputPathFailsThatSampleAndTheRunFinishesTheRest(t *testing.T) {
	j := newJob(t, 8, 0)
	blocked := filepath.Join(j.out, "rows_0-2000", "data_3.safetensors")
	blockWithDir(t, blocked)
	start := time.Now()
	r := j.run("run", "--resume")
	took := time.Since(start)
	if r.code != 1 || !strings.Contains(r.stderr, "1 samples failed") {
		t.Fatalf("run with a directory at sample 3's path: exit %d, want 1 with 1 failed\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, blocked) {
		t.Errorf("the log does not name the blocked path %s:\n%s", blocked, r.stderr)
	}
	if took > 60*time.Second {
		t.Errorf("the run took %s: the blocked sample was retried as a store error", took)
	}
	if st := j.status(); num(st["done"]) != 7 || num(st["failed"]) != 1 {
		t.Fatalf("status after the run: %v; want 7 done, 1 failed", st)
	}
	for i := range 8 {
		if i == 3 {
			continue
		}
		if _, err := os.Stat(filepath.Join(j.out, "rows_0-2000", "data_"+strconv.Itoa(i)+".safetensors")); err != nil {
			t.Errorf("sample %d: %v", i, err)
		}
	}
	if st, err := os.Stat(blocked); err != nil || !st.IsDir() {
		t.Fatalf("the directory at sample 3's path was touched: %v", err)
	}
	// Once the operator clears it, a resume finishes the job.
	if err := os.RemoveAll(blocked); err != nil {
		t.Fatal(err)
	}
	j.mustRun("run", "--resume")
	j.requireExact()
}

// verify --repair repairs every sample it can past an entry it cannot remove, says
// which ones it could not, and exits 1.
func TestVerifyRepairRepairsPastAnEntryItCannotRemoveAndExitsOne(t *testing.T) {
	j := newJob(t, 10, 0)
	j.mustRun("run")
	blockWithDir(t, filepath.Join(j.out, "rows_0-2000", "data_1.safetensors"))
	if err := os.Truncate(filepath.Join(j.out, "rows_0-2000", "data_6.safetensors"), 64); err != nil {
		t.Fatal(err)
	}
	r := j.run("verify", "--repair")
	if r.code != 1 {
		t.Fatalf("verify --repair: exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "1 repaired, 1 could not be repaired") || !strings.Contains(r.stdout, "sample 1: data_1.safetensors") || !strings.Contains(r.stdout, "cannot be removed") {
		t.Fatalf("verify --repair output:\n%s", r.stdout)
	}
	if _, err := os.Stat(filepath.Join(j.out, "rows_0-2000", "data_6.safetensors")); !os.IsNotExist(err) {
		t.Fatalf("sample 6's corrupt file was not removed: %v", err)
	}
	if st := j.status(); num(st["done"]) != 8 {
		t.Fatalf("after repair: %v; want samples 1 and 6 back to pending", st)
	}
}

// The advice of a deep verify names the command that repairs what it found: a crc32c
// mismatch is invisible to a shallow --repair, which would say "0 repaired".
func TestDeepVerifyAdvisesADeepRepairAndThatRepairFindsIt(t *testing.T) {
	j := newJob(t, 6, 0)
	j.mustRun("run")
	path := filepath.Join(j.out, "rows_0-2000", "data_4.safetensors")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-10] ^= 0x40 // the data, not the header: only --deep sees it
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	r := j.run("verify", "--deep")
	m := regexp.MustCompile("`(extract verify[^`]*--repair[^`]*)`").FindStringSubmatch(r.stderr)
	if r.code != 1 || m == nil {
		t.Fatalf("verify --deep: exit %d, want 1 with a repair command\n%s", r.code, r.stderr)
	}
	args := strings.Fields(strings.TrimPrefix(m[1], "extract "))
	r = j.mustRun(args...)
	if !strings.Contains(r.stdout, "1 repaired") {
		t.Fatalf("the advised `%s` did not repair sample 4:\n%s", m[1], r.stdout)
	}
	j.mustRun("run", "--resume")
	j.requireExact()
}
