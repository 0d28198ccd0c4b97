package shm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/extract-dev/extract/internal/testsupport"
)

func TestJudgeAcceptsOnlyADirNoOtherUserCanWrite(t *testing.T) {
	me := Owner{UID: 1000, Group: -1}
	group := Owner{UID: 1000, Group: 50}
	mine := dirFacts{exists: true, dir: true, uid: 1000, gid: 1000, perm: 0o700}
	for _, c := range []struct {
		name string
		f    func(*dirFacts)
		o    Owner
		says string // "": accepted
	}{
		{"ours, 0700", func(*dirFacts) {}, me, ""},
		{"ours, 0755: others may read, not write", func(f *dirFacts) { f.perm = 0o755 }, me, ""},
		{"another user's", func(f *dirFacts) { f.uid = 65534 }, me, "is owned by uid 65534"},
		{"ours but world-writable", func(f *dirFacts) { f.perm = 0o777 }, me, "writable by every user"},
		{"ours, sticky and world-writable", func(f *dirFacts) { f.perm = 0o1777 }, me, "writable by every user"},
		{"group-writable, no shm_group", func(f *dirFacts) { f.perm = 0o770 }, me, "which shm_group does not name"},
		{"group-writable by shm_group", func(f *dirFacts) { f.perm, f.gid = 0o2770, 50 }, group, ""},
		{"group-writable by another group", func(f *dirFacts) { f.perm, f.gid = 0o2770, 51 }, group, "which shm_group does not name"},
		{"a symlink", func(f *dirFacts) { f.symlink, f.dir = true, false }, me, "is a symlink"},
		{"a file", func(f *dirFacts) { f.dir = false }, me, "is not a directory"},
	} {
		f := mine
		c.f(&f)
		problem, fix := judge("/dev/shm/x", f, c.o)
		if (c.says == "") != (problem == "") || !strings.Contains(problem, c.says) || (problem != "" && fix == "") {
			t.Errorf("%s: judge = %q (fix %q), want it to say %q", c.name, problem, fix, c.says)
		}
	}
	for _, c := range []struct {
		name string
		f    dirFacts
		bad  bool
	}{
		{"/dev/shm: sticky, world-writable", dirFacts{dir: true, uid: 0, perm: 0o1777}, false},
		{"root's 0755", dirFacts{dir: true, uid: 0, perm: 0o755}, false},
		{"world-writable, not sticky", dirFacts{dir: true, uid: 0, perm: 0o777}, true},
		{"another user's", dirFacts{dir: true, uid: 65534, perm: 0o755}, true},
		{"another user's symlink", dirFacts{symlink: true, uid: 65534, perm: 0o777}, true},
		{"root's symlink (/dev/shm -> /run/shm)", dirFacts{symlink: true, uid: 0, perm: 0o777}, false},
	} {
		if problem, _ := judgeParent("/p", c.f, me); (problem != "") != c.bad {
			t.Errorf("parent %s: judgeParent = %q, want refused %v", c.name, problem, c.bad)
		}
	}
}

// asNobody runs sh -c script as user nobody, group nogroup, no other groups.
func asNobody(t *testing.T, script string) {
	t.Helper()
	testsupport.Require(t, testsupport.Root) // to act as a second user
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testsupport.Unavailable(t, testsupport.Root, "setpriv (util-linux) is not installed")
	}
	if out, err := exec.Command(setpriv, "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "sh", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("as nobody: %s: %v\n%s", script, err, out)
	}
}

// sharedTmpfs is a dir on the real /dev/shm that every user may create names in, sticky,
// as /dev/shm is.
func sharedTmpfs(t *testing.T) string {
	t.Helper()
	if fs, err := StatFS("/dev/shm"); err != nil || !fs.Tmpfs {
		testsupport.Unavailable(t, testsupport.Root, "/dev/shm is not a tmpfs here")
	}
	d, err := os.MkdirTemp("/dev/shm", "owner-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestAStagingDirAnotherUserMadeIsRefusedAndItsFilesKept(t *testing.T) {
	shared := sharedTmpfs(t)
	stage := filepath.Join(shared, "sglang_hs")
	dump := filepath.Join(stage, "s000000000-a1.safetensors")
	asNobody(t, "mkdir -m 0777 "+stage+" && echo planted > "+dump+" && chmod 0777 "+stage)
	me := Owner{UID: os.Geteuid(), Group: -1}
	err := PrepareDir(stage, me)
	if !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "is owned by uid 65534 (nobody), not by us") {
		t.Fatalf("PrepareDir of nobody's dir = %v, want ErrUnsafeDir naming nobody", err)
	}
	if err := CheckDir(stage, me); !errors.Is(err, ErrUnsafeDir) {
		t.Errorf("CheckDir of nobody's dir = %v", err)
	}
	if b, err := os.ReadFile(dump); err != nil || string(b) != "planted\n" {
		t.Errorf("nobody's file was touched: %q, %v", b, err)
	}

	// A symlink nobody planted where the staging dir should be.
	link := filepath.Join(shared, "linked")
	asNobody(t, "ln -s "+stage+" "+link)
	if err := PrepareDir(link, me); !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "is a symlink") {
		t.Errorf("PrepareDir of a symlink = %v, want ErrUnsafeDir", err)
	}
	// The shared tmpfs root itself.
	if err := PrepareDir(shared, me); !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "a dir every user may write, not one of its own") {
		t.Errorf("PrepareDir of the shared root = %v, want ErrUnsafeDir", err)
	}
	if err := CheckDir("/dev/shm", me); !errors.Is(err, ErrUnsafeDir) {
		t.Errorf("CheckDir(/dev/shm) = %v, want ErrUnsafeDir", err)
	}
}

func TestAReplicaSubdirAnotherUserMadeIsRefused(t *testing.T) {
	shared := sharedTmpfs(t)
	me := Owner{UID: os.Geteuid(), Group: -1}
	stage := filepath.Join(shared, "sglang_hs")
	if err := PrepareDir(stage, me); err != nil {
		t.Fatal(err)
	}
	// Left open for a moment (by an operator's chmod), long enough for nobody's r1.
	os.Chmod(stage, 0o777)
	asNobody(t, "mkdir -m 0755 "+filepath.Join(stage, "r1"))
	os.Chmod(stage, 0o700)
	if err := PrepareDir(filepath.Join(stage, "r1"), me); !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "nobody") {
		t.Errorf("PrepareDir of nobody's replica subdir = %v, want ErrUnsafeDir naming nobody", err)
	}
	if err := PrepareDir(filepath.Join(stage, "r2"), me); err != nil {
		t.Errorf("PrepareDir of a fresh replica subdir: %v", err)
	}
}

func TestPrepareDirMakesTheStagingDirOursAloneOrOurGroups(t *testing.T) {
	shared := sharedTmpfs(t)
	old := unix.Umask(0)
	defer unix.Umask(old)
	me := Owner{UID: os.Geteuid(), Group: -1}
	dir := filepath.Join(shared, "a", "sglang_hs")
	if err := PrepareDir(dir, me); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if st, err := os.Stat(d); err != nil || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, %v; want 0700 whatever the umask", d, st.Mode(), err)
		}
	}
	if os.Geteuid() != 0 {
		return // chown to another group needs root
	}
	gid, err := LookupGroup("nogroup")
	if err != nil {
		t.Skip(err)
	}
	grp := Owner{UID: os.Geteuid(), Group: gid}
	gdir := filepath.Join(shared, "g")
	if err := PrepareDir(gdir, grp); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(gdir, &st); err != nil || st.Mode&0o7777 != 0o2770 || int(st.Gid) != gid {
		t.Errorf("group staging dir: mode %#o gid %d, want 02770 gid %d", st.Mode&0o7777, st.Gid, gid)
	}
	// The server's user, in that group, may write there; our own check accepts it.
	asNobody(t, "true") // setpriv exists
	if out, err := exec.Command("setpriv", "--reuid", "nobody", "--regid", strconv.Itoa(gid), "--clear-groups", "touch", filepath.Join(gdir, "x")).CombinedOutput(); err != nil {
		t.Errorf("a server of group %d cannot write the group staging dir: %v %s", gid, err, out)
	}
	if err := CheckDir(gdir, me); !errors.Is(err, ErrUnsafeDir) {
		t.Errorf("a group-writable staging dir without shm_group: %v, want refused", err)
	}
}
