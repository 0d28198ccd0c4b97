package main

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/testsupport"
	"github.com/extract-dev/extract/sglang/simulator"
)

// debianTorch is /usr/bin/python3 when it has torch (Debian's python3-torch).
func debianTorch(t *testing.T) string {
	t.Helper()
	testsupport.Require(t, testsupport.Torch)
	return "/usr/bin/python3"
}

// writeSpecForgeFiles has real torch write SpecForge-style files (torch.save of the
// dict prepare_hidden_states.py saves, [1,T,H] bf16) for the given samples under dir,
// holding exactly what the simulator would compute; spoil says how to damage one.
func (j *job) writeSpecForgeFiles(dir string, samples []int, spoil map[int]string) {
	j.t.Helper()
	py := debianTorch(j.t)
	type entry struct {
		Path  string  `json:"path"`
		Bin   string  `json:"bin"`
		IDs   []int64 `json:"ids"`
		Mask  []int64 `json:"mask"`
		H     int     `json:"h"`
		Spoil string  `json:"spoil"`
	}
	var list []entry
	for _, s := range samples {
		smp, H := j.samples[s], j.hidden
		switch spoil[s] {
		case "other ids":
			smp = j.samples[s+1]
		case "wrong H":
			H *= 2
		}
		T := len(smp.ids)
		hidden, aux := make([]byte, 0, 2*T*H), make([]byte, 0, 6*T*H)
		row := make([]byte, 2*H)
		for p, tok := range smp.ids {
			simulator.FillRow(row, tok, p, 61, H)
			hidden = append(hidden, row...)
			for _, layer := range []int{2, 30, 58} {
				simulator.FillRow(row, tok, p, layer, H)
				aux = append(aux, row...)
			}
		}
		g := s / 2000 * 2000
		ext := ".ckpt"
		if spoil[s] == "gzip" {
			ext = ".ckpt.gz"
		}
		e := entry{Path: filepath.Join(dir, fmt.Sprintf("rows_%d-%d", g, g+2000), fmt.Sprintf("data_%d%s", s, ext)),
			Bin: filepath.Join(j.dir, fmt.Sprintf("raw-%d.bin", s)), IDs: smp.ids, Mask: smp.mask, H: H, Spoil: spoil[s]}
		if err := os.WriteFile(e.Bin, append(hidden, aux...), 0o644); err != nil {
			j.t.Fatal(err)
		}
		list = append(list, e)
	}
	manifest := filepath.Join(j.dir, "manifest.json")
	b, _ := json.Marshal(list)
	os.WriteFile(manifest, b, 0o644)
	out, err := exec.Command(py, "-c", `
import gzip, json, os, sys, torch
for e in json.load(open(sys.argv[1])):
    raw = open(e["bin"], "rb").read()
    T, H = len(e["ids"]), e["h"]
    bf = lambda b, *shape: torch.frombuffer(bytearray(b), dtype=torch.int16).view(torch.bfloat16).reshape(*shape)
    hidden = bf(raw[:2 * T * H], 1, T, H)
    aux = bf(raw[2 * T * H:], 1, T, 3 * H)
    if e["spoil"] == "NaN":
        hidden[0, T // 2, 1] = float("nan")
    # Not extract's order: the reader must take any dict order.
    d = {"aux_hidden_state": aux, "hidden_state": hidden,
         "input_ids": torch.tensor(e["ids"], dtype=torch.long), "loss_mask": torch.tensor(e["mask"], dtype=torch.long)}
    os.makedirs(os.path.dirname(e["path"]), exist_ok=True)
    if e["spoil"] == "gzip":
        with gzip.open(e["path"], "wb") as f:
            torch.save(d, f)
    else:
        torch.save(d, e["path"])
    if e["spoil"] == "truncated":
        os.truncate(e["path"], os.path.getsize(e["path"]) * 6 // 10)
`, manifest).CombinedOutput()
	if err != nil {
		j.t.Fatalf("write SpecForge files with torch: %v\n%s", err, out)
	}
}

type importSummary struct {
	Imported    int `json:"imported"`
	AlreadyDone int `json:"already_done"`
	Done        int `json:"done"`
	Total       int `json:"total"`
	Rejected    []struct {
		Sample int
		Reason string
	}
}

func (j *job) importJSON(from string) importSummary {
	j.t.Helper()
	r := j.run("import", "--from", from, "--json")
	if r.code != 0 {
		j.t.Fatalf("import exit %d: %s", r.code, r.stderr)
	}
	var s importSummary
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		j.t.Fatalf("import JSON: %v\n%s", err, r.stdout)
	}
	return s
}

func TestImportAdoptsExactlyTheGoodSpecForgeFilesSurvivesSIGKILLAndResumeComputesOnlyTheRest(t *testing.T) {
	// The job writes safetensors, so every SpecForge file is converted on the way in.
	// (A specforge job links them as they are; checkpoint's import tests cover that, and
	// run --resume of a specforge job needs doctor's stat of done files to use the
	// job's layout: see docs/formats.md.)
	j := newJob(t, 300, 50000)
	from := filepath.Join(j.dir, "specforge-out")
	spoil := map[int]string{3: "other ids", 5: "truncated", 7: "wrong H", 9: "NaN", 10: "gzip", 101: "gzip"}
	var half, good []int
	for s := range 150 {
		half = append(half, s)
		if spoil[s] == "" || spoil[s] == "gzip" {
			good = append(good, s)
		}
	}
	j.writeSpecForgeFiles(from, half, spoil)

	// Killed anywhere, any number of times: the rerun reaches the same end.
	// Delays grow so that the kills land early, midway and late in the import.
	r := rand.New(rand.NewSource(time.Now().UnixNano()))
	for _, base := range []int{20, 100, 200, 300, 500, 800} {
		cmd := j.command("import", "--from", from)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(base+r.Intn(base)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		if _, err := os.Stat(filepath.Join(j.state, "index.db")); err == nil {
			t.Logf("after a SIGKILL: %v imported", j.status()["imported"])
		}
	}
	sum := j.importJSON(from)
	var rejected []int
	for _, rj := range sum.Rejected {
		rejected = append(rejected, rj.Sample)
		t.Logf("left alone: sample %d: %s", rj.Sample, rj.Reason)
	}
	slices.Sort(rejected)
	if !slices.Equal(rejected, []int{3, 5, 7, 9}) || sum.Done != len(good) || sum.Imported+sum.AlreadyDone != len(good) {
		t.Fatalf("import summary %+v, rejected %v; want 3, 5, 7, 9 left alone and %d done", sum, rejected, len(good))
	}
	// Idempotent: a second import changes nothing.
	if again := j.importJSON(from); again.Imported != 0 || again.AlreadyDone != len(good) || len(again.Rejected) != 4 {
		t.Fatalf("second import %+v", again)
	}
	if st := j.status(); st["imported"].(float64) != float64(len(good)) || st["done"].(float64) != float64(len(good)) {
		t.Fatalf("status: imported %v, done %v; want %d", st["imported"], st["done"], len(good))
	}
	// The linked files are SpecForge's own bytes; the rest is computed now.
	if r := j.run("run", "--resume"); r.code != 0 {
		t.Fatalf("run --resume: exit %d: %s", r.code, r.stderr)
	}
	requested := map[int]bool{}
	for _, rid := range j.requests() {
		var s, a int
		fmt.Sscanf(rid, "s%d-a%d", &s, &a)
		requested[s] = true
	}
	for i := range j.samples {
		if slices.Contains(good, i) == requested[i] {
			t.Errorf("sample %d: imported %v, requested %v", i, slices.Contains(good, i), requested[i])
		}
	}
	if lost, corrupt, extra := j.check(); lost+corrupt+extra > 0 {
		t.Fatalf("lost %d, corrupt %d, extra %d", lost, corrupt, extra)
	}
	if r := j.run("verify", "--deep"); r.code != 0 {
		t.Fatalf("verify --deep: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	if st := j.status(); st["imported"].(float64) != float64(len(good)) || st["done"].(float64) != float64(len(j.samples)) {
		t.Fatalf("final status: imported %v, done %v", st["imported"], st["done"])
	}
}
