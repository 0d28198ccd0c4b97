package doctor

import (
	"context"
	"fmt"
	"strings"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/internal/errclass"
	"github.com/extract-dev/extract/sglang"
)

// checkReplicas checks what a job of several servers adds (server.replicas > 1): each
// replica's GPU set, named with whoever holds one of its GPUs, so the operator sees
// which replica a stranger blocks (checkGPUs judges the GPUs one by one), and each
// replica's port (checkPort judges replica 0's, server.port itself).
func (d *doctor) checkReplicas(context.Context) []Check {
	n := d.cfg.Server.Replicas
	if n <= 1 {
		return nil
	}
	var gpus sglang.GPUReport
	if d.usesGPUs() {
		gpus = d.opt.GPUs.Inspect(d.cfg.GPUIndices())
	}
	byIndex := map[int]sglang.GPU{}
	for _, g := range gpus.GPUs {
		byIndex[g.Index] = g
	}
	var checks []Check
	if gpus.Available && gpus.Count < n*d.cfg.Server.TPSize {
		checks = append(checks, failCheck("replicas", "lower server.replicas or server.tp_size to fit the node",
			"server.replicas %d × server.tp_size %d needs %d GPUs; NVML sees %d", n, d.cfg.Server.TPSize, n*d.cfg.Server.TPSize, gpus.Count))
	}
	for r := range n {
		checks = append(checks, d.checkReplica(r, byIndex, gpus.Available))
	}
	return checks
}

// checkReplica is one replica's line: its GPUs, port and staging dir (with what a crashed
// run left there, and the hook armed there), failing on a stranger on a GPU or the port.
func (d *doctor) checkReplica(r int, gpus map[int]sglang.GPU, nvml bool) Check {
	name := fmt.Sprintf("replica %d", r)
	var parts, problems, fixes []string
	if d.usesGPUs() {
		set := d.cfg.ReplicaGPUs(r)
		parts = append(parts, "GPUs "+joinGPUIndices(set))
		for _, i := range set {
			g, ok := gpus[i]
			if !nvml || !ok {
				continue
			}
			if !g.Present {
				problems = append(problems, fmt.Sprintf("gpu %d is missing", i))
				continue
			}
			for _, p := range g.Processes {
				if !d.server.Owns(p.PID) {
					problems = append(problems, fmt.Sprintf("gpu %d held by %s", i, p.Describe()))
					fixes = append(fixes, fmt.Sprintf("see check gpu %d", i))
				}
			}
		}
	}
	port := d.cfg.ReplicaPort(r)
	if r == 0 {
		parts = append(parts, fmt.Sprintf("port %d (see check port)", port))
	} else {
		use, err := sglang.ProbePort(d.cfg.Server.Host, port)
		ours := d.server.Replica(r)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("cannot listen on %s: %v", use.Addr, err))
		case !use.InUse:
			parts = append(parts, fmt.Sprintf("port %d free", port))
		case ours != nil && ours.Leader && ours.Port == port:
			parts = append(parts, fmt.Sprintf("port %d held by our replica (pid %d), which the run adopts or replaces", port, ours.PID))
		default:
			fix, who := d.portTaken(use, fmt.Sprintf("server.port (replica %d listens on server.port + %d)", r, r))
			problems = append(problems, fmt.Sprintf("port %d is taken by %s", port, who))
			fixes = append(fixes, fix)
		}
	}
	dir := d.cfg.StagingDir(r)
	staging := "staging " + dir
	if lo := d.leftovers(dir); lo.complete+lo.partial+lo.other > 0 {
		staging += " (" + lo.String() + ")"
	}
	for _, m := range sglang.LiveHookMarkers(dir) {
		staging += fmt.Sprintf("; hook %s armed in pid %d", m.HookVersion, m.PID)
	}
	parts = append(parts, staging)
	reason := strings.Join(parts, ", ")
	if len(problems) > 0 {
		return failCheck(name, strings.Join(fixes, "; "), "%s; %s", reason, strings.Join(problems, "; "))
	}
	return okCheck(name, "%s", reason)
}

// CheckReplicaFit refuses a job whose servers need more GPUs than NVML sees (exit 2, a
// config to fix): replicas·tp_size against the node. Without NVML it says nothing, and
// doctor's GPU check reports the missing driver; a listed server.gpus was already held
// to replicas·tp_size by the config's validation.
func CheckReplicaFit(cfg *configs.Config, insp *sglang.GPUInspector) error {
	if cfg.Server.Kind == sglang.KindSimulator {
		return nil // no GPUs; a transformers test backend fails doctor's own checks if absent
	}
	if insp == nil {
		insp = sglang.NewGPUInspector(nil)
	}
	rep := insp.Inspect(nil)
	need := cfg.Server.Replicas * cfg.Server.TPSize
	if !rep.Available || rep.Count >= need {
		return nil
	}
	return fmt.Errorf("%w: server.replicas %d × server.tp_size %d needs %d GPUs, but NVML sees %d on this node: lower server.replicas or server.tp_size", errclass.ErrRefused, cfg.Server.Replicas, cfg.Server.TPSize, need, rep.Count)
}
