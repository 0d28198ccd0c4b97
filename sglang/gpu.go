package sglang

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// GPUReport is what NVML says about the node's GPUs and the ones a job wants.
type GPUReport struct {
	// Available is false when NVML could not be initialised; Reason then says why,
	// starting "NVML unavailable: ".
	Available bool
	Reason    string
	Driver    string
	// Count is the number of GPUs NVML sees.
	Count int
	// GPUs are the wanted GPUs, in the order asked for; Present is false for an index
	// at or beyond Count.
	GPUs []GPU
}

// GPU is one GPU by its NVML index.
//
// NVML numbers GPUs in PCI bus order; CUDA numbers them fastest first unless
// CUDA_DEVICE_ORDER=PCI_BUS_ID, which the launch sets with CUDA_VISIBLE_DEVICES, so
// server.gpus means the same GPUs to the server as to doctor.
type GPU struct {
	Index       int
	Present     bool
	Name        string
	UUID        string
	MemoryTotal uint64 // bytes
	MemoryUsed  uint64 // bytes
	// Utilization is the GPU's busy percentage over NVML's last sample period, -1
	// when NVML does not say.
	Utilization int
	Processes   []GPUProcess
	// Err is a query about this GPU that failed; what was read before it is kept.
	Err error
}

// GPUProcess is a process holding memory on a GPU.
type GPUProcess struct {
	PID int
	// UsedMemory is in bytes; MemoryKnown is false when NVML does not report it (it
	// may not, without privileges or under some virtualisation).
	UsedMemory  uint64
	MemoryKnown bool
	Type        string // "C" compute, "G" graphics, "C+G" both, as nvidia-smi shows them
	// Cmdline is from /proc; nil when /proc does not show the pid (another PID
	// namespace, or gone since NVML listed it).
	Cmdline []string
	// Unit is the systemd service the process runs in ("vllm.service"), "" for none;
	// UserUnit when it is a user unit.
	Unit     string
	UserUnit bool
	// DeviceConfirmed is true when /proc shows the pid holding a /dev/nvidia* file;
	// DeviceUnconfirmed when its open files are readable and none is: then the pid
	// that NVML gave is probably another PID namespace's (a container's), and the
	// process /proc shows under it is not the one on the GPU.
	DeviceConfirmed   bool
	DeviceUnconfirmed bool
	// Exited is true when /proc shows the pid as a zombie or dying: it has ended, and
	// NVML lists it until the driver has released its memory (seen for a few seconds
	// after a server stopped, when the next run's preflight came at once).
	Exited bool
	// Parent is an exited process's parent: the one that has not reaped it.
	Parent int
}

// GPUInspector reads GPU state through NVML. Tests pass a mock such as
// github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200.
type GPUInspector struct {
	lib nvml.Interface
}

// NewGPUInspector inspects GPUs through lib; nil means the system's NVML (nvml.New()),
// which is loaded only when Inspect runs.
func NewGPUInspector(lib nvml.Interface) *GPUInspector {
	if lib == nil {
		lib = nvml.New()
	}
	return &GPUInspector{lib: lib}
}

// Inspect reports on the GPUs with the given NVML indices. It never fails: a node
// without a driver gives a report with Available false, and a failed query about one
// GPU is that GPU's Err.
func (g *GPUInspector) Inspect(indices []int) GPUReport {
	var rep GPUReport
	if ret := g.lib.Init(); ret != nvml.SUCCESS {
		rep.Reason = "NVML unavailable: " + describeInitError(ret)
		return rep
	}
	defer func() { _ = g.lib.Shutdown() }()
	rep.Available = true
	if v, ret := g.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		rep.Driver = v
	}
	count, ret := g.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		rep.Available = false
		rep.Reason = "NVML unavailable: count GPUs: " + ret.Error()
		return rep
	}
	rep.Count = count
	for _, i := range indices {
		gpu := GPU{Index: i, Utilization: -1}
		if i >= 0 && i < count {
			gpu.Present = true
			g.inspectDevice(&gpu)
		}
		rep.GPUs = append(rep.GPUs, gpu)
	}
	return rep
}

func describeInitError(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "libnvidia-ml.so.1 not found (no NVIDIA driver on this machine)"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA kernel driver is not loaded"
	case nvml.ERROR_NO_PERMISSION:
		return "no permission to open the NVIDIA devices"
	}
	return ret.Error()
}

func (g *GPUInspector) inspectDevice(gpu *GPU) {
	dev, ret := g.lib.DeviceGetHandleByIndex(gpu.Index)
	if ret != nvml.SUCCESS {
		gpu.Err = fmt.Errorf("GPU %d: get handle: %s", gpu.Index, ret.Error())
		return
	}
	var errs []error
	fail := func(what string, ret nvml.Return) {
		errs = append(errs, fmt.Errorf("GPU %d: %s: %s", gpu.Index, what, ret.Error()))
	}
	if name, ret := dev.GetName(); ret == nvml.SUCCESS {
		gpu.Name = name
	} else {
		fail("name", ret)
	}
	if uuid, ret := dev.GetUUID(); ret == nvml.SUCCESS {
		gpu.UUID = uuid
	} else {
		fail("uuid", ret)
	}
	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		gpu.MemoryTotal, gpu.MemoryUsed = mem.Total, mem.Used
	} else {
		fail("memory", ret)
	}
	// Utilisation is informative only; some GPUs and vGPUs do not report it.
	if u, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		gpu.Utilization = int(u.Gpu)
	}
	byPID := map[int]*GPUProcess{}
	for _, list := range []struct {
		typ string
		get func() ([]nvml.ProcessInfo, nvml.Return)
	}{
		{"C", dev.GetComputeRunningProcesses},
		{"G", dev.GetGraphicsRunningProcesses},
	} {
		procs, ret := list.get()
		if ret == nvml.ERROR_NOT_SUPPORTED && list.typ == "G" {
			continue // data-centre GPUs may have no graphics engine to ask about
		}
		if ret != nvml.SUCCESS {
			fail("list processes ("+list.typ+")", ret)
			continue
		}
		for _, p := range procs {
			pid := int(p.Pid)
			gp := byPID[pid]
			if gp == nil {
				gp = &GPUProcess{PID: pid, Type: list.typ}
				byPID[pid] = gp
			} else if gp.Type != list.typ {
				gp.Type = "C+G"
			}
			// NVML_VALUE_NOT_AVAILABLE (all ones) stands for "unknown".
			if p.UsedGpuMemory != math.MaxUint64 && p.UsedGpuMemory > gp.UsedMemory {
				gp.UsedMemory, gp.MemoryKnown = p.UsedGpuMemory, true
			}
		}
	}
	for _, gp := range byPID {
		describeProcess(gp)
		gpu.Processes = append(gpu.Processes, *gp)
	}
	sort.Slice(gpu.Processes, func(a, b int) bool { return gpu.Processes[a].PID < gpu.Processes[b].PID })
	gpu.Err = errors.Join(errs...)
}

// describeProcess fills in what /proc says about a GPU process.
func describeProcess(gp *GPUProcess) {
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", gp.PID)); err != nil {
		return
	}
	// A leader whose threads still run shows Z as well: it still holds the GPU.
	if st, err := readStat(gp.PID); err == nil && st.dead() && st.threads <= 1 {
		// No command line, unit or open files are left to read: nothing to say but that.
		gp.Exited, gp.Parent = true, st.ppid
		return
	}
	gp.Cmdline, _ = ProcessCmdline(gp.PID)
	gp.Unit, gp.UserUnit = SystemdUnit(gp.PID)
	holds, known := holdsNVIDIADevice(gp.PID)
	gp.DeviceConfirmed = holds
	gp.DeviceUnconfirmed = known && !holds
}
