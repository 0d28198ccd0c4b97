package sglang

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// procStat holds the /proc/<pid>/stat fields that identify a process and its group.
type procStat struct {
	state     byte
	ppid      int
	pgid      int
	threads   int    // the thread group's: a leader that exited before its threads is Z too
	startTime uint64 // clock ticks after boot; with the boot id, unique for a pid
}

func (p procStat) dead() bool { return p.state == 'Z' || p.state == 'X' }

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// comm (field 2) may hold spaces and parentheses; the fields after the last ')' do not.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return procStat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields after comm", pid, len(f))
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat ppid: %w", pid, err)
	}
	pgid, err := strconv.Atoi(f[2])
	if err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat pgrp: %w", pid, err)
	}
	threads, err := strconv.Atoi(f[17])
	if err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat num_threads: %w", pid, err)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat starttime: %w", pid, err)
	}
	return procStat{state: f[0][0], ppid: ppid, pgid: pgid, threads: threads, startTime: start}, nil
}

// ProcessStartTime is pid's start time from /proc/<pid>/stat (field 22, clock ticks after
// boot): with the boot id and the pid namespace, it tells a process from a later one that
// got its pid.
func ProcessStartTime(pid int) (uint64, error) {
	st, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	if st.dead() {
		return 0, fmt.Errorf("pid %d has exited", pid)
	}
	return st.startTime, nil
}

// BootID is this boot's /proc/sys/kernel/random/boot_id: a pid and a start time name
// a process only within one boot.
func BootID() (string, error) { return bootID() }

func readCmdline(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), nil
}

// hasEnv reports whether pid's initial environment holds the exact entry kv.
func hasEnv(pid int, kv string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return false
	}
	for _, e := range bytes.Split(b, []byte{0}) {
		if string(e) == kv {
			return true
		}
	}
	return false
}

func bootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func listPIDs() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// groupMembers lists the live processes of process group pgid.
func groupMembers(pgid int) []int {
	var pids []int
	for _, pid := range listPIDs() {
		if st, err := readStat(pid); err == nil && st.pgid == pgid && !st.dead() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// portHolder finds who holds TCP port: the process with a socket on it (a listener
// first, else any other, such as a connection bound to it), best effort; pid 0 when
// /proc does not tell (another user's process, another network namespace). timeWait
// says whether connections in TIME_WAIT hold it, which no process owns.
func portHolder(port int) (pid int, cmdline string, timeWait bool) {
	listen, other := map[string]bool{}, map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 {
				continue
			}
			_, hexPort, ok := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); !ok || err != nil || int(p) != port {
				continue
			}
			switch fields[3] {
			case "0A": // LISTEN
				listen["socket:["+fields[9]+"]"] = true
			case "06": // TIME_WAIT: its inode is 0, no process has it
				timeWait = true
			default:
				other["socket:["+fields[9]+"]"] = true
			}
		}
		_ = f.Close()
	}
	for _, inodes := range []map[string]bool{listen, other} {
		if pid, cmdline := socketOwner(inodes); pid > 0 {
			return pid, cmdline, timeWait
		}
	}
	return 0, "", timeWait
}

// socketOwner is the first process with an fd on one of the socket inodes.
func socketOwner(inodes map[string]bool) (int, string) {
	if len(inodes) == 0 {
		return 0, ""
	}
	for _, pid := range listPIDs() {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
			if err == nil && inodes[link] {
				cmd, _ := readCmdline(pid)
				return pid, strings.Join(cmd, " ")
			}
		}
	}
	return 0, ""
}

// serverIDOf is the EXTRACT_SERVER_ID in pid's initial environment: set on every process
// of a server some extract launched, whichever job or shard; "" for any other process.
func serverIDOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return ""
	}
	for _, e := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(e, []byte(serverIDEnv+"=")); ok {
			return string(v)
		}
	}
	return ""
}
