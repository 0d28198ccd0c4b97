package sglang

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// ServerIdentity is what <state_dir>/server.json says about the server extract last
// launched, enough to tell its processes from strangers without signalling anything.
// With server.replicas, it also carries the records of the other replicas
// (server-<r>.json): Owns answers for all of them, the fields describe replica 0.
type ServerIdentity struct {
	PID, PGID int
	Port      int
	ServerID  string
	// Leader is true when the recorded pid is still the process we started (same boot,
	// same start time). Its group is ours only then: once the leader and all its
	// workers are gone, the kernel may hand the group id to anyone.
	Leader bool
	// Launching: the run that started it died before recording its pid; the next run
	// stops it (found by ServerID) and launches a new one.
	Launching bool
	sameBoot  bool
	// replicas are the other replicas' identities, by replica number.
	replicas map[int]*ServerIdentity
}

// LoadServerIdentity reads the server records in stateDir: server.json and every
// server-<r>.json. It returns nil, nil when there is none (or none is readable, which
// proves nothing about any process).
func LoadServerIdentity(stateDir string, log *slog.Logger) (*ServerIdentity, error) {
	id, err := loadReplicaIdentity(stateDir, 0, log)
	if err != nil {
		return nil, err
	}
	others, _ := filepath.Glob(filepath.Join(stateDir, "server-*.json"))
	for _, path := range others {
		var r int
		if _, err := fmt.Sscanf(filepath.Base(path), "server-%d.json", &r); err != nil || r <= 0 || RecordPath(stateDir, r) != path {
			continue
		}
		rid, err := loadReplicaIdentity(stateDir, r, log)
		if err != nil {
			return nil, err
		}
		if rid == nil {
			continue
		}
		if id == nil {
			// Replica 0 has no record: an identity that owns nothing by itself.
			id = &ServerIdentity{}
		}
		if id.replicas == nil {
			id.replicas = map[int]*ServerIdentity{}
		}
		id.replicas[r] = rid
	}
	return id, nil
}

func loadReplicaIdentity(stateDir string, r int, log *slog.Logger) (*ServerIdentity, error) {
	m := &Manager{StateDir: stateDir, Log: log, Replica: r}
	rec, err := m.readRecord()
	if err != nil || rec == nil {
		return nil, err
	}
	id := &ServerIdentity{PID: rec.PID, PGID: rec.PGID, Port: rec.Port, ServerID: rec.ServerID, Launching: rec.Launching}
	boot, err := bootID()
	if err != nil {
		return nil, err
	}
	id.sameBoot = boot == rec.BootID
	if st, err := readStat(rec.PID); err == nil && !st.dead() && id.sameBoot && st.startTime == rec.StartTime {
		id.Leader = true
	}
	return id, nil
}

// Replica is replica r's identity (r 0 is id itself when it has a record), or nil.
func (id *ServerIdentity) Replica(r int) *ServerIdentity {
	if id == nil {
		return nil
	}
	if r == 0 {
		if id.PID == 0 && id.ServerID == "" {
			return nil // no record of replica 0: the identity only holds the others
		}
		return id
	}
	return id.replicas[r]
}

// Owns reports whether pid belongs to a recorded server (any replica): a member of its
// process group while its leader lives, or any process whose initial environment
// carries the recorded EXTRACT_SERVER_ID (a worker orphaned by a dead leader keeps it).
// A nil identity owns nothing.
func (id *ServerIdentity) Owns(pid int) bool {
	if id == nil {
		return false
	}
	for _, r := range id.replicas {
		if r.Owns(pid) {
			return true
		}
	}
	if !id.sameBoot {
		return false
	}
	if id.Leader {
		if st, err := readStat(pid); err == nil && !st.dead() && st.pgid == id.PGID {
			return true
		}
	}
	return id.ServerID != "" && hasEnv(pid, serverIDEnv+"="+id.ServerID)
}

// PortHolder names the process holding TCP port, best effort: "pid N (cmdline)",
// or "" when /proc does not tell (another user's process, another network namespace).
func PortHolder(port int) string {
	if pid, cmd, _ := portHolder(port); pid > 0 {
		return fmt.Sprintf("pid %d (%s)", pid, cmd)
	}
	return ""
}

// ProcessCmdline is pid's command line from /proc; the error names the pid.
func ProcessCmdline(pid int) ([]string, error) {
	cmd, err := readCmdline(pid)
	if err != nil {
		return nil, fmt.Errorf("command line of pid %d: %w", pid, err)
	}
	if len(cmd) == 1 && cmd[0] == "" {
		// Kernel threads and zombies have an empty cmdline.
		return nil, nil
	}
	return cmd, nil
}

// SystemdUnit names the systemd service pid runs in, from /proc/<pid>/cgroup (e.g.
// "0::/system.slice/vllm.service" → "vllm.service"), and whether it is a user unit
// (under user@<uid>.service, stopped with systemctl --user). It is "" when pid is in no
// service: a login session, a container, or /proc does not say.
func SystemdUnit(pid int) (unit string, user bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", false
	}
	return unitFromCgroup(string(b))
}

// unitFromCgroup finds the service in a /proc/<pid>/cgroup file: the unified line
// ("0::path") on cgroup v2, the name=systemd line on v1.
func unitFromCgroup(content string) (string, bool) {
	var path string
	for _, line := range strings.Split(strings.TrimSpace(content), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" || parts[1] == "name=systemd" {
			path = parts[2]
			if parts[1] == "name=systemd" {
				break
			}
		}
	}
	segs := strings.Split(path, "/")
	user := false
	unit := ""
	for _, s := range segs {
		switch {
		case strings.HasPrefix(s, "user@") && strings.HasSuffix(s, ".service"):
			// The user's service manager itself: the units below it are user units.
			user = true
		case strings.HasSuffix(s, ".service"):
			unit = s
		}
	}
	if unit == "" {
		return "", false
	}
	return unit, user
}

// holdsNVIDIADevice reports whether pid has a /dev/nvidia* file open, as every CUDA
// process does; known is false when its file descriptors cannot be read (another
// user's process without root). It guards against naming the wrong process when NVML
// hands out pids of another PID namespace, as it does inside containers.
func holdsNVIDIADevice(pid int) (holds, known bool) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return false, false
	}
	for _, fd := range fds {
		if link, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && strings.HasPrefix(link, "/dev/nvidia") {
			return true, true
		}
	}
	return false, true
}
