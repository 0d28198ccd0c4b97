package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/shm"
)

// stageDumps writes n dumps of tokens × hidden into dir (a tmpfs) and returns their paths.
func stageDumps(dir string, first, n, tokens, hidden int) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	paths := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			paths[i], errs[i] = writeDump(dir, first+i, tokens, hidden)
		}()
	}
	wg.Wait()
	return paths, errors.Join(errs...)
}

func run(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// settle removes dir and flushes everything, so that one measurement does not pay for
// the previous one's writeback.
func settle(dirs ...string) error {
	for _, d := range dirs {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	return run("sync")
}

// cpSync is the physical path: cp of the dumps into dst, then sync (none on a tmpfs,
// where there is nothing to write back and a sync would time other tenants' disks).
func cpSync(dumps []string, dst string, noSync bool) (time.Duration, error) {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return 0, err
	}
	if err := run("sync"); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := run("cp", append(append([]string{}, dumps...), dst)...); err != nil {
		return 0, err
	}
	if noSync {
		return time.Since(start), nil
	}
	if err := run("sync"); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// moveAll moves the dumps into out with the given number of concurrent movers: validate,
// stream, fsync, rename, fsync dir. With ix set, each move is committed to the index and
// the dump removed, which is the whole per-sample path of a run.
// moverFormat is the output layout the mover writes (mover -format; default safetensors).
var moverFormat string

func moveAll(dumps []string, out string, movers int, tokens, hidden int, ix *checkpoint.Index, sampleTokens tokenPlan) (time.Duration, int64, error) {
	l, err := checkpoint.ParseLayout(out, moverFormat)
	if err != nil {
		return 0, 0, err
	}
	m := &checkpoint.Mover{OutputDir: out, Layout: l}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return 0, 0, err
	}
	if err := run("sync"); err != nil {
		return 0, 0, err
	}
	var g errgroup.Group
	g.SetLimit(movers)
	var total atomic.Int64
	start := time.Now()
	for _, p := range dumps {
		g.Go(func() error {
			rid, ok := shm.ParseDumpName(filepath.Base(p))
			if !ok {
				return fmt.Errorf("%s is not a dump name", p)
			}
			t := tokens
			if sampleTokens != nil {
				t = sampleTokens(rid.Sample)
			}
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			moved, err := m.Move(context.Background(), src, p, checkpoint.Expect{
				Sample: rid.Sample, RID: rid.String(), InputIDs: sampleIDs(rid.Sample, t),
				DatasetFingerprint: "bench", HiddenSize: hidden, Layers: benchLayers,
			})
			_ = src.Close()
			if err != nil {
				return err
			}
			total.Add(moved.Bytes)
			if ix == nil {
				return nil
			}
			err = ix.CommitDone(checkpoint.Record{
				Sample: rid.Sample, State: checkpoint.StateDone, Attempt: rid.Attempt, RID: rid.String(),
				Bytes: moved.Bytes, CRC32C: moved.CRC32C, Tokens: moved.Tokens, Updated: time.Now().UTC(),
			})
			if err != nil {
				return err
			}
			return os.Remove(p)
		})
	}
	err = g.Wait()
	return time.Since(start), total.Load(), err
}

func mibps(bytes int64, d time.Duration) float64 { return float64(bytes) / (1 << 20) / d.Seconds() }

func best(ds []time.Duration) time.Duration {
	s := append([]time.Duration{}, ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[0]
}

func cmdMover(args []string) error {
	var c commonFlags
	fs := flag.NewFlagSet("mover", flag.ExitOnError)
	c.register(fs)
	n := fs.Int("dumps", 8, "dumps")
	tokens := fs.Int("tokens", 8192, "tokens per dump")
	hidden := fs.Int("hidden", 4096, "hidden size (4096 × 8192 tokens = 256 MiB per dump)")
	rounds := fs.Int("rounds", 2, "alternating rounds; the best of each side counts")
	fs.StringVar(&moverFormat, "format", "", "output format: safetensors (default), specforge, specforge+gzip, modelopt")
	tmpfs := fs.Bool("tmpfs", false, "output on the staging tmpfs too: the mover's own CPU cost against cp between the same tmpfs dirs, no disk in the way")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := c.check(false); err != nil {
		return err
	}
	stage := filepath.Join(c.shm, "mover")
	base := filepath.Join(c.out, "mover")
	cpName, prefix := "cp + sync", ""
	if *tmpfs {
		base, cpName, prefix = filepath.Join(c.shm, "mover-out"), "cp tmpfs → tmpfs", "tmpfs → tmpfs: "
	}
	if moverFormat != "" {
		prefix += moverFormat + " format: "
	}
	defer func() { logErr("os.RemoveAll(stage)", os.RemoveAll(stage)) }()
	defer func() { logErr("settle(base)", settle(base)) }()
	dumps, err := stageDumps(stage, 0, *n, *tokens, *hidden)
	if err != nil {
		return err
	}
	var size int64
	for _, p := range dumps {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		size += st.Size()
	}
	fmt.Printf("fig 1: %d dumps of %.0f MiB in %s → %s, %d rounds\n", *n, float64(size)/float64(*n)/(1<<20), stage, base, *rounds)
	var cpT, m1T, m4T []time.Duration
	var outBytes int64
	// Each round runs the three in a rotated order, so that none always pays for going
	// first (on this VM the first 2 GiB written after a pause is the slowest).
	methods := []struct {
		name string
		do   func() error
	}{
		{"cp+sync", func() error {
			d, err := cpSync(dumps, filepath.Join(base, "cp"), *tmpfs)
			cpT = append(cpT, d)
			return errors.Join(err, settle(filepath.Join(base, "cp")))
		}},
		{"mover×1", func() error {
			d, b, err := moveAll(dumps, filepath.Join(base, "m1"), 1, *tokens, *hidden, nil, nil)
			m1T, outBytes = append(m1T, d), b
			return errors.Join(err, settle(filepath.Join(base, "m1")))
		}},
		{"mover×4", func() error {
			d, _, err := moveAll(dumps, filepath.Join(base, "m4"), 4, *tokens, *hidden, nil, nil)
			m4T = append(m4T, d)
			return errors.Join(err, settle(filepath.Join(base, "m4")))
		}},
	}
	for r := range *rounds {
		var order []string
		for k := range methods {
			m := methods[(k+r)%len(methods)]
			if err := m.do(); err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			order = append(order, m.name)
		}
		fmt.Printf("  round %d (%s): %s %s, mover×1 %s, mover×4 %s\n", r+1, strings.Join(order, ", "), cpName, cpT[r].Round(time.Millisecond), m1T[r].Round(time.Millisecond), m4T[r].Round(time.Millisecond))
	}
	cp := mibps(size, best(cpT))
	base1 := fmt.Sprintf("%s %.0f MiB/s", cpName, cp)
	note := fmt.Sprintf("%d × %.0f MiB", *n, float64(size)/float64(*n)/(1<<20))
	for _, x := range []struct {
		name string
		ts   []time.Duration
	}{{"mover, 1 at a time", m1T}, {"mover, 4 concurrent", m4T}} {
		v := mibps(outBytes, best(x.ts))
		ratio := v / cp
		if err := emit(c.results, result{Fig: "1", Name: prefix + x.name, Value: v, Unit: "MiB/s", Baseline: base1, Ratio: ratio, Target: "≥ 0.9×", Met: met(ratio >= 0.9), Note: note}); err != nil {
			return err
		}
	}
	if *tmpfs {
		return emit(c.results, result{Fig: "1", Name: "tmpfs → tmpfs: cp (no disk: the copy's CPU cost)", Value: cp, Unit: "MiB/s", Note: note})
	}
	return emit(c.results, result{Fig: "1", Name: "cp + sync (physical path)", Value: cp, Unit: "MiB/s", Note: note})
}

// durableCopy is the least any crash-safe copier does per file: copy to a temp name,
// fsync, rename, fsync the directory. It is figure 2's physical baseline.
func durableCopy(dumps []string, dst string, workers int) (time.Duration, error) {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return 0, err
	}
	if err := run("sync"); err != nil {
		return 0, err
	}
	var g errgroup.Group
	g.SetLimit(workers)
	start := time.Now()
	for _, p := range dumps {
		g.Go(func() error { return copyDurable(p, filepath.Join(dst, filepath.Base(p))) })
	}
	err := g.Wait()
	return time.Since(start), err
}

func copyDurable(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(dst))
	if err != nil {
		return err
	}
	defer func() { logErr("d.Close()", d.Close()) }()
	return d.Sync()
}

func cmdSmall(args []string) error {
	var c commonFlags
	fs := flag.NewFlagSet("small", flag.ExitOnError)
	c.register(fs)
	n := fs.Int("n", 2000, "dumps")
	tokens := fs.Int("tokens", 32, "tokens per dump")
	hidden := fs.Int("hidden", 1024, "hidden size (1024 × 32 tokens = 256 KiB per dump)")
	movers := fs.Int("movers", 4, "concurrent movers (run.movers; its default is 8)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := c.check(false); err != nil {
		return err
	}
	stage := filepath.Join(c.shm, "small")
	base := filepath.Join(c.out, "small")
	defer func() { logErr("os.RemoveAll(stage)", os.RemoveAll(stage)) }()
	defer func() { logErr("settle(base)", settle(base)) }()
	dumps, err := stageDumps(stage, 0, *n, *tokens, *hidden)
	if err != nil {
		return err
	}
	st, err := os.Stat(dumps[0])
	if err != nil {
		return err
	}
	note := fmt.Sprintf("%d × %.0f KiB, %d movers", *n, float64(st.Size())/1024, *movers)
	fmt.Printf("fig 2: %s in %s → %s\n", note, stage, base)

	bulk, err := cpSync(dumps, filepath.Join(base, "cp"), false)
	if err != nil {
		return err
	}
	if err := settle(filepath.Join(base, "cp")); err != nil {
		return err
	}
	durable, err := durableCopy(dumps, filepath.Join(base, "durable"), *movers)
	if err != nil {
		return err
	}
	if err := settle(filepath.Join(base, "durable")); err != nil {
		return err
	}

	state := filepath.Join(base, "state")
	if err := os.MkdirAll(state, 0o755); err != nil {
		return err
	}
	ix, err := checkpoint.Open(filepath.Join(state, "index.db"), checkpoint.OpenOptions{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer func() { logErr("ix.Close()", ix.Close()) }()
	if err := ix.Init(checkpoint.Meta{DatasetFingerprint: "bench", DatasetPath: "bench", Total: *n}); err != nil {
		return err
	}
	full, _, err := moveAll(dumps, filepath.Join(base, "out"), *movers, *tokens, *hidden, ix, nil)
	if err != nil {
		return err
	}
	c2, err := ix.Counters()
	if err != nil {
		return err
	}
	if c2.Done != *n {
		return fmt.Errorf("index has %d done, want %d", c2.Done, *n)
	}
	rate := float64(*n) / full.Seconds()
	durRate := float64(*n) / durable.Seconds()
	bulkRate := float64(*n) / bulk.Seconds()
	fmt.Printf("  cp+sync %s, durable copy %s, full path %s\n", bulk.Round(time.Millisecond), durable.Round(time.Millisecond), full.Round(time.Millisecond))
	if err := emit(c.results, result{Fig: "2", Name: "small dumps: validate, move, fsync, index, delete", Value: rate, Unit: "samples/s",
		Baseline: fmt.Sprintf("durable copy %.0f/s", durRate), Ratio: rate / durRate, Target: "≥ 500/s", Met: met(rate >= 500), Note: note}); err != nil {
		return err
	}
	if err := emit(c.results, result{Fig: "2", Name: "durable copy: copy, fsync, rename, fsync dir (physical)", Value: durRate, Unit: "samples/s",
		Baseline: fmt.Sprintf("cp + sync %.0f/s", bulkRate), Ratio: durRate / bulkRate, Note: note}); err != nil {
		return err
	}
	return emit(c.results, result{Fig: "2", Name: "cp + sync, one sync for all (not crash-safe per file)", Value: bulkRate, Unit: "samples/s", Note: note})
}
