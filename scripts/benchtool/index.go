package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/shm"
)

// datasetFacts are what extract records about a dataset: its sha256 and line count.
func datasetFacts(path string) (fp string, lines int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer func() { logErr("f.Close()", f.Close()) }()
	h := sha256.New()
	r := bufio.NewReaderSize(io.TeeReader(f, h), 4<<20)
	buf := make([]byte, 4<<20)
	last := byte('\n')
	for {
		n, err := r.Read(buf)
		lines += bytes.Count(buf[:n], []byte{'\n'})
		if n > 0 {
			last = buf[n-1]
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", 0, err
		}
	}
	if last != '\n' {
		lines++
	}
	return hex.EncodeToString(h.Sum(nil)), lines, nil
}

// synthIndex initialises the index of cfg's job as `extract run` would and marks samples
// 0..done-1 done, through the exported API: CommitDone from many goroutines, which
// bbolt's Batch groups into transactions of up to a thousand records.
//
// run's preflight stats the output files of up to 200 done samples, spread evenly over
// them, against their recorded sizes, so done samples need (sparse) files: all of them
// when allFiles is set, else just the 200 the preflight looks at. Creating a million
// files takes from 15 s to 3 min on a shared VM disk, and nothing before the first
// request touches any other file.
func synthIndex(cfg *configs.Config, done int, tokens tokenPlan, bytesPerToken int64, allFiles bool) (time.Duration, error) {
	start := time.Now()
	fp, total, err := datasetFacts(cfg.Dataset)
	if err != nil {
		return 0, err
	}
	if done > total {
		return 0, fmt.Errorf("done %d > %d samples in %s", done, total, cfg.Dataset)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return 0, err
	}
	ix, err := checkpoint.Open(filepath.Join(cfg.StateDir, "index.db"), checkpoint.OpenOptions{Timeout: 5 * time.Second})
	if err != nil {
		return 0, err
	}
	defer func() { logErr("ix.Close()", ix.Close()) }()
	err = ix.Init(checkpoint.Meta{
		DatasetFingerprint: fp, DatasetPath: cfg.Dataset, ConfigFingerprint: cfg.Fingerprint(),
		Total: total, Created: time.Now().UTC(),
	})
	if err != nil {
		return 0, err
	}
	// Many committers, as the movers are: CommitDone groups them into large txns.
	var g errgroup.Group
	g.SetLimit(2048)
	now := time.Now().UTC()
	for s := range done {
		g.Go(func() error {
			t := tokens(s)
			rid := shm.RID{Sample: s, Attempt: 1}
			return ix.CommitDone(checkpoint.Record{
				Sample: s, State: checkpoint.StateDone, Attempt: 1, RID: rid.String(),
				Bytes: int64(t) * bytesPerToken, CRC32C: uint32(s), Tokens: t, Updated: now,
			})
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	c, err := ix.Counters()
	if err != nil {
		return 0, err
	}
	if c.Done != done {
		return 0, fmt.Errorf("index has %d done, want %d", c.Done, done)
	}
	samples := make([]int, 0, done)
	if allFiles || done <= preflightStatSample {
		for s := range done {
			samples = append(samples, s)
		}
	} else {
		for k := range preflightStatSample {
			samples = append(samples, k*done/preflightStatSample)
		}
	}
	if err := fakeOutputs(cfg.OutputDir, samples, tokens, bytesPerToken); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// preflightStatSample is how many done files run's preflight stats (orchestrator's
// doctorStatSample), at done[k*len(done)/200].
const preflightStatSample = 200

// fakeOutputs creates sparse output files of the sizes synthIndex recorded.
func fakeOutputs(outputDir string, samples []int, tokens tokenPlan, bytesPerToken int64) error {
	const workers = 4
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lastDir := ""
			for i := w; i < len(samples); i += workers {
				s := samples[i]
				path := checkpoint.OutputPath(outputDir, s)
				if dir := filepath.Dir(path); dir != lastDir {
					if err := os.MkdirAll(dir, 0o755); err != nil {
						errs[w] = err
						return
					}
					lastDir = dir
				}
				f, err := os.Create(path)
				if err == nil {
					err = f.Truncate(int64(tokens(s)) * bytesPerToken)
					if cerr := f.Close(); err == nil {
						err = cerr
					}
				}
				if err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func cmdIndex(args []string) error {
	fs := flag.NewFlagSet("index", flag.ExitOnError)
	cfgPath := fs.String("config", "", "the job's config (dataset and state_dir)")
	done := fs.Int("done", 1000, "samples to mark done")
	tokens := fs.Int("tokens", 32, "tokens per sample to record")
	allFiles := fs.Bool("all-files", true, "create a sparse output file for every done sample (else only the preflight's 200)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := configs.Load(*cfgPath, nil)
	if err != nil {
		return err
	}
	took, err := synthIndex(cfg, *done, fixedTokens(*tokens), cfg.BytesPerToken(), *allFiles)
	if err != nil {
		return err
	}
	fmt.Printf("%s: %d samples done in %s\n", filepath.Join(cfg.StateDir, "index.db"), *done, took.Round(time.Millisecond))
	return nil
}
