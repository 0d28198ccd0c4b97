package shm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// ErrUnsafeDir marks a staging dir that another user could write: a dump planted or
// rewritten there would be adopted as a sample's output. It is a preflight refusal.
var ErrUnsafeDir = errors.New("unsafe staging dir")

// UnsafeDirError says what is wrong with a staging dir and what to do; it wraps
// ErrUnsafeDir.
type UnsafeDirError struct {
	Path, Problem, Fix string
}

func (e *UnsafeDirError) Error() string { return e.Problem + "; " + e.Fix }

func (e *UnsafeDirError) Unwrap() error { return ErrUnsafeDir }

// Owner is who may own and write the staging dir: our euid alone, or with Group >= 0
// that group too (a server that runs as another user in it).
type Owner struct {
	UID   int
	Group int // -1: no group may write
}

// DirMode is the mode a staging dir is made with: 0700, or 02770 with a group (setgid,
// so the server's files keep the group).
func (o Owner) DirMode() os.FileMode {
	if o.Group >= 0 {
		return 0o770 | os.ModeSetgid
	}
	return 0o700
}

// dirFacts is what lstat says about one path, for judge.
type dirFacts struct {
	exists  bool
	symlink bool
	dir     bool
	uid     int
	gid     int
	perm    uint32 // the low 12 bits of st_mode
}

func factsOf(st *unix.Stat_t) dirFacts {
	return dirFacts{exists: true, symlink: st.Mode&unix.S_IFMT == unix.S_IFLNK, dir: st.Mode&unix.S_IFMT == unix.S_IFDIR,
		uid: int(st.Uid), gid: int(st.Gid), perm: st.Mode & 0o7777}
}

// judge says what is wrong with a staging dir (facts of path), or "" when only o can
// write it: a directory, not a symlink, owned by o.UID, writable by no other user and by
// no group other than o.Group. fix says what to do about it.
func judge(path string, f dirFacts, o Owner) (problem, fix string) {
	switch {
	case f.symlink:
		return fmt.Sprintf("%s is a symlink", path), fmt.Sprintf("point shm_dir at a real dir (not through %s), or remove the link", path)
	case !f.dir:
		return fmt.Sprintf("%s is not a directory", path), fmt.Sprintf("remove or rename %s, or set shm_dir elsewhere", path)
	case f.uid != o.UID:
		return fmt.Sprintf("%s is owned by %s, not by us (%s): that user could plant or rewrite dumps there, and extract would adopt them", path, userName(f.uid), userName(o.UID)),
			fmt.Sprintf("check what is in it, then remove it (extract recreates it, mode %s), or set shm_dir to a dir of our own", modeString(o))
	case f.perm&0o002 != 0:
		return fmt.Sprintf("%s is writable by every user (mode %#o)", path, f.perm), fmt.Sprintf("chmod %s %s (or set shm_dir to a dir of its own: extract creates it so)", modeString(o), path)
	case f.perm&0o020 != 0 && (o.Group < 0 || f.gid != o.Group):
		return fmt.Sprintf("%s is writable by group %s (mode %#o), which shm_group does not name", path, groupName(f.gid), f.perm),
			fmt.Sprintf("chmod g-w %s, or set shm_group to that group if a server running as another user in it writes the dumps", path)
	}
	return "", ""
}

func modeString(o Owner) string {
	if o.Group >= 0 {
		return "2770"
	}
	return "0700"
}

// judgeParent says what is wrong with the dir that holds the staging dir: another user who
// may write it (without the sticky bit, as /dev/shm and /tmp have) could rename our dir
// away and put theirs in its place.
func judgeParent(path string, f dirFacts, o Owner) (problem, fix string) {
	switch {
	case f.symlink && f.uid != 0 && f.uid != o.UID:
		return fmt.Sprintf("%s, a dir above the staging dir, is a symlink owned by %s", path, userName(f.uid)), "point shm_dir at a path that does not go through another user's symlink"
	case f.symlink:
		return "", ""
	case f.uid != 0 && f.uid != o.UID:
		return fmt.Sprintf("%s, a dir above the staging dir, is owned by %s, who could replace the staging dir", path, userName(f.uid)),
			"set shm_dir under a dir owned by us or root (e.g. /dev/shm/<name>)"
	case f.perm&0o1000 == 0 && (f.perm&0o002 != 0 || (f.perm&0o020 != 0 && f.gid != o.Group)):
		return fmt.Sprintf("%s, the dir that holds the staging dir, may be written by others (mode %#o) and is not sticky: they could replace the staging dir", path, f.perm),
			fmt.Sprintf("chmod o-w,g-w %s, or set shm_dir under a dir only we (or root) write, or a sticky one such as /dev/shm", path)
	}
	return "", ""
}

// CheckDir says whether dir is a staging dir only o (and root) can write: the dir and
// every dir above it up to / (no symlink owned by another user on the way, no parent
// others may write without the sticky bit). A missing dir is no error: PrepareDir
// creates it. The error wraps ErrUnsafeDir and says the fix.
func CheckDir(dir string, o Owner) error {
	dir = filepath.Clean(dir)
	if isSharedRoot(dir) {
		return &UnsafeDirError{dir, fmt.Sprintf("staging dir %s is a dir every user may write, not one of its own", dir),
			fmt.Sprintf("set shm_dir to a folder of its own in it (e.g. %s)", filepath.Join(dir, "sglang_hs"))}
	}
	var st unix.Stat_t
	err := unix.Lstat(dir, &st)
	if err == nil {
		if problem, fix := judge(dir, factsOf(&st), o); problem != "" {
			return &UnsafeDirError{dir, "staging dir " + problem, fix}
		}
	} else if !errors.Is(err, unix.ENOENT) {
		return &UnsafeDirError{dir, fmt.Sprintf("staging dir %s: %v", dir, err), "set shm_dir to a dir we can read"}
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		if err := unix.Lstat(p, &st); err == nil {
			if problem, fix := judgeParent(p, factsOf(&st), o); problem != "" {
				return &UnsafeDirError{dir, problem, fix}
			}
		}
		if p == "/" || p == "." {
			return nil
		}
	}
}

// isSharedRoot says whether dir is itself a world-writable sticky dir (/dev/shm, /tmp):
// every user may create names in it, so extract's names there are not its own.
func isSharedRoot(dir string) bool {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return dir == "/dev/shm" || dir == "/tmp"
	}
	return st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Mode&0o1002 == 0o1002
}

// PrepareDir makes dir a staging dir only o can write: the missing dirs of its path are
// created with o's mode (0700, or 02770 and the group for a server of that group), then
// CheckDir judges the whole path. An existing dir is never changed or emptied: one that
// another user made, or others may write, is refused (its files are not ours to delete).
func PrepareDir(dir string, o Owner) error {
	dir = filepath.Clean(dir)
	if err := CheckDir(dir, o); err != nil {
		return err
	}
	if err := mkdirs(dir, o); err != nil {
		return err
	}
	return CheckDir(dir, o)
}

// mkdirs creates dir and its missing parents with o's mode (umask aside) and group.
func mkdirs(dir string, o Owner) error {
	if _, err := os.Lstat(dir); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("create staging dir %s: %w", dir, err)
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirs(parent, o); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create staging dir %s: %w", dir, err)
	} else if err != nil {
		return nil // made meanwhile by someone else: CheckDir judges it
	}
	if o.Group >= 0 {
		if err := os.Lchown(dir, -1, o.Group); err != nil {
			return fmt.Errorf("give staging dir %s to group %s (shm_group): %w", dir, groupName(o.Group), err)
		}
	}
	// Mkdir's mode passes through the umask, and setgid needs chmod.
	if err := os.Chmod(dir, o.DirMode()); err != nil {
		return fmt.Errorf("chmod staging dir %s: %w", dir, err)
	}
	return nil
}

// userName is "uid N (name)", or "uid N" when the name is unknown.
func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return fmt.Sprintf("uid %d (%s)", uid, u.Username)
	}
	return fmt.Sprintf("uid %d", uid)
}

// groupName is "gid N (name)", or "gid N" when the name is unknown.
func groupName(gid int) string {
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		return fmt.Sprintf("gid %d (%s)", gid, g.Name)
	}
	return fmt.Sprintf("gid %d", gid)
}

// LookupGroup resolves shm_group (a group name or a gid) to a gid; "" is -1, no group.
func LookupGroup(name string) (int, error) {
	if name == "" {
		return -1, nil
	}
	if gid, err := strconv.Atoi(name); err == nil && gid >= 0 {
		return gid, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return -1, fmt.Errorf("shm_group %q: %w", name, err)
	}
	return strconv.Atoi(g.Gid)
}
