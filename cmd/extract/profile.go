package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strings"
)

// profileEnv names a directory where this process writes CPU, block and mutex profiles
// (cpu-, block-, mutex-<command>-<pid>.pprof) and an execution trace (trace-….out, which
// `go tool trace -pprof=syscall` turns into where goroutines waited in syscalls, fsync
// included) when it exits: how docs/performance.md found the serial step of a run. The pid keeps apart the run and the simulator it
// launches, which inherits the variable.
const profileEnv = "EXTRACT_PROFILE_DIR"

// startProfiles starts the profiles profileEnv asks for and returns what writes them.
// A profile that cannot be written is reported, never a reason to fail the command.
func startProfiles(args []string) (stop func()) {
	dir := os.Getenv(profileEnv)
	if dir == "" {
		return func() {}
	}
	name := "extract"
	if len(args) > 1 && !strings.HasPrefix(args[1], "-") {
		name = args[1]
	}
	base := fmt.Sprintf("%s-%d", name, os.Getpid())
	warn := func(err error) { fmt.Fprintf(os.Stderr, "extract: %s: %v\n", profileEnv, err) }
	if err := os.MkdirAll(dir, 0o755); err != nil {
		warn(err)
		return func() {}
	}
	// Every blocking event and every contended lock is recorded: the profiles are for
	// finding a serial step, not for production.
	runtime.SetBlockProfileRate(1)
	runtime.SetMutexProfileFraction(1)
	cpu, err := os.Create(filepath.Join(dir, "cpu-"+base+".pprof"))
	if err != nil {
		warn(err)
	} else if err := pprof.StartCPUProfile(cpu); err != nil {
		warn(err)
		closeWarn(cpu, warn)
		cpu = nil
	}
	tr, err := os.Create(filepath.Join(dir, "trace-"+base+".out"))
	if err != nil {
		warn(err)
	} else if err := trace.Start(tr); err != nil {
		warn(err)
		closeWarn(tr, warn)
		tr = nil
	}
	return func() {
		if tr != nil {
			trace.Stop()
			closeWarn(tr, warn)
		}
		if cpu != nil {
			pprof.StopCPUProfile()
			closeWarn(cpu, warn)
		}
		for _, p := range []string{"block", "mutex"} {
			f, err := os.Create(filepath.Join(dir, p+"-"+base+".pprof"))
			if err != nil {
				warn(err)
				continue
			}
			if err := pprof.Lookup(p).WriteTo(f, 0); err != nil {
				warn(err)
			}
			closeWarn(f, warn)
		}
	}
}

// closeWarn closes a profile file: a close that fails may have lost the profile's end,
// which is worth a warning, not a failed command.
func closeWarn(f *os.File, warn func(error)) {
	if err := f.Close(); err != nil {
		warn(err)
	}
}
