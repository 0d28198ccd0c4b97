package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

func cmdRSS(args []string) error {
	var c commonFlags
	fs := flag.NewFlagSet("rss", flag.ExitOnError)
	c.register(fs)
	n := fs.Int("n", 8, "samples")
	tokens := fs.Int("tokens", 8192, "tokens per sample")
	hidden := fs.Int("hidden", 4096, "hidden size (4096 × 8192 tokens = 256 MiB per dump)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := c.check(true); err != nil {
		return err
	}
	dir := filepath.Join(c.out, "rss")
	stage := filepath.Join(c.shm, "rss")
	defer func() { logErr("os.RemoveAll(stage)", os.RemoveAll(stage)) }()
	defer func() { logErr("settle(dir)", settle(dir)) }()
	ds := filepath.Join(dir, "dataset.jsonl")
	if _, _, err := writeDataset(ds, *n, fixedTokens(*tokens)); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	cfg := filepath.Join(dir, "job.yaml")
	out := filepath.Join(dir, "out")
	if err := (jobConfig{Dataset: ds, OutputDir: out, ShmDir: stage, Port: port, Hidden: *hidden, MaxInflight: 32, Movers: 4}).write(cfg); err != nil {
		return err
	}
	bytes := dumpBytes(*tokens, *hidden) * int64(*n)
	note := fmt.Sprintf("%d dumps × %.0f MiB, 4 movers", *n, float64(dumpBytes(*tokens, *hidden))/(1<<20))
	fmt.Printf("fig 6: %s\n", note)
	job, err := runJob(c.extract, jobOpts{config: cfg, stateDir: filepath.Join(out, ".extract"), watchRSS: true, timeout: 4 * time.Minute})
	if err != nil {
		return err
	}
	fmt.Printf("  peak RSS %.1f MiB; %s", float64(job.peakRSS)/(1<<20), job.stdout)
	mb := float64(job.peakRSS) / 1e6
	if err := emit(c.results, result{Fig: "6", Name: "peak RSS (VmHWM) of `extract run` moving 2 GiB of dumps", Value: mb, Unit: "MB",
		Target: "< 150 MB", Met: met(mb < 150), Note: note}); err != nil {
		return err
	}
	return emit(c.results, result{Fig: "6", Name: "  the same job's throughput, first request → exit", Value: float64(bytes) / (1 << 20) / job.work.Seconds(), Unit: "MiB/s", Note: note})
}
