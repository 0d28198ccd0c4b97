package orchestrator

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/extract-dev/extract/doctor"
	"github.com/extract-dev/extract/sglang"
)

// zombie starts a real process that exits at once and is not reaped: /proc shows it as
// a zombie, as a server that has just exited is while the driver still lists it. reap
// reaps it.
func zombie(t *testing.T) (pid int, reap func()) {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once atomic.Bool
	reap = func() {
		if once.CompareAndSwap(false, true) {
			_ = cmd.Wait()
		}
	}
	t.Cleanup(reap)
	for deadline := time.Now().Add(5 * time.Second); ; {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		if err == nil && strings.Contains(string(b[strings.LastIndexByte(string(b), ')'):]), " Z ") {
			return cmd.Process.Pid, reap
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not become a zombie: %s", cmd.Process.Pid, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gpu3ListsWhile is an H200 node whose GPU 3 lists pid (22 GiB) while listed() holds.
func gpu3ListsWhile(pid int, listed func() bool) *server.Server {
	node := h200Node(nil)
	dev := node.Devices[3].(*server.Device)
	dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		if listed() {
			return []nvml.ProcessInfo{{Pid: uint32(pid), UsedGpuMemory: 22 * gpuGiB}}, nvml.SUCCESS
		}
		return nil, nvml.SUCCESS
	}
	return node
}

// A server that has just exited stays in NVML's list for a moment: doctor (and a run's
// preflight) asks again rather than refuse the GPU for it (a run started right after
// another on the device was refused, exit 3).
func TestDoctorWaitsOutAGPUHolderThatHasJustExited(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSGLang, tokenLines(4, 10))
	pid, reap := zombie(t)
	var gone atomic.Bool
	go func() {
		time.Sleep(600 * time.Millisecond)
		reap() // its parent reaps it, and the driver lets go of its memory
		gone.Store(true)
	}()
	started := time.Now()
	rep := runDoctor(t, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(gpu3ListsWhile(pid, func() bool { return !gone.Load() })), GPUSettle: 5 * time.Second})
	wantCheck(t, rep, "gpu 3", doctor.CheckOK, "no processes")
	if d := time.Since(started); d < 600*time.Millisecond {
		t.Fatalf("doctor passed after %v, before the holder was gone", d)
	}
}

// One that stays (a zombie nobody reaps) fails the GPU after the wait, saying it has
// exited and how to have it reaped; a live foreign process fails it at once.
func TestDoctorFailsAGPUWhoseExitedHolderStaysAndALiveOneAtOnce(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSGLang, tokenLines(4, 10))
	pid, _ := zombie(t)
	started := time.Now()
	rep := runDoctor(t, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(gpu3ListsWhile(pid, func() bool { return true })), GPUSettle: 700 * time.Millisecond})
	c := wantCheck(t, rep, "gpu 3", doctor.CheckFail, fmt.Sprintf("pid %d (exited; the driver still lists it)", pid), "not our server")
	if want := fmt.Sprintf("its parent, pid %d, has not reaped it", os.Getpid()); !strings.Contains(c.Fix, want) {
		t.Errorf("fix %q does not say %q", c.Fix, want)
	}
	if strings.Contains(c.Reason, "PID namespace") {
		t.Errorf("an exited process described as another namespace's: %s", c.Reason)
	}
	if d := time.Since(started); d < 700*time.Millisecond {
		t.Fatalf("failed after %v, without waiting", d)
	}
	live := startSleep(t)
	started = time.Now()
	rep = runDoctor(t, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(gpu3ListsWhile(live, func() bool { return true })), GPUSettle: 5 * time.Second})
	wantCheck(t, rep, "gpu 3", doctor.CheckFail, fmt.Sprintf("pid %d (sleep 60)", live))
	if d := time.Since(started); d > 3*time.Second {
		t.Fatalf("a live holder failed the GPU only after %v: doctor waited for it", d)
	}
}

// Beside a live foreign process, waiting for an exited one cannot change the verdict:
// doctor does not wait; and a cancelled context ends a wait at once.
func TestDoctorWaitsOnlyWhereWaitingCanHelpAndNotPastItsContext(t *testing.T) {
	cfg := doctorConfig(t, sglang.KindSGLang, tokenLines(4, 10))
	pid, _ := zombie(t)
	live := startSleep(t)
	node := h200Node(nil)
	dev := node.Devices[3].(*server.Device)
	dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: uint32(pid), UsedGpuMemory: gpuGiB}, {Pid: uint32(live), UsedGpuMemory: gpuGiB}}, nvml.SUCCESS
	}
	started := time.Now()
	rep := runDoctor(t, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(node), GPUSettle: 5 * time.Second})
	wantCheck(t, rep, "gpu 3", doctor.CheckFail, fmt.Sprintf("pid %d (sleep 60)", live))
	if d := time.Since(started); d > 3*time.Second {
		t.Fatalf("doctor waited %v on an exited process beside a live one", d)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	started = time.Now()
	_, _ = Doctor(ctx, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(gpu3ListsWhile(pid, func() bool { return true })), GPUSettle: 5 * time.Second})
	if d := time.Since(started); d > 3*time.Second {
		t.Fatalf("doctor with a context of 300 ms took %v: the wait ignored it", d)
	}
}
