package sglang

import (
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

const gpuGiB = 1 << 30

// h200Node is go-nvml's mock of an 8×H200 node where holders[i] hold GPU i. The mock
// leaves the process and utilisation queries unset (calling them panics), so every
// device gets them here.
func h200Node(holders map[int][]nvml.ProcessInfo) *server.Server {
	node := dgxh200.New()
	for i, d := range node.Devices {
		dev := d.(*server.Device)
		procs := holders[i]
		var used uint64
		for _, p := range procs {
			used += p.UsedGpuMemory
		}
		dev.MemoryInfo.Used, dev.MemoryInfo.Free = used, dev.MemoryInfo.Total-used
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS }
		dev.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 0}, nvml.SUCCESS }
	}
	return node
}

// startChild starts a real process (so /proc has its command line) and stops it when
// the test ends.
func startHolder(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd.Process.Pid
}

func TestInspectNamesEveryProcessOnTheWantedGPUsOfAnH200Node(t *testing.T) {
	pid := startHolder(t, exec.Command("sleep", "60"))
	node := h200Node(map[int][]nvml.ProcessInfo{3: {{Pid: uint32(pid), UsedGpuMemory: 75 * gpuGiB}}})

	rep := NewGPUInspector(node).Inspect([]int{0, 1, 2, 3, 4, 5, 6, 7})

	if !rep.Available || rep.Count != 8 || rep.Driver != "550.54.15" || len(rep.GPUs) != 8 {
		t.Fatalf("report = available %v, count %d, driver %q, %d GPUs; want an 8-GPU node", rep.Available, rep.Count, rep.Driver, len(rep.GPUs))
	}
	for _, g := range rep.GPUs {
		if g.Err != nil || !g.Present || !strings.Contains(g.Name, "H200") || g.MemoryTotal != 144384<<20 || g.Utilization != 0 {
			t.Errorf("GPU %d = %+v", g.Index, g)
		}
		if g.Index != 3 && len(g.Processes) != 0 {
			t.Errorf("GPU %d lists processes %+v; only GPU 3 is held", g.Index, g.Processes)
		}
	}
	g3 := rep.GPUs[3]
	if g3.MemoryUsed != 75*gpuGiB || len(g3.Processes) != 1 {
		t.Fatalf("GPU 3 = %+v; want 75 GiB used by one process", g3)
	}
	p := g3.Processes[0]
	if p.PID != pid || p.Type != "C" || !p.MemoryKnown || p.UsedMemory != 75*gpuGiB || !slices.Equal(p.Cmdline, []string{"sleep", "60"}) {
		t.Errorf("process = %+v; want pid %d, compute, 75 GiB, cmdline sleep 60", p, pid)
	}
	// sleep holds no /dev/nvidia* file: /proc proves NVML's pid is not a CUDA process here.
	if p.DeviceConfirmed || !p.DeviceUnconfirmed {
		t.Errorf("device confirmed %v, unconfirmed %v; want unconfirmed for sleep", p.DeviceConfirmed, p.DeviceUnconfirmed)
	}
}

func TestInspectMergesComputeAndGraphicsAndKeepsUnknownMemoryUnknown(t *testing.T) {
	pid := startHolder(t, exec.Command("sleep", "60"))
	node := h200Node(nil)
	dev := node.Devices[0].(*server.Device)
	dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: uint32(pid), UsedGpuMemory: ^uint64(0)}}, nvml.SUCCESS
	}
	dev.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: uint32(pid), UsedGpuMemory: ^uint64(0)}, {Pid: 1 << 30}}, nvml.SUCCESS
	}

	rep := NewGPUInspector(node).Inspect([]int{0})

	procs := rep.GPUs[0].Processes
	if len(procs) != 2 || procs[0].PID != pid || procs[0].Type != "C+G" || procs[0].MemoryKnown {
		t.Fatalf("processes = %+v; want pid %d as C+G with unknown memory, then the invisible pid", procs, pid)
	}
	if p := procs[1]; p.Cmdline != nil || p.DeviceConfirmed || p.DeviceUnconfirmed || p.Type != "G" {
		t.Errorf("a pid /proc does not show = %+v; want no command line and nothing confirmed", p)
	}
}

func TestInspectMarksWantedIndicesBeyondTheNodeAbsent(t *testing.T) {
	rep := NewGPUInspector(h200Node(nil)).Inspect([]int{7, 8})
	if len(rep.GPUs) != 2 || !rep.GPUs[0].Present || rep.GPUs[1].Present || rep.GPUs[1].Index != 8 {
		t.Fatalf("GPUs = %+v; want 7 present and 8 absent", rep.GPUs)
	}
}

func TestInspectKeepsWhatItReadWhenOneQueryFails(t *testing.T) {
	node := h200Node(nil)
	node.Devices[2].(*server.Device).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return nil, nvml.ERROR_NO_PERMISSION
	}
	rep := NewGPUInspector(node).Inspect([]int{2})
	g := rep.GPUs[0]
	if g.Err == nil || !strings.Contains(g.Err.Error(), "GPU 2: list processes (C)") || g.Name == "" || g.MemoryTotal == 0 {
		t.Fatalf("GPU = %+v; want its name and memory, and an error naming the failed query", g)
	}
}

func TestInspectWithoutNVMLSaysWhyAndNeverPanics(t *testing.T) {
	for _, tc := range []struct {
		name string
		lib  nvml.Interface
		want string
	}{
		{"driver not loaded", func() nvml.Interface {
			node := h200Node(nil)
			node.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
			return node
		}(), "NVML unavailable: the NVIDIA kernel driver is not loaded"},
		// The real binding on this machine: without a driver, dlopen fails in Init.
		{"this machine", nil, "NVML unavailable: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := NewGPUInspector(tc.lib).Inspect([]int{0})
			if tc.lib == nil && rep.Available {
				t.Skipf("this machine has an NVIDIA driver (%s)", rep.Driver)
			}
			if rep.Available || !strings.HasPrefix(rep.Reason, tc.want) || len(rep.GPUs) != 0 {
				t.Fatalf("report = %+v; want unavailable, reason starting %q", rep, tc.want)
			}
			t.Log(rep.Reason)
		})
	}
}

func TestUnitFromCgroupNamesTheServiceOnly(t *testing.T) {
	for _, tc := range []struct {
		name, cgroup, unit string
		user               bool
	}{
		{"cgroup v2 system service", "0::/system.slice/vllm.service\n", "vllm.service", false},
		{"cgroup v1 systemd hierarchy", "12:memory:/system.slice/other.service\n1:name=systemd:/system.slice/vllm.service\n0::/\n", "vllm.service", false},
		{"user service", "0::/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service\n", "jupyter.service", true},
		{"user manager itself", "0::/user.slice/user-1000.slice/user@1000.service/init.scope\n", "", false},
		{"login session", "0::/user.slice/user-1000.slice/session-4.scope\n", "", false},
		{"docker container", "0::/system.slice/docker-0123abcd.scope\n", "", false},
		{"container root", "0::/\n", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unit, user := unitFromCgroup(tc.cgroup)
			if unit != tc.unit || user != tc.user {
				t.Errorf("unitFromCgroup(%q) = %q, %v; want %q, %v", tc.cgroup, unit, user, tc.unit, tc.user)
			}
		})
	}
}

func TestServerIdentityOwnsItsGroupAndWorkersThatCarryItsID(t *testing.T) {
	const serverID = "0123456789abcdef"
	dir := t.TempDir()
	// A leader in its own group with a worker, as SGLang's server and its TP schedulers.
	leader := exec.Command("sh", "-c", "sleep 60 & wait")
	leader.Env = append(os.Environ(), serverIDEnv+"="+serverID)
	leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	leaderPID := startHolder(t, leader)
	var worker int
	waitFor(t, 5*time.Second, "the worker starts", func() bool {
		for _, pid := range groupMembers(leaderPID) {
			if pid != leaderPID {
				worker = pid
				return true
			}
		}
		return false
	})
	t.Cleanup(func() { syscall.Kill(worker, syscall.SIGKILL) })
	stranger := startHolder(t, exec.Command("sleep", "60"))
	impostor := exec.Command("sleep", "60")
	impostor.Env = append(os.Environ(), serverIDEnv+"=another-server")
	impostorPID := startHolder(t, impostor)

	st, err := readStat(leaderPID)
	if err != nil {
		t.Fatal(err)
	}
	boot, err := bootID()
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{StateDir: dir}
	write := func(rec record) {
		t.Helper()
		if err := m.writeRecord(&rec); err != nil {
			t.Fatal(err)
		}
	}
	rec := record{PID: leaderPID, PGID: leaderPID, StartTime: st.startTime, BootID: boot, ServerID: serverID}
	write(rec)
	load := func() *ServerIdentity {
		t.Helper()
		id, err := LoadServerIdentity(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	owns := func(id *ServerIdentity, want map[int]bool) {
		t.Helper()
		for pid, w := range want {
			if got := id.Owns(pid); got != w {
				t.Errorf("Owns(%d) = %v, want %v (leader %d, worker %d, stranger %d, impostor %d)", pid, got, w, leaderPID, worker, stranger, impostorPID)
			}
		}
	}

	id := load()
	if id == nil || !id.Leader {
		t.Fatalf("identity = %+v; want the live leader recognised", id)
	}
	owns(id, map[int]bool{leaderPID: true, worker: true, stranger: false, impostorPID: false, os.Getpid(): false})

	// A record from another boot describes no live process, whatever the pids say.
	write(record{PID: leaderPID, PGID: leaderPID, StartTime: st.startTime, BootID: "another-boot", ServerID: serverID})
	owns(load(), map[int]bool{leaderPID: false, worker: false})

	// The leader dies; its worker keeps the GPU and is still ours by its environment.
	write(rec)
	syscall.Kill(leaderPID, syscall.SIGKILL)
	leader.Wait()
	id = load()
	if id.Leader {
		t.Fatal("a dead leader is still recognised")
	}
	owns(id, map[int]bool{worker: true, stranger: false})

	// No record: nothing is ours.
	os.Remove(m.recordPath())
	if id := load(); id != nil || id.Owns(worker) {
		t.Errorf("without a record: identity %+v owns the worker", id)
	}
}

func TestHookFilesShipTheVersionThePythonSideWrites(t *testing.T) {
	for _, name := range []string{"sitecustomize.py", "extract_hook/__init__.py", "extract_hook/seams.py", "extract_hook/capture.py", "extract_hook/writer.py"} {
		if _, err := fs.Stat(HookFS(), name); err != nil {
			t.Errorf("HookFS lacks %s: %v", name, err)
		}
	}
	if _, err := fs.Stat(HookFS(), "test_writer.py"); err == nil {
		t.Error("HookFS ships the hook's tests")
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not on PATH")
	}
	cmd := exec.Command(python, "-c", "import extract_hook; print(extract_hook.HOOK_VERSION)")
	cmd.Dir, cmd.Env = "hook", hookTestEnv()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("read HOOK_VERSION with python: %v", err)
	}
	if got, want := HookVersion(), strings.TrimSpace(string(out)); got != want || got == "" {
		t.Errorf("HookVersion() = %q; the hook says %q", got, want)
	}
}

// A process whose main thread has exited while its other threads run shows state Z in
// /proc/<pid>/stat, as an exited one does, but still holds what it opened: doctor must
// not wait it out as exited. The other kind is a real zombie: a child never reaped.
func TestAGroupLeaderThatExitedBeforeItsThreadsIsNotTakenForExited(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3: the test makes a leader exit before its thread with it")
	}
	leader := startHolder(t, exec.Command(py, "-c",
		"import ctypes, threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); ctypes.CDLL(None).pthread_exit(None)"))
	waitFor(t, 10*time.Second, "the leader's main thread exits", func() bool {
		st, err := readStat(leader)
		return err == nil && st.dead()
	})
	gp := GPUProcess{PID: leader}
	describeProcess(&gp)
	if gp.Exited {
		t.Fatalf("pid %d with a live thread described as exited", leader)
	}
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	defer zombie.Wait()
	waitFor(t, 10*time.Second, "the child exits unreaped", func() bool {
		st, err := readStat(zombie.Process.Pid)
		return err == nil && st.dead()
	})
	gz := GPUProcess{PID: zombie.Process.Pid}
	describeProcess(&gz)
	if !gz.Exited || gz.Parent != os.Getpid() {
		t.Fatalf("an unreaped child described as %+v", gz)
	}
}
