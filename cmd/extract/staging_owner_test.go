package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/extract-dev/extract/internal/testsupport"
)

// nobody runs sh -c script as user nobody (group nogroup, no other groups): a real
// second user, as on a shared node.
func nobody(t *testing.T, script string) error {
	t.Helper()
	testsupport.Require(t, testsupport.Root) // to act as a second user
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testsupport.Unavailable(t, testsupport.Root, "setpriv (util-linux) is not installed")
	}
	return exec.Command(setpriv, "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "sh", "-c", script).Run()
}

// The default staging dir is a predictable name in world-writable /dev/shm: another user
// who made it first (0777, with dumps of their own in it) must not get their dumps
// adopted. run and doctor refuse it (exit 3) with the fix, and leave its files alone.
func TestAStagingDirAnotherUserCreatedIsRefusedByRunAndDoctor(t *testing.T) {
	j := newJob(t, 20, 0)
	shared, err := os.MkdirTemp("/dev/shm", "extract-owner-")
	if err != nil {
		testsupport.Unavailable(t, testsupport.Root, "no /dev/shm here: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(shared) })
	os.Chmod(shared, os.ModeSticky|0o777) // as /dev/shm itself
	stage := filepath.Join(shared, "sglang_hs")
	planted := filepath.Join(stage, "s000000000-a1.safetensors")
	if err := nobody(t, "mkdir -m 0777 "+stage+" && chmod 0777 "+stage+" && echo forged > "+planted); err != nil {
		t.Fatal("nobody could not prepare the staging dir:", err)
	}
	j.env = append(j.env, "EXTRACT_SHM_DIR="+stage)
	for _, cmd := range []string{"run", "doctor"} {
		r := j.run(cmd)
		out := r.stdout + r.stderr
		if r.code != 3 || !strings.Contains(out, "is owned by uid 65534 (nobody), not by us") || !strings.Contains(out, "remove it") {
			t.Errorf("%s over nobody's staging dir: exit %d, want 3 naming the owner and the fix:\n%s", cmd, r.code, out)
		}
	}
	if b, err := os.ReadFile(planted); err != nil || string(b) != "forged\n" {
		t.Errorf("nobody's file in the refused staging dir: %q, %v; want it left as it was", b, err)
	}
	if _, err := os.Stat(j.out); err == nil {
		if files, _ := filepath.Glob(filepath.Join(j.out, "rows_*", "*")); len(files) > 0 {
			t.Errorf("the refused run wrote outputs: %v", files)
		}
	}

	// The dir extract makes itself is its alone: nobody cannot plant a dump there.
	mine := filepath.Join(shared, "ours")
	j.env = append(j.env, "EXTRACT_SHM_DIR="+mine)
	if r := j.run("run"); r.code != 0 {
		t.Fatalf("run with a fresh staging dir: exit %d\n%s", r.code, r.stderr)
	}
	if st, err := os.Stat(mine); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("staging dir made by the run: %v, %v; want mode 0700", st.Mode(), err)
	}
	if err := nobody(t, "echo forged > "+filepath.Join(mine, "s000000001-a9.safetensors")); err == nil {
		t.Errorf("nobody could write into the staging dir extract made")
	}
}
