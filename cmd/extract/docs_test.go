package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

var updateOpsDoc = flag.Bool("update-ops-doc", false, "rewrite docs/operations.md's demo doctor block from this build's output")

const repoRoot = "../.."

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docFiles are the operator's documents whose commands must work as written.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	return files
}

// Every `extract <command> --flag …` the docs show names a command that exists and
// flags it takes: the README once showed `status --all --watch`, which did not watch.
func TestEveryDocumentedCommandLineNamesARealCommandAndItsFlags(t *testing.T) {
	cmdRe := regexp.MustCompile("(?:^|[`$ /])extract ([a-z]+)((?: +[^`\n#|>]*)?)")
	flagRe := regexp.MustCompile(`(?:^|[\s\[(|])--([a-z][a-z-]*)`)
	root := newRootCmd()
	seen := 0
	for _, f := range docFiles(t) {
		for _, line := range strings.Split(readDoc(t, f), "\n") {
			for _, m := range cmdRe.FindAllStringSubmatch(line, -1) {
				sub, rest := m[1], m[2]
				cmd, _, err := root.Find([]string{sub})
				if err != nil || cmd == root {
					continue // prose: "extract is", "extract writes"
				}
				seen++
				for _, fm := range flagRe.FindAllStringSubmatch(rest, -1) {
					if cmd.Flags().Lookup(fm[1]) == nil && cmd.InheritedFlags().Lookup(fm[1]) == nil && fm[1] != "help" {
						t.Errorf("%s: `extract %s … --%s`: %s takes no --%s\n  %s", f, sub, fm[1], sub, fm[1], strings.TrimSpace(line))
					}
				}
			}
		}
	}
	if seen < 30 {
		t.Fatalf("found only %d documented command lines: is the pattern right?", seen)
	}
}

// Cron's PATH is thin: the documented cron lines call extract by its absolute path.
func TestTheDocumentedCronLinesCallExtractByAnAbsolutePath(t *testing.T) {
	ops := readDoc(t, "docs/operations.md")
	lines := regexp.MustCompile(`(?m)^([*0-9/,-]+ ){5}(\S+)`).FindAllStringSubmatch(ops, -1)
	if len(lines) == 0 {
		t.Fatal("operations.md shows no cron line")
	}
	for _, m := range lines {
		if !filepath.IsAbs(m[2]) {
			t.Errorf("cron line %q runs %s, not an absolute path", m[0], m[2])
		}
	}
}

// The demo doctor block in operations.md is what this build prints for it, with the
// machine's free space, the temp dirs and the repo's path put back as the doc has them.
func TestTheOperationsDemoDoctorOutputIsWhatDoctorPrints(t *testing.T) {
	ops := readDoc(t, "docs/operations.md")
	start := strings.Index(ops, "OK    gpu          none needed (server.kind simulator)\nOK    port         127.0.0.1:30111")
	if start < 0 {
		t.Fatal("operations.md has no demo doctor block starting with the gpu and port checks")
	}
	end := strings.Index(ops[start:], "\n```")
	if end < 0 {
		t.Fatal("the demo doctor block does not end")
	}
	want := ops[start : start+end+1]

	// As in the doc: the binary installed on a durable disk, the output dir's parent not
	// there yet (the run creates it), both under /var/tmp.
	binDir, err := os.MkdirTemp("/var/tmp", "extract-docs-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(binDir) })
	bin := filepath.Join(binDir, "extract")
	copyFile(t, extractBin, bin)
	outParent, err := os.MkdirTemp("/var/tmp", "extract-docs-out-")
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(outParent)
	t.Cleanup(func() { os.RemoveAll(outParent) })
	out := filepath.Join(outParent, "out")
	shmDir := filepath.Join(t.TempDir(), "shm")
	if d, err := os.MkdirTemp("/dev/shm", "extract-docs-"); err == nil {
		os.Remove(d)
		shmDir = d
	}
	port := freePort(t)
	// The demo config and dataset copied to a durable disk as the repo's were: a checkout
	// under /tmp (CI's, often) would make the config check warn.
	abs, err := os.MkdirTemp("/var/tmp", "extract-docs-repo-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(abs) })
	copyFile(t, filepath.Join(repoRoot, "configs", "demo.yaml"), filepath.Join(abs, "configs", "demo.yaml"))
	copyFile(t, filepath.Join(repoRoot, "configs", "demo", "dataset.jsonl"), filepath.Join(abs, "configs", "demo", "dataset.jsonl"))
	cmd := exec.Command(bin, "doctor", "--config", "configs/demo.yaml")
	cmd.Dir = abs
	cmd.Env = append(cleanEnv(), "EXTRACT_OUTPUT_DIR="+out, "EXTRACT_SHM_DIR="+shmDir, "EXTRACT_SERVER_PORT="+strconv.Itoa(port))
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("doctor of the demo: %v\n%s", err, b)
	}
	got := string(b)
	for _, r := range []struct{ from, to string }{
		{bin, "/var/tmp/extract-ops-bin/extract"},
		{outParent, "/var/tmp/extract-ops-demo"},
		{shmDir, "/dev/shm/extract-ops-demo"},
		{abs + "/", "/work/main/"},
		{"127.0.0.1:" + strconv.Itoa(port), "127.0.0.1:30111"},
	} {
		got = strings.ReplaceAll(got, r.from, r.to)
	}
	space := regexp.MustCompile(`\d+\.\d GiB free`)
	of := regexp.MustCompile(`free of \d+\.\d GiB`)
	norm := func(s string) string {
		return of.ReplaceAllString(space.ReplaceAllString(s, "N GiB free"), "free of N GiB")
	}
	if *updateOpsDoc {
		if err := os.WriteFile(filepath.Join(repoRoot, "docs/operations.md"), []byte(ops[:start]+got+ops[start+end+1:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if norm(got) != norm(want) {
		t.Errorf("operations.md's demo doctor block is not what doctor prints (run with -args -update-ops-doc to rewrite it)\n--- doc\n%s--- doctor\n%s", want, got)
	}
}

// cleanEnv is the test's environment without EXTRACT_* keys a developer may have set.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(name, "EXTRACT_") || strings.HasPrefix(name, "EXTRACT_CI_") {
			env = append(env, kv)
		}
	}
	return env
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// doctor --json has the keys the doc's first example names.
func TestDoctorJSONHasTheDocumentedKeys(t *testing.T) {
	ops := readDoc(t, "docs/operations.md")
	m := regexp.MustCompile(`--json   # (\{[^\n]*\})`).FindStringSubmatch(ops)
	if m == nil {
		t.Fatal("operations.md does not say doctor --json's keys")
	}
	documented := map[string]bool{}
	for _, k := range regexp.MustCompile(`"([a-z_]+)"`).FindAllStringSubmatch(ops[strings.Index(ops, m[0]):strings.Index(ops, m[0])+len(m[0])+80], -1) {
		documented[k[1]] = true
	}
	j := newJob(t, 2, 0)
	r := j.run("doctor", "--json")
	var rep map[string]json.RawMessage
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, r.stdout)
	}
	for k := range rep {
		if !documented[k] {
			t.Errorf("doctor --json has %q, which operations.md does not name (%s)", k, m[1])
		}
	}
	for k := range documented {
		// running_pid is there only while a run holds the lock.
		if rep[k] == nil && k != "running_pid" {
			t.Errorf("operations.md names doctor --json key %q, which the output lacks (%s)", k, m[1])
		}
	}
}

// run.json and the admission pause reasons of /metrics are the ones operations.md shows,
// read from a live run.
func TestRunJSONAndThePauseReasonsAreTheDocumentedOnes(t *testing.T) {
	ops := readDoc(t, "docs/operations.md")
	j := newJob(t, 60, 2000)
	run := j.command("run")
	logf, err := os.Create(filepath.Join(j.dir, "run.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	run.Stdout, run.Stderr = logf, logf
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		run.Process.Signal(syscall.SIGTERM)
		run.Wait()
	}()
	// Admission has run (and set its gauges) once a sample is done.
	j.waitStatus("a live run with a sample done", func(st map[string]any) bool { d, _ := st["done"].(float64); return d > 0 })
	b, err := os.ReadFile(filepath.Join(j.state, "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	var info map[string]any
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\{"pid":.*\}$`).FindString(ops)
	var doc map[string]any
	if err := json.Unmarshal([]byte(m), &doc); err != nil {
		t.Fatalf("operations.md's run.json example %q: %v", m, err)
	}
	if got, want := sortedKeys(info), sortedKeys(doc); !slices.Equal(got, want) {
		t.Errorf("run.json has keys %v; operations.md shows %v", got, want)
	}

	addr, _ := info["status_addr"].(string)
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var live []string
	for _, mm := range regexp.MustCompile(`extract_admission_paused\{reason="([^"]+)"\}`).FindAllSubmatch(body, -1) {
		live = append(live, string(mm[1]))
	}
	row := regexp.MustCompile("(?m)^\\| `extract_admission_paused\\{reason\\}` \\|.*$").FindString(ops)
	for _, reason := range live {
		if !strings.Contains(row, "`"+reason+"`") {
			t.Errorf("the live run pauses for %q, which operations.md's metrics table does not list:\n%s", reason, row)
		}
		if !bytes.Contains([]byte(ops[strings.Index(ops, "`paused` lists why admission waits"):]), []byte("`"+reason)) {
			t.Errorf("operations.md's `paused` list lacks %q", reason)
		}
	}
	if len(live) < 4 {
		t.Fatalf("/metrics lists only %v as pause reasons", live)
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
