package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/shm"
)

// withReplicas makes j a job of n simulator servers on n consecutive free ports; the
// servers of replicas 1.. are killed when the test ends, like replica 0's by newJob.
func (j *job) withReplicas(n int) {
	j.t.Helper()
	base := consecutiveFreePorts(j.t, n)
	j.env = append(j.env, "EXTRACT_SERVER_REPLICAS="+strconv.Itoa(n), "EXTRACT_SERVER_PORT="+strconv.Itoa(base))
	j.t.Cleanup(func() {
		for r := 1; r < n; r++ {
			stopRecordedServerFile(filepath.Join(j.state, fmt.Sprintf("server-%d.json", r)))
		}
	})
}

// consecutiveFreePorts finds n free ports in a row below the ephemeral range.
func consecutiveFreePorts(t *testing.T, n int) int {
	t.Helper()
	for range 1000 {
		base := freePort(t)
		ok := true
		for p := base + 1; p < base+n && ok; p++ {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				ok = false
				continue
			}
			ln.Close()
		}
		if ok && base+n <= 32000 {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

// stopRecordedServerFile kills the process group a server record names.
func stopRecordedServerFile(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var rec struct {
		PGID int `json:"pgid"`
	}
	if json.Unmarshal(b, &rec) == nil && rec.PGID > 1 {
		syscall.Kill(-rec.PGID, syscall.SIGKILL)
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && syscall.Kill(-rec.PGID, 0) == nil; {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// servers is status's servers list, one object per replica.
func servers(st map[string]any) []map[string]any {
	list, _ := st["servers"].([]any)
	out := make([]map[string]any, len(list))
	for i, s := range list {
		out[i], _ = s.(map[string]any)
	}
	return out
}

func allReady(n int) func(st map[string]any) bool {
	return func(st map[string]any) bool {
		ss := servers(st)
		if len(ss) != n {
			return false
		}
		for _, s := range ss {
			if s["state"] != "ready" {
				return false
			}
		}
		return true
	}
}

// requestsByPort counts the requests each server port received.
func (j *job) requestsByPort() map[string]int {
	by := map[string]int{}
	for _, l := range j.requestLines() {
		if len(l) < 2 {
			j.t.Fatalf("request log line %q names no port", strings.Join(l, " "))
		}
		by[l[1]]++
	}
	return by
}

func TestThreeSimulatorReplicasFinishExactAndEveryReplicaReceivesRequests(t *testing.T) {
	j := newJob(t, 120, 4000)
	j.withReplicas(3)
	start := time.Now()
	r := j.run("run")
	if r.code != 0 {
		t.Fatalf("run exit %d\n%s", r.code, r.stderr)
	}
	t.Logf("120 samples on 3 replicas in %s", time.Since(start).Round(time.Millisecond))
	j.requireExact()
	base := portOf(t, j)
	by := j.requestsByPort()
	for rep := range 3 {
		if by[strconv.Itoa(base+rep)] == 0 {
			t.Errorf("replica %d (port %d) received no request: %v", rep, base+rep, by)
		}
	}
	if n := len(j.requests()); n != 120 {
		t.Errorf("%d requests for 120 samples without a failure", n)
	}
	for rep, name := range []string{"server.log", "server-1.log", "server-2.log"} {
		if _, err := os.Stat(filepath.Join(j.state, "logs", name)); err != nil {
			t.Errorf("replica %d has no log of its own: %v", rep, err)
		}
	}
	for rep := range 3 {
		dir := filepath.Join(j.shmDir, fmt.Sprintf("r%d", rep))
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			t.Errorf("replica %d has no staging dir %s: %v", rep, dir, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(j.state, "server*.json")); len(left) > 0 {
		t.Errorf("server records left after the job finished: %v", left)
	}
}

// portOf is the job's server.port, the last one set in its env.
func portOf(t *testing.T, j *job) int {
	port := 0
	for _, kv := range j.env {
		if v, ok := strings.CutPrefix(kv, "EXTRACT_SERVER_PORT="); ok {
			port, _ = strconv.Atoi(v)
		}
	}
	if port == 0 {
		t.Fatal("no EXTRACT_SERVER_PORT in the job's env")
	}
	return port
}

func TestAReplicaKilledMidRunHasItsSamplesFinishedByTheOthersWhileItRestarts(t *testing.T) {
	j := newJob(t, 300, 2000)
	j.withReplicas(3)
	// A restart takes long enough (1 s backoff + 2 s start) to see the others work on.
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_STARTUP_DELAY=2s")
	_, wait := j.start("run")
	j.waitStatus("three ready replicas", allReady(3))
	st := j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 20 && num(servers(st)[1]["inflight"]) > 0 })
	victim := servers(st)[1]
	old, port := num(victim["pid"]), num(victim["port"])
	others := []int{num(servers(st)[0]["pid"]), num(servers(st)[2]["pid"])}
	if err := syscall.Kill(-old, syscall.SIGKILL); err != nil {
		t.Fatalf("kill replica 1's server group %d: %v", old, err)
	}
	doneAtKill := num(j.status()["done"])
	j.waitStatus("progress on the other replicas while replica 1 restarts", func(st map[string]any) bool {
		return servers(st)[1]["state"] != "ready" && num(st["done"]) >= doneAtKill+10
	})
	st = j.waitStatus("replica 1 restarted", func(st map[string]any) bool {
		s := servers(st)[1]
		return num(s["restarts"]) == 1 && num(s["pid"]) != old && s["state"] == "ready"
	})
	for i, r := range []int{0, 2} {
		if s := servers(st)[r]; num(s["pid"]) != others[i] || num(s["restarts"]) != 0 {
			t.Errorf("replica %d was disturbed by replica 1's death: %v (pid was %d)", r, s, others[i])
		}
	}
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d\n%s", code, stderr)
	}
	j.requireExact()
	// The samples replica 1 held when it died were sent again, to another replica.
	killedPort := strconv.Itoa(port)
	attemptsOn := map[int][]string{} // sample → ports in request order
	for _, l := range j.requestLines() {
		rid, err := shm.ParseRID(l[0])
		if err != nil {
			t.Fatalf("request log: %v", err)
		}
		attemptsOn[rid.Sample] = append(attemptsOn[rid.Sample], l[1])
	}
	moved := 0
	for _, ports := range attemptsOn {
		for i := 0; i+1 < len(ports); i++ {
			if ports[i] == killedPort && ports[i+1] != killedPort {
				moved++
				break
			}
		}
	}
	if moved == 0 {
		t.Errorf("no sample of the killed replica (port %s) was sent to another one: %v", killedPort, attemptsOn)
	}
}

func TestAKilledOrchestratorIsFollowedByARunThatAdoptsEveryLiveReplica(t *testing.T) {
	// Long enough that the resumed run is still live when its status is read, even under -race.
	j := newJob(t, 400, 1500)
	j.withReplicas(3)
	cmd, wait := j.start("run")
	j.waitStatus("three ready replicas", allReady(3))
	st := j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 5 })
	var pids []int
	for _, s := range servers(st) {
		pids = append(pids, num(s["pid"]))
	}
	cmd.Process.Signal(syscall.SIGKILL)
	wait()
	for r, pid := range pids {
		if !alive(pid) {
			t.Fatalf("replica %d's server pid %d died with the orchestrator", r, pid)
		}
	}
	_, wait = j.start("run", "--resume")
	st = j.waitStatus("the adopted replicas", allReady(3))
	for r, s := range servers(st) {
		if num(s["pid"]) != pids[r] || s["adopted"] != true || num(s["replica"]) != r {
			t.Errorf("resumed run's replica %d is %v; want pid %d adopted", r, s, pids[r])
		}
	}
	if s := server(st); num(s["pid"]) != pids[0] {
		t.Errorf("status server %v is not replica 0 (pid %d)", s, pids[0])
	}
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d\n%s", code, stderr)
	}
	for r, pid := range pids {
		if alive(pid) {
			t.Errorf("replica %d's server pid %d still running after the job completed", r, pid)
		}
	}
	j.requireExact()
}

func TestReplicasTimesTPSizeBeyondTheListedGPUsExitsTwoNamingTheNumbers(t *testing.T) {
	j := newJob(t, 4, 0)
	j.env = append(j.env, "EXTRACT_SERVER_KIND=sglang", "EXTRACT_SERVER_MODEL_PATH="+j.dir,
		"EXTRACT_SERVER_REPLICAS=3", "EXTRACT_SERVER_TP_SIZE=4", "EXTRACT_SERVER_GPUS=0,1,2,3,4,5,6,7")
	for _, cmd := range []string{"run", "doctor"} {
		r := j.run(cmd)
		if r.code != 2 || !strings.Contains(r.stderr, "lists 8 GPUs but server.replicas 3 × server.tp_size 4 needs 12") {
			t.Errorf("%s: exit %d, want 2 naming 8 GPUs and 3 × 4 = 12:\n%s", cmd, r.code, r.stderr)
		}
	}
	if _, err := os.Stat(j.state); err == nil {
		t.Errorf("a refused config left a state dir")
	}
}

// stagedDumpsEverywhere lists the complete dumps in the staging dir and every replica's.
func (j *job) stagedDumpsEverywhere() []shm.RID {
	rids := j.stagedDumps()
	subs, _ := filepath.Glob(filepath.Join(j.shmDir, "r*"))
	for _, dir := range subs {
		rids = append(rids, dumpsIn(dir)...)
	}
	return rids
}

func TestLeftoversOfThreeReplicasAreAdoptedByARunOfTwoThatStopsTheThirdServer(t *testing.T) {
	j := newJob(t, 200, 4000)
	j.withReplicas(3)
	cmd, wait := j.start("run")
	st := j.waitStatus("progress", func(st map[string]any) bool { return num(st["done"]) > 10 && allReady(3)(st) })
	third := num(servers(st)[2]["pid"])
	// Frozen, the orchestrator stops moving while the servers finish what they were sent.
	cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(1500 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGKILL)
	wait() // as after a real crash, the next run starts once the process is gone
	leftovers := j.stagedDumpsEverywhere()
	if len(leftovers) == 0 {
		t.Fatal("the killed run left no complete dump in staging: the test proves nothing")
	}
	before := len(j.requests())
	j.env = append(j.env, "EXTRACT_SERVER_REPLICAS=2")
	if r := j.run("run", "--resume"); r.code != 0 || !strings.Contains(r.stdout, "200") {
		t.Fatalf("resume exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, rid := range j.requests()[before:] {
		r, err := shm.ParseRID(rid)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range leftovers {
			if l.Sample == r.Sample {
				t.Errorf("sample %d was left complete in staging as %s, and requested again as %s", l.Sample, l, rid)
			}
		}
	}
	if alive(third) {
		t.Errorf("replica 2's server pid %d outlived a run of 2 replicas", third)
	}
	log := mustRead(t, filepath.Join(j.state, "logs", "extract.log"))
	// Each leftover is adopted, or, when the killed run had committed its sample and not
	// yet removed the dump (commit, then remove), dropped as a duplicate of a done one.
	for _, l := range leftovers {
		adopted, dropped := false, false
		for _, line := range strings.Split(log, "\n") {
			adopted = adopted || strings.Contains(line, `"msg":"adopting leftover dump"`) && strings.Contains(line, `"rid":"`+l.String()+`"`)
			dropped = dropped || strings.Contains(line, `"msg":"dump rejected"`) && strings.Contains(line, l.String()+".safetensors") && strings.Contains(line, `"reason":"duplicate"`)
		}
		if !adopted && !dropped {
			t.Errorf("leftover %s was neither adopted nor dropped as the dump of a done sample", l)
		}
	}
	j.requireExact()
}

func TestAStrangerOnASecondReplicasPortIsRefusedWithExitThreeAndNoServerIsLeft(t *testing.T) {
	j := newJob(t, 20, 0)
	j.withReplicas(3)
	port := portOf(t, j) + 1
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	r := j.run("run")
	if r.code != 3 || !strings.Contains(r.stderr, fmt.Sprintf("port %d is taken by pid %d", port, os.Getpid())) {
		t.Fatalf("run exit %d, want 3 naming port %d and its holder:\n%s", r.code, port, r.stderr)
	}
	if left, _ := filepath.Glob(filepath.Join(j.state, "server*.json")); len(left) > 0 {
		t.Errorf("servers recorded after a refused start: %v", left)
	}
	if n := len(j.requests()); n > 0 {
		t.Errorf("%d requests sent by a run refused at preflight", n)
	}
}

func TestHungReplicasAreKilledAndRestartedWhileTheJobFinishesExact(t *testing.T) {
	j := newJob(t, 120, 0)
	j.withReplicas(3)
	// Each simulator hangs after its 25th request: every replica hangs once or more.
	j.env = append(j.env,
		"EXTRACT_SERVER_SIMULATOR_HANG_AFTER=25",
		"EXTRACT_SERVER_HEALTH_INTERVAL=200ms",
		"EXTRACT_SERVER_HEALTH_TIMEOUT=300ms",
		"EXTRACT_SERVER_HEALTH_FAILURES=2",
		"EXTRACT_SERVER_MAX_RESTARTS=10",
	)
	r := j.run("run")
	if r.code != 0 {
		t.Fatalf("run exit %d\n%s", r.code, r.stderr)
	}
	hung := map[string]bool{}
	for _, line := range strings.Split(r.stderr, "\n") {
		if strings.Contains(line, `msg="server hung`) {
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "replica="); ok {
					hung[v] = true
				}
			}
		}
	}
	if len(hung) < 2 {
		t.Errorf("hangs detected on replicas %v, want at least 2 of 3:\n%s", hung, r.stderr)
	}
	j.requireExact()
}

// A dead replica's requests are abandoned with it: their window slots go to the live
// replicas at once, and the restarted server never gets the old rids again (their retries
// would have reached it and made dumps the run no longer wants).
func TestADeadReplicasRequestsFreeTheWindowAndAreNotRetried(t *testing.T) {
	const window = 8
	j := newJob(t, 200, 2000)
	j.withReplicas(2)
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_STARTUP_DELAY=2s", "EXTRACT_RUN_MAX_INFLIGHT=8")
	_, wait := j.start("run")
	j.waitStatus("two ready", allReady(2))
	st := j.waitStatus("replica 1 holding requests", func(st map[string]any) bool {
		return num(st["done"]) > 20 && num(servers(st)[1]["inflight"]) > 1
	})
	victim := servers(st)[1]
	port := strconv.Itoa(num(victim["port"]))
	sentBefore := len(j.requestLines())
	if err := syscall.Kill(-num(victim["pid"]), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d\n%s", code, stderr)
	}

	lines := j.requestLines()
	// Replica 0's requests between the kill and replica 1's first request after it.
	mostOpen, downSent := 0, 0
	for _, l := range lines[sentBefore:] {
		if l[1] == port {
			break
		}
		downSent++
		open, _ := strconv.Atoi(l[2])
		mostOpen = max(mostOpen, open)
	}
	if mostOpen < window {
		t.Errorf("while replica 1 restarted, replica 0 had at most %d requests open of a window of %d: the dead replica's requests still held the rest", mostOpen, window)
	}
	before := map[string]bool{}
	for _, l := range lines[:sentBefore] {
		before[l[0]] = true
	}
	resent := 0
	for _, l := range lines[sentBefore:] {
		if l[1] == port && before[l[0]] {
			resent++
		}
	}
	if resent > 0 {
		t.Errorf("the restarted replica received %d rids sent before the kill: abandoned requests were retried", resent)
	}
	t.Logf("replica 1 held %d when killed; %d requests to replica 0 while it was down, at most %d open", num(victim["inflight"]), downSent, mostOpen)
}
