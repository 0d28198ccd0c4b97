package orchestrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/orchestrator/generate"
)

// GenerateStatus is the generate stage's status in stateDir, nil when none has run:
// live from the snapshot a running generate rewrites every second (its index is held
// then), else from its index, read-only.
func GenerateStatus(stateDir string) *generate.Status {
	dir := filepath.Join(stateDir, "generate")
	if _, err := os.Stat(generate.IndexPath(dir)); err != nil {
		return nil
	}
	if h, held := LockHolder(stateDir); held {
		var s generate.Status
		if b, err := os.ReadFile(filepath.Join(dir, generate.StatusName)); err == nil && json.Unmarshal(b, &s) == nil && s.PID == h.PID && s.State == "running" {
			return &s
		}
	}
	rep, err := generate.ReadReport(dir, 0)
	if err != nil {
		return &generate.Status{Kind: "generate", State: "unknown: " + err.Error()}
	}
	s := generate.Status{Kind: "generate", State: "stopped", Total: rep.Total, Done: rep.Done, Dropped: rep.Dropped, Failed: rep.Failed,
		Pending: rep.Pending, Requests: rep.Requests, GeneratedTokens: rep.Generated, Flags: rep.Flags}
	if rep.Pending == 0 {
		s.State = "complete"
	}
	return &s
}

// sumGenerate adds the shards' generate figures into one.
func sumGenerate(rows []ShardStatus) *generate.Status {
	var sum *generate.Status
	for _, r := range rows {
		g := r.Generate
		if g == nil {
			continue
		}
		if sum == nil {
			sum = &generate.Status{Kind: "generate", State: "complete", Flags: map[string]int{}}
		}
		sum.Total += g.Total
		sum.Done += g.Done
		sum.Dropped += g.Dropped
		sum.Failed += g.Failed
		sum.Pending += g.Pending
		sum.Requests += g.Requests
		sum.GeneratedTokens += g.GeneratedTokens
		sum.TokensPerSecond += g.TokensPerSecond
		sum.ConversationsPerSecond += g.ConversationsPerSecond
		if g.State == "running" {
			sum.State = "running"
		} else if g.State != "complete" && sum.State != "running" {
			sum.State = "stopped"
		}
	}
	return sum
}

// hasGenerateIndex says whether stateDir holds a generate index (a shard that only
// generated is part of the plan too).
func hasGenerateIndex(stateDir string) bool {
	_, err := os.Stat(generate.IndexPath(filepath.Join(stateDir, "generate")))
	return err == nil
}

// verifyGenerateAll checks the generate index of every shard of an n-shard plan under
// base, under each shard's lock, into rep; done says no shard has extracted yet (the
// extraction's checks have nothing to read).
func verifyGenerateAll(base string, n int, rep *VerifyAllReport) (done bool, err error) {
	extracted := false
	var reps []generate.VerifyReport
	for i := range n {
		dir := filepath.Join(base, configs.ShardDirName(i, n))
		if _, err := os.Stat(filepath.Join(dir, "index.db")); err == nil {
			extracted = true
		}
		if !hasGenerateIndex(dir) {
			continue
		}
		lock, err := AcquireLock(dir, "verify")
		var held *HeldError
		if errors.As(err, &held) {
			return false, fmt.Errorf("%w: shard %d/%d is running (%v); verify --all after every shard stops", ErrTemporary, i, n, held)
		}
		if err != nil {
			return false, err
		}
		r, err := generate.Verify(filepath.Join(dir, "generate"))
		lock.Release()
		if err != nil {
			return false, fmt.Errorf("shard %d/%d: generate index: %w", i, n, err)
		}
		for _, p := range r.Problems {
			rep.problem("shard %d/%d generate: %s", i, n, p)
		}
		rep.GenerateProblems += len(r.Problems)
		reps = append(reps, r)
	}
	if len(reps) == 0 {
		return false, nil
	}
	if len(reps) < n {
		rep.GenerateProblems++
		rep.problem("generate: %d of %d shards have a generate index", len(reps), n)
	} else {
		for _, p := range generate.CheckPlan(reps) {
			rep.GenerateProblems++
			rep.problem("generate: %s", p)
		}
	}
	rep.Generate = reps
	rep.Shards, rep.GenerateOnly = n, !extracted
	return !extracted, nil
}
