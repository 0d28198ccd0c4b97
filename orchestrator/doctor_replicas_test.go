package orchestrator

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/doctor"
	"github.com/extract-dev/extract/sglang"
)

// replicaConfig is doctorConfig's sglang job split into replicas servers of tp GPUs each,
// on ports that are free.
func replicaConfig(t *testing.T, replicas, tp int) *configs.Config {
	t.Helper()
	cfg := doctorConfig(t, sglang.KindSGLang, tokenLines(4, 10))
	cfg.Server.Replicas, cfg.Server.TPSize, cfg.Server.GPUs = replicas, tp, nil
	cfg.Server.Port = freePortRun(t, replicas)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// freePortRun finds n consecutive free ports and returns the first.
func freePortRun(t *testing.T, n int) int {
	t.Helper()
	for base := 21000 + os.Getpid()%5000; base < 32000; base += n {
		free := true
		for p := base; p < base+n && free; p++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				free = false
				continue
			}
			ln.Close()
		}
		if free {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

func TestDoctorWithTwoReplicasOfTP4ChecksBothGPUSetsAndNamesAForeignProcessOnGPU5(t *testing.T) {
	cfg := replicaConfig(t, 2, 4)
	pid := startSleep(t)
	node := h200Node(map[int][]nvml.ProcessInfo{5: {{Pid: uint32(pid), UsedGpuMemory: 40 * gpuGiB}}})

	rep := runDoctor(t, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(node)})

	if rep.OK {
		t.Fatalf("report OK with a foreign process on GPU 5:\n%s", reportJSON(rep))
	}
	wantCheck(t, rep, "gpu", doctor.CheckOK, "the job wants 0,1,2,3,4,5,6,7")
	for i := range 8 {
		if i != 5 {
			wantCheck(t, rep, fmt.Sprintf("gpu %d", i), doctor.CheckOK, "no processes")
		}
	}
	wantCheck(t, rep, "gpu 5", doctor.CheckFail, fmt.Sprintf("pid %d (sleep 60)", pid), "not our server")
	wantCheck(t, rep, "replica 0", doctor.CheckOK, "GPUs 0,1,2,3", fmt.Sprintf("port %d", cfg.Server.Port))
	wantCheck(t, rep, "replica 1", doctor.CheckFail, "GPUs 4,5,6,7", fmt.Sprintf("gpu 5 held by pid %d (sleep 60)", pid), fmt.Sprintf("port %d free", cfg.Server.Port+1))
	var failed []string
	for _, c := range rep.Failed() {
		failed = append(failed, c.Name)
	}
	if strings.Join(failed, ",") != "gpu 5,replica 1" {
		t.Errorf("failed checks %v; want gpu 5 and replica 1", failed)
	}
}

func TestDoctorNamesAStrangerOnASecondReplicasPort(t *testing.T) {
	cfg := replicaConfig(t, 3, 2)
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", cfg.Server.Port+2))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	// A dump a crashed run left in replica 1's staging dir is reported on its line.
	mustWriteFile(t, filepath.Join(cfg.ShmDir, "r1", "s000000002-a1.safetensors"), "dump")

	rep := runDoctor(t, cfg, doctor.Options{GPUs: sglang.NewGPUInspector(h200Node(nil))})

	wantCheck(t, rep, "port", doctor.CheckOK)
	wantCheck(t, rep, "replica 1", doctor.CheckOK, "GPUs 2,3", fmt.Sprintf("port %d free", cfg.Server.Port+1), "staging "+filepath.Join(cfg.ShmDir, "r1"), "1 complete dump(s)")
	wantCheck(t, rep, "replica 2", doctor.CheckFail, "GPUs 4,5", fmt.Sprintf("port %d is taken by pid %d", cfg.Server.Port+2, os.Getpid()))
}

func TestMoreReplicasTimesTPSizeThanTheNodeHasGPUsIsRefusedNamingTheNumbers(t *testing.T) {
	cfg := replicaConfig(t, 3, 4)
	node := sglang.NewGPUInspector(h200Node(nil))

	err := doctor.CheckReplicaFit(cfg, node)
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("checkReplicaFit = %v; want ErrRefused (exit 2)", err)
	}
	for _, want := range []string{"server.replicas 3", "server.tp_size 4", "needs 12 GPUs", "NVML sees 8"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	rep := runDoctor(t, cfg, doctor.Options{GPUs: node})
	wantCheck(t, rep, "replicas", doctor.CheckFail, "server.replicas 3 × server.tp_size 4 needs 12 GPUs; NVML sees 8")
	wantCheck(t, rep, "replica 2", doctor.CheckFail, "GPUs 8,9,10,11", "gpu 8 is missing")

	cfg.Server.Replicas = 2
	if err := doctor.CheckReplicaFit(cfg, node); err != nil {
		t.Errorf("2 × 4 on 8 GPUs refused: %v", err)
	}
}

func TestListedGPUsMustBeExactlyReplicasTimesTPSize(t *testing.T) {
	cfg := replicaConfig(t, 2, 4)
	cfg.Server.GPUs = []int{0, 1, 2, 3, 4, 5}
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "server.gpus: lists 6 GPUs but server.replicas 2 × server.tp_size 4 needs 8") {
		t.Fatalf("Validate = %v; want the numbers named", err)
	}
	cfg.Server.GPUs = []int{7, 6, 5, 4, 3, 2, 1, 0}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(cfg.ReplicaGPUs(0), cfg.ReplicaGPUs(1)); got != "[7 6 5 4] [3 2 1 0]" {
		t.Errorf("replica GPU sets %s; want [7 6 5 4] [3 2 1 0]", got)
	}
}
