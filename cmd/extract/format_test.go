package main

import (
	"encoding/json"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

type exportSummary struct {
	Exported int `json:"exported"`
	Skipped  int `json:"skipped"`
	Failed   int `json:"failed"`
}

func (j *job) exportJSON(format, to string) exportSummary {
	j.t.Helper()
	r := j.run("export", "--format", format, "--to", to, "--json")
	if r.code != 0 {
		j.t.Fatalf("export %s: exit %d: %s%s", format, r.code, r.stdout, r.stderr)
	}
	var s exportSummary
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		j.t.Fatalf("export JSON: %v\n%s", err, r.stdout)
	}
	return s
}

// checkWithTorch runs scripts/check_torch_formats.py on dir against the safetensors
// reference, with SpecForge's reader when ../shared has it.
func (j *job) checkWithTorch(py, dir, ref string, specforge bool) {
	j.t.Helper()
	args := []string{"../../scripts/check_torch_formats.py", dir, "--reference", ref}
	src, _ := filepath.Abs("../../../shared/specforge-src")
	if _, err := os.Stat(src); specforge && err == nil {
		args = append(args, "--specforge", src, "--collate", "4")
	} else if specforge {
		j.t.Logf("SpecForge source absent at %s: its reader is not run", src)
	}
	out, err := exec.Command(py, args...).CombinedOutput()
	var sum struct {
		Files          int  `json:"files"`
		SpecforgeFiles int  `json:"specforge_files"`
		OK             bool `json:"ok"`
	}
	json.Unmarshal(out, &sum)
	if err != nil || !sum.OK || sum.Files != len(j.samples) {
		j.t.Fatalf("check_torch_formats %s: %v\n%s", dir, err, out)
	}
	if len(args) > 4 && sum.SpecforgeFiles != len(j.samples) {
		j.t.Fatalf("SpecForge's reader found %d of %d files\n%s", sum.SpecforgeFiles, len(j.samples), out)
	}
	j.t.Logf("%s", out)
}

func TestASpecForgeJobIsReadAsIsByTorchAndSpecForgeAndExportsByteIdenticalAcrossKills(t *testing.T) {
	py := debianTorch(t)
	j := newJob(t, 30, 20000)
	j.format = "specforge"
	j.env = append(j.env, "EXTRACT_OUTPUT_FORMAT=specforge")
	if r := j.run("run"); r.code != 0 {
		t.Fatalf("run: exit %d: %s", r.code, r.stderr)
	}
	if lost, corrupt, extra := j.check(); lost+corrupt+extra > 0 {
		t.Fatalf("lost %d, corrupt %d, extra %d", lost, corrupt, extra)
	}
	if r := j.run("verify", "--deep"); r.code != 0 {
		t.Fatalf("verify --deep: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	ref := filepath.Join(j.dir, "ref")
	if s := j.exportJSON("safetensors", ref); s.Exported != len(j.samples) || s.Failed != 0 {
		t.Fatalf("export to safetensors: %+v", s)
	}
	j.checkWithTorch(py, j.out, ref, true)

	// Killed anywhere, an export resumes: each file is complete under its final name.
	gz := filepath.Join(j.dir, "gz")
	r := rand.New(rand.NewSource(time.Now().UnixNano()))
	for range 4 {
		cmd := j.command("export", "--format", "specforge+gzip", "--to", gz)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(r.Intn(300)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	}
	if s := j.exportJSON("specforge+gzip", gz); s.Exported+s.Skipped != len(j.samples) || s.Failed != 0 {
		t.Fatalf("resumed export: %+v", s)
	}
	if s := j.exportJSON("specforge+gzip", gz); s.Skipped != len(j.samples) {
		t.Fatalf("export of a complete target rewrote files: %+v", s)
	}
	j.checkWithTorch(py, gz, ref, true)
	mo := filepath.Join(j.dir, "modelopt")
	j.exportJSON("modelopt", mo)
	j.checkWithTorch(py, mo, ref, false)
}
