package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/testsupport"
)

// slurmCluster is a one-node Slurm cluster on this machine: munged (reused when one
// already answers), slurmctld and slurmd, with their config, state and spool in temp
// dirs. Daemons run in the foreground as children of the test, so t.Cleanup stops
// exactly them.
type slurmCluster struct {
	t    *testing.T
	dir  string
	conf string
	node string
}

// startSlurm starts the cluster or skips the test saying why it cannot.
func startSlurm(t *testing.T) *slurmCluster {
	t.Helper()
	testsupport.Require(t, testsupport.Slurm) // root, slurm-wlm and munge
	host, err := os.Hostname()
	if err != nil {
		testsupport.Unavailable(t, testsupport.Slurm, "no hostname: %v", err)
	}
	node, _, _ := strings.Cut(host, ".")
	s := &slurmCluster{t: t, dir: t.TempDir(), node: node}
	if !mungeWorks() {
		s.startMunged()
	}
	for _, d := range []string{"state", "spool"} {
		if err := os.MkdirAll(filepath.Join(s.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s.conf = filepath.Join(s.dir, "slurm.conf")
	conf := fmt.Sprintf(`ClusterName=extracttest
SlurmctldHost=%[1]s
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation=%[2]s/state
SlurmdSpoolDir=%[2]s/spool
SlurmctldPidFile=%[2]s/slurmctld.pid
SlurmdPidFile=%[2]s/slurmd.pid
SlurmctldPort=%[3]d
SlurmdPort=%[4]d
SlurmctldLogFile=%[2]s/slurmctld.log
SlurmdLogFile=%[2]s/slurmd.log
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SchedulerParameters=sched_interval=1
KillWait=5
NodeName=%[1]s CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=%[1]s Default=YES MaxTime=INFINITE State=UP
`, node, s.dir, freePort(t), freePort(t))
	if err := os.WriteFile(s.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// -c: a clean controller state, no jobs of an earlier run.
	s.daemon("slurmctld", "-D", "-c", "-f", s.conf)
	s.daemon("slurmd", "-D", "-f", s.conf)
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := s.cmd("sinfo", "-h", "-N", "-o", "%t").Output()
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(out)), "idle") {
			return s
		}
		if time.Now().After(deadline) {
			ctld, _ := os.ReadFile(filepath.Join(s.dir, "slurmctld.log"))
			d, _ := os.ReadFile(filepath.Join(s.dir, "slurmd.log"))
			testsupport.Unavailable(t, testsupport.Slurm, "the node did not come up idle in 20s (sinfo %q, %v)\nslurmctld.log:\n%s\nslurmd.log:\n%s", out, err, tail(ctld), tail(d))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// mungeWorks says whether a munged answers on the default socket.
func mungeWorks() bool {
	enc, err := exec.Command("munge", "-n").Output()
	if err != nil {
		return false
	}
	dec := exec.Command("unmunge")
	dec.Stdin = bytes.NewReader(enc)
	return dec.Run() == nil
}

// startMunged runs munged as the munge user, creating its key and socket dir when
// missing (a fresh machine where the package's service was never started).
func (s *slurmCluster) startMunged() {
	t := s.t
	u, err := user.Lookup("munge")
	if err != nil {
		testsupport.Unavailable(t, testsupport.Slurm, "no munge user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	key := "/etc/munge/munge.key"
	if _, err := os.Stat(key); os.IsNotExist(err) {
		if err := os.MkdirAll("/etc/munge", 0o700); err != nil {
			testsupport.Unavailable(t, testsupport.Slurm, "%v", err)
		}
		b := make([]byte, 1024)
		if f, err := os.Open("/dev/urandom"); err == nil {
			f.Read(b)
			f.Close()
		}
		if err := os.WriteFile(key, b, 0o400); err != nil {
			testsupport.Unavailable(t, testsupport.Slurm, "write %s: %v", key, err)
		}
		os.Chown("/etc/munge", uid, gid)
		os.Chown(key, uid, gid)
	}
	for _, d := range []string{"/run/munge", "/var/lib/munge", "/var/log/munge"} {
		os.MkdirAll(d, 0o755)
		os.Chown(d, uid, gid)
	}
	cmd := exec.Command(sbin("munged"), "-F")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, Setpgid: true}
	log, _ := os.Create(filepath.Join(s.dir, "munged.log"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		testsupport.Unavailable(t, testsupport.Slurm, "start munged: %v", err)
	}
	t.Cleanup(func() { stopDaemon(cmd) })
	for range 50 {
		if mungeWorks() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := os.ReadFile(filepath.Join(s.dir, "munged.log"))
	testsupport.Unavailable(t, testsupport.Slurm, "munged did not answer in 5s:\n%s", b)
}

func sbin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return "/usr/sbin/" + name
}

// daemon starts a Slurm daemon in the foreground, stopped at cleanup.
func (s *slurmCluster) daemon(name string, args ...string) {
	cmd := exec.Command(sbin(name), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	log, _ := os.Create(filepath.Join(s.dir, name+".out"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		testsupport.Unavailable(s.t, testsupport.Slurm, "start %s: %v", name, err)
	}
	s.t.Cleanup(func() { stopDaemon(cmd) })
}

// stopDaemon ends one daemon we started: SIGTERM, then SIGKILL after 5s.
func stopDaemon(cmd *exec.Cmd) {
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// cmd is a Slurm client command against this cluster.
func (s *slurmCluster) cmd(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+s.conf)
	return cmd
}

// tasks lists the array's tasks still known to squeue, as "<array id>_<task>" → state.
func (s *slurmCluster) tasks() map[string]string {
	out, err := s.cmd("squeue", "-h", "-r", "-o", "%i %T").Output()
	if err != nil {
		s.t.Fatalf("squeue: %v", err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if id, st, ok := strings.Cut(line, " "); ok {
			m[id] = st
		}
	}
	return m
}

func (s *slurmCluster) waitEmpty(ctx context.Context) {
	for len(s.tasks()) > 0 {
		if ctx.Err() != nil {
			b, _ := os.ReadFile(filepath.Join(s.dir, "slurmctld.log"))
			s.t.Fatalf("the array did not finish in time: %v\n%s", s.tasks(), tail(b))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// arraySubmitter submits scripts/slurm/extract-array.sh as an array of n shards of j,
// returning the job id. The tasks run the test's binary from PATH, the way a cluster's
// module would put extract there; two share the node at a time, each with its own
// simulator port.
func (s *slurmCluster) arraySubmitter(j *job, n int, env ...string) func(array string, extra ...string) string {
	t := s.t
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "slurm", "extract-array.sh")
	env = append(append(append([]string{}, j.env...),
		"PATH="+filepath.Dir(extractBin)+":"+os.Getenv("PATH"),
		"EXTRACT_CONFIG="+j.config,
		"SHARD_PORT_BASE="+strconv.Itoa(freePort(t)-n),
		"SLURM_CONF="+s.conf,
	), env...)
	return func(array string, extra ...string) string {
		t.Helper()
		cmd := exec.Command("sbatch", append([]string{"--parsable", "--array=" + array, "--output=" + filepath.Join(j.dir, "slurm-%A_%a.out")}, append(extra, script)...)...)
		cmd.Env, cmd.Dir = env, j.dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("sbatch --array=%s: %v\n%s", array, err, out)
		}
		id, _, _ := strings.Cut(strings.TrimSpace(string(out)), ";")
		return id
	}
}

func TestASlurmArrayOfFourShardsSurvivesAScancelAndAResubmissionAndAddsUpExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Slurm daemons")
	}
	s := startSlurm(t)
	const n = 4
	j := newJob(t, 80, 1500)
	t.Cleanup(func() { j.stopShardServers(n) })
	sbatch := s.arraySubmitter(j, n)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	jobID := sbatch("0-3")

	// Cancel the first task seen running once its shard has committed samples: mid-run.
	victim, victimShard := "", -1
	for victim == "" {
		if ctx.Err() != nil {
			t.Fatalf("no task got under way: %v", s.tasks())
		}
		for id, st := range s.tasks() {
			i, err := strconv.Atoi(strings.TrimPrefix(id, jobID+"_"))
			if st != "RUNNING" || err != nil {
				continue
			}
			r := j.run("status", "--shard", fmt.Sprintf("%d/%d", i, n), "--json")
			var st struct {
				State string `json:"state"`
				Done  int    `json:"done"`
				Total int    `json:"total"`
			}
			if json.Unmarshal([]byte(r.stdout), &st) == nil && st.State == "running" && st.Done > 0 && st.Done < st.Total {
				victim, victimShard = id, i
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, err := s.cmd("scancel", victim).CombinedOutput(); err != nil {
		t.Fatalf("scancel %s: %v\n%s", victim, err, out)
	}
	t.Logf("cancelled %s (shard %d/%d) mid-run", victim, victimShard, n)
	s.waitEmpty(ctx)

	js := j.statusAll()
	if js.State == "complete" || len(js.Dead) != 1 || js.Dead[0] != victimShard {
		t.Fatalf("after the scancel, status --all = %+v; want shard %d dead and the job incomplete", js, victimShard)
	}
	// The resubmitted task is an array of one: it must be told the count.
	sbatch(strconv.Itoa(victimShard), "--export=ALL,EXTRACT_SHARD_COUNT="+strconv.Itoa(n))
	s.waitEmpty(ctx)

	js = j.statusAll()
	if js.State != "complete" || js.Done != len(j.samples) || js.Total != len(j.samples) || len(js.Dead) != 0 {
		logs, _ := filepath.Glob(filepath.Join(j.dir, "slurm-*.out"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			t.Logf("%s:\n%s", filepath.Base(l), tail(b))
		}
		t.Fatalf("after the resubmission, status --all = %+v; want all %d samples done", js, len(j.samples))
	}
	if r := j.run("verify", "--all"); r.code != 0 {
		t.Fatalf("verify --all: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	j.stopShardServers(n)
	j.cleanShardStaging(n)
	if lost, corrupt, extra := j.check(); lost+corrupt+extra > 0 {
		t.Fatalf("lost %d, corrupt %d, extra %d", lost, corrupt, extra)
	}
}
