package sglang

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/extract-dev/extract/sglang/sglangtest"
)

// realPython is an interpreter without SGLang: the installs under test are the fake
// ones each test puts on PYTHONPATH.
func realPython(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skipf("no python3: %v", err)
	}
	return py
}

func envWithPythonPath(dirs ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PYTHONPATH=") {
			env = append(env, kv)
		}
	}
	return append(env, "PYTHONPATH="+strings.Join(dirs, ":"))
}

func inspect(t *testing.T, env []string) InstallFacts {
	t.Helper()
	f, err := InspectInstall(ctxFor(t, time.Minute), realPython(t), env, "")
	if err != nil {
		t.Fatalf("InspectInstall: %v", err)
	}
	return f
}

// The seams the hook patches, as seams.py's _PATCHES names them.
var hookSeams = []string{
	"sglang.srt.layers.logits_processor",
	"sglang.srt.managers.schedule_batch",
	"sglang.srt.model_executor.forward_batch_info",
	"sglang.srt.model_executor.model_runner",
	"sglang.srt.server_args",
}

func TestInspectInstallChecksAWheelAgainstItsRecordAndNamesAHandPatchedFile(t *testing.T) {
	site := sglangtest.Wheel(t, "0.0.7", sglangtest.Files("0.0.7"))
	env := envWithPythonPath(site)

	f := inspect(t, env)
	if f.Version != "0.0.7" || f.Location != filepath.Join(site, "sglang") || f.Editable {
		t.Errorf("version %q at %q (editable %v); want 0.0.7 at %s, a wheel", f.Version, f.Location, f.Editable, filepath.Join(site, "sglang"))
	}
	if !f.Audited || !strings.Contains(f.Audit, "RECORD") || len(f.Modified)+len(f.Missing) > 0 {
		t.Errorf("pristine wheel: audited %v (%s), modified %v, missing %v", f.Audited, f.Audit, f.Modified, f.Missing)
	}

	// The incident's hand patch, an added module, a deleted one, and an edit outside
	// sglang/srt (not audited).
	appendFile(t, filepath.Join(site, "sglang/srt/models/deepseek_v2.py"), "# dump hidden states to /dev/shm/sglang_hs\n")
	appendFile(t, filepath.Join(site, "sglang/srt/models/hs_dump.py"), "pass\n")
	appendFile(t, filepath.Join(site, "sglang/lang/interpreter.py"), "pass\n")
	if err := os.Remove(filepath.Join(site, "sglang/srt/layers/logits_processor.py")); err != nil {
		t.Fatal(err)
	}
	f = inspect(t, env)
	if want := []string{"sglang/srt/models/deepseek_v2.py", "sglang/srt/models/hs_dump.py"}; !slices.Equal(f.Modified, want) {
		t.Errorf("modified %v, want %v", f.Modified, want)
	}
	if want := []string{"sglang/srt/layers/logits_processor.py"}; !slices.Equal(f.Missing, want) {
		t.Errorf("missing %v, want %v", f.Missing, want)
	}
	// The probe wrote no bytecode into the install it audits.
	if _, err := os.Stat(filepath.Join(site, "sglang", "__pycache__")); err == nil {
		t.Error("the probe left sglang/__pycache__ in the install")
	}
}

func TestInspectInstallReportsTheSeamsOfAFakeSGLangOneByOneWithoutCrashing(t *testing.T) {
	site := sglangtest.Wheel(t, "0.0.7", sglangtest.Files("0.0.7"))

	f := inspect(t, envWithPythonPath(site))

	// The fake's ScheduleBatch is the one seam it has; the others are missing or lack
	// what the hook wraps.
	const supported = "sglang.srt.managers.schedule_batch"
	var names []string
	for _, s := range f.Seams {
		names = append(names, s.Name)
		if s.OK != (s.Name == supported) || s.Detail == "" {
			t.Errorf("seam %+v: want ok only for %s, and a detail", s, supported)
		}
	}
	unsupported := slices.DeleteFunc(slices.Clone(hookSeams), func(s string) bool { return s == supported })
	if !slices.Equal(names, hookSeams) || !slices.Equal(f.Unsupported, unsupported) {
		t.Errorf("seams %v, unsupported %v; want each of %v, all but %s unsupported", names, f.Unsupported, hookSeams, supported)
	}
	if f.SeamsError != "" {
		t.Errorf("seams error %q: the hook answered", f.SeamsError)
	}
	// server_args.py is absent from the fake: an import error; LogitsProcessor exists
	// without the forward the hook wraps: the hook's own refusal.
	detail := map[string]string{}
	for _, s := range f.Seams {
		detail[s.Name] = s.Detail
	}
	if d := detail[supported]; d != "ScheduleBatch.reqs" {
		t.Errorf("%s: detail %q, want the variant the hook found", supported, d)
	}
	if d := detail["sglang.srt.server_args"]; !strings.Contains(d, "cannot be imported") {
		t.Errorf("server_args: %q", d)
	}
	if d := detail["sglang.srt.layers.logits_processor"]; strings.Contains(d, "cannot be imported") {
		t.Errorf("logits_processor imports in the fake, but the report says %q", d)
	}
}

func TestInspectInstallChecksASourceCheckoutAgainstGitHead(t *testing.T) {
	_, pythonDir, head := sglangtest.Checkout(t, sglangtest.Files("0.0.8"))
	env := envWithPythonPath(pythonDir)

	f := inspect(t, env)
	if !f.Editable || f.GitHead != head || !f.Audited || len(f.Modified)+len(f.Missing) > 0 {
		t.Errorf("clean checkout: editable %v, head %q (want %s), audited %v (%s), modified %v, missing %v",
			f.Editable, f.GitHead, head, f.Audited, f.Audit, f.Modified, f.Missing)
	}

	appendFile(t, filepath.Join(pythonDir, "sglang/srt/models/deepseek_v2.py"), "# hand patch\n")
	appendFile(t, filepath.Join(pythonDir, "sglang/srt/new_seam.py"), "pass\n")
	if err := os.Remove(filepath.Join(pythonDir, "sglang/srt/model_executor/model_runner.py")); err != nil {
		t.Fatal(err)
	}
	f = inspect(t, env)
	if want := []string{"sglang/srt/models/deepseek_v2.py", "sglang/srt/new_seam.py"}; !slices.Equal(f.Modified, want) {
		t.Errorf("modified %v, want %v (%s)", f.Modified, want, f.Audit)
	}
	if want := []string{"sglang/srt/model_executor/model_runner.py"}; !slices.Equal(f.Missing, want) {
		t.Errorf("missing %v, want %v", f.Missing, want)
	}
}

func TestInspectInstallTakesAnEditableInstallToItsCheckoutNotItsMetadata(t *testing.T) {
	_, pythonDir, head := sglangtest.Checkout(t, sglangtest.Files("0.0.9"))
	// pip install -e leaves only metadata in site-packages; the package is imported
	// from the checkout.
	site := t.TempDir()
	mustWrite(t, filepath.Join(site, "sglang-0.0.9.dist-info/METADATA"), "Metadata-Version: 2.1\nName: sglang\nVersion: 0.0.9\n")
	mustWrite(t, filepath.Join(site, "sglang-0.0.9.dist-info/RECORD"), "sglang-0.0.9.dist-info/METADATA,,\n")
	mustWrite(t, filepath.Join(site, "sglang-0.0.9.dist-info/direct_url.json"), `{"url": "file://`+filepath.Dir(pythonDir)+`/python", "dir_info": {"editable": true}}`)
	appendFile(t, filepath.Join(pythonDir, "sglang/srt/layers/logits_processor.py"), "# the old HS dump patch\n")

	f := inspect(t, envWithPythonPath(site, pythonDir))
	if !f.Editable || f.GitHead != head || f.DistInfo != filepath.Join(site, "sglang-0.0.9.dist-info") {
		t.Errorf("editable %v, head %q (want %s), dist-info %q", f.Editable, f.GitHead, head, f.DistInfo)
	}
	if want := []string{"sglang/srt/layers/logits_processor.py"}; !slices.Equal(f.Modified, want) {
		t.Errorf("modified %v, want %v (%s)", f.Modified, want, f.Audit)
	}
}

func TestInspectInstallSaysWhenThereIsNoSGLang(t *testing.T) {
	_, err := InspectInstall(ctxFor(t, time.Minute), realPython(t), envWithPythonPath(t.TempDir()), "")
	if !errors.Is(err, ErrNoSGLang) {
		t.Fatalf("err %v, want ErrNoSGLang", err)
	}
}

func TestInspectInstallReturnsTheAuditWhenSGLangFailsToImport(t *testing.T) {
	files := sglangtest.Files("0.1.0")
	site := sglangtest.Wheel(t, "0.1.0", files)
	appendFile(t, filepath.Join(site, "sglang/__init__.py"), "import sglang.srt.not_there\n")

	f, err := InspectInstall(ctxFor(t, time.Minute), realPython(t), envWithPythonPath(site), "")
	if err == nil || !strings.Contains(err.Error(), "ModuleNotFoundError") {
		t.Fatalf("err %v, want the import error", err)
	}
	if f.Version != "0.1.0" || f.Location != filepath.Join(site, "sglang") || !f.Audited || f.SeamsError == "" {
		t.Errorf("facts %+v: want the version from the metadata, the audit, and the seams unknown", f)
	}
}

func TestInspectInstallKillsAProbeThatHangsWhenItsContextEnds(t *testing.T) {
	site := sglangtest.Wheel(t, "0.0.7", sglangtest.Files("0.0.7"))
	// An SGLang whose import never returns, and a child that keeps stdout open.
	pidFile := filepath.Join(t.TempDir(), "child")
	appendFile(t, filepath.Join(site, "sglang/__init__.py"),
		"import subprocess, time\np = subprocess.Popen(['sleep', '300'])\nopen('"+pidFile+"', 'w').write(str(p.pid))\ntime.sleep(300)\n")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()

	start := time.Now()
	_, err := InspectInstall(ctx, realPython(t), envWithPythonPath(site), "")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the deadline", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v", took)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the probe's child to die", func() bool {
		st, err := readStat(atoi(t, strings.TrimSpace(string(b))))
		return err != nil || st.dead()
	})
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("not a pid: %q", s)
		}
		n = n*10 + int(c-'0')
	}
	return n
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestInspectInstallKeepsWhatTheProbeSaidWhenASeamImportKillsIt(t *testing.T) {
	files := sglangtest.Files("0.0.7")
	// As a CUDA library that aborts the interpreter on import would.
	files["sglang/srt/server_args.py"] = "import os\nos.abort()\n"
	site := sglangtest.Wheel(t, "0.0.7", files)

	f := inspect(t, envWithPythonPath(site))
	if f.Version != "0.0.7" || !f.Audited || len(f.Seams) != 0 || !strings.Contains(f.SeamsError, "the probe died while importing the seam modules") {
		t.Errorf("facts %+v: want the version and the audit, and the seams unknown because the probe died", f)
	}
}
