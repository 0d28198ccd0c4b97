package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/doctor"
	"github.com/extract-dev/extract/orchestrator/prepare"
	"github.com/extract-dev/extract/sglang/tokenizer"
)

// errPrepareHeld says another run holds the lock while this one would prepare.
type errPrepareHeld struct{ pid int }

func (e errPrepareHeld) Error() string {
	return fmt.Sprintf("another run (pid %d) holds the lock", e.pid)
}

// acquireStageLock takes the run lock for a stage a run does before its extraction
// (prepare, generate): another run holding it is that job going already
// (errPrepareHeld, exit 0); verify, import or export end soon (exit 75).
func acquireStageLock(cfg *configs.Config) (*Lock, error) {
	lock, err := AcquireLock(cfg.StateDir, "run")
	var held *HeldError
	if errors.As(err, &held) && held.Holder.IsRun() {
		return nil, errPrepareHeld{held.Holder.PID}
	}
	if errors.As(err, &held) {
		return nil, fmt.Errorf("%w: %s holds %s; run again after it ends", ErrTemporary, held.Holder, held.Path)
	}
	return lock, err
}

// extractedDataset is the file a run extracts, without making it: the dataset, the
// prepared file for a conversation dataset, the generated one with generate.enabled.
// verify, import and vocab read the samples from it as the run did.
func extractedDataset(cfg *configs.Config) (string, error) {
	if cfg.Generate.Enabled {
		return GenerateOutput(cfg, ""), nil
	}
	conv, err := prepare.IsConversations(cfg)
	if err != nil {
		return "", fmt.Errorf("%w: %w", dataset.ErrBad, err)
	}
	if conv {
		return filepath.Join(prepare.Dir(cfg), prepare.DatasetName), nil
	}
	return cfg.Dataset, nil
}

// openExtractedDataset opens extractedDataset; one that a run has not made yet is
// ErrRefused saying so, not a missing file the config never named.
func openExtractedDataset(ctx context.Context, cfg *configs.Config) (*dataset.Dataset, error) {
	path, err := extractedDataset(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); path != cfg.Dataset && errors.Is(err, fs.ErrNotExist) {
		by := "`extract run` (or `extract prepare`)"
		if cfg.Generate.Enabled {
			by = "`extract run` (its generate stage)"
		}
		return nil, fmt.Errorf("%w: no %s yet: %s makes it from %s first", ErrRefused, path, by, cfg.Dataset)
	}
	dsCfg := *cfg
	dsCfg.Dataset = path
	return dataset.OpenJob(ctx, &dsCfg)
}

// runDataset is the dataset the run reads: the configured one, or, for a conversation
// file, its prepared form in state_dir/prepare, made (or resumed) here first, under the
// run lock and before any GPU time. A prepare dir made from other inputs is refused
// naming what changed once the index has progress; without progress (or with --fresh)
// it is prepared again.
func runDataset(ctx context.Context, cfg *configs.Config, opt RunOptions) (string, error) {
	if cfg.Generate.Enabled {
		return runGenerate(ctx, cfg, opt) // generate_job.go
	}
	conv, err := prepare.IsConversations(cfg)
	if err != nil {
		return "", fmt.Errorf("%w: %w", dataset.ErrBad, err)
	}
	if !conv {
		return cfg.Dataset, nil
	}
	if err := checkConversationJob(cfg); err != nil {
		return "", err
	}
	if err := doctor.MakeJobDirs(cfg); err != nil {
		return "", err
	}
	lock, err := acquireStageLock(cfg)
	if err != nil {
		return "", err
	}
	defer lock.Release()
	dir := prepare.Dir(cfg)
	o, err := prepare.OptionsFrom(cfg, cfg.Dataset, dir, opt.Log)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrRefused, err)
	}
	tok, err := prepare.NewTokenizer(cfg, filepath.Join(dir, ".worker"), opt.Log)
	if err != nil {
		return "", fmt.Errorf("%w: tokenizer: %w", ErrPreflight, err)
	}
	defer func() { _ = tok.Close() }()
	if opt.Fresh {
		if err := prepare.Clear(dir); err != nil {
			return "", err
		}
	}
	began := time.Now()
	sum, err := prepare.Run(ctx, o, tok)
	if errors.Is(err, prepare.ErrChanged) && !indexHasProgress(cfg) {
		opt.Log.Warn("prepare: the conversations, tokenizer, template or options changed and no sample is done yet: preparing again", "reason", err)
		if err := prepare.Clear(dir); err != nil {
			return "", err
		}
		sum, err = prepare.Run(ctx, o, tok)
	}
	switch {
	case errors.Is(err, prepare.ErrChanged):
		return "", fmt.Errorf("%w: %v: resuming would mix samples made by two tokenizations", ErrRefused, err)
	case errors.Is(err, prepare.ErrBadInput):
		return "", fmt.Errorf("%w: %w", dataset.ErrBad, err)
	case err != nil:
		return "", err
	}
	c := sum.Counts
	opt.Log.Info("prepare: conversations ready", "conversations", cfg.Dataset, "dataset", sum.Dataset, "lines", c.Lines,
		"accepted", c.Accepted, "refused", c.RefusedTotal(), "refused_by_reason", c.Refused, "truncated", c.Truncated,
		"tokens", c.Tokens, "loss_tokens", c.Loss, "already_prepared", sum.AlreadyDone, "resumed_chunks", sum.Resumed,
		"elapsed", time.Since(began).Round(time.Millisecond))
	return sum.Dataset, nil
}

// checkConversationJob refuses, before any work, what would fail at the job's end or
// needs a person: a draft vocabulary larger than the target's (exit 2), a tokenizer
// folder that cannot serve (exit 3).
func checkConversationJob(cfg *configs.Config) error {
	target, err := prepare.TargetVocabSize(cfg)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrPreflight, err)
	}
	if d := cfg.Vocab.EffectiveDraftSize(target); d > target {
		return fmt.Errorf("%w: vocab.draft_size %d is larger than the target's vocabulary of %d tokens; set vocab.draft_size", ErrRefused, d, target)
	}
	if cfg.Server.Kind == "simulator" {
		return nil
	}
	if err := tokenizer.Check(cfg.TokenizerPath(), cfg.Prepare.ChatTemplate, cfg.Prepare.TrustRemoteCode); err != nil {
		return fmt.Errorf("%w: tokenizer: %w", ErrPreflight, err)
	}
	return nil
}

// indexHasProgress says whether the job's index has samples done or failed; an index
// that cannot be read counts as progress (refuse rather than redo under it).
func indexHasProgress(cfg *configs.Config) bool {
	path := filepath.Join(cfg.StateDir, "index.db")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return false
	}
	ix, err := checkpoint.Open(path, checkpoint.OpenOptions{ReadOnly: true, Timeout: 2 * time.Second})
	if err != nil {
		return true
	}
	defer func() { _ = ix.Close() }()
	c, err := ix.Counters()
	return err != nil || c.Done+c.Failed > 0
}

// PrepareStatus is what status says of a conversation job's prepare step, from its
// manifest: how far it is and what it refused.
type PrepareStatus struct {
	Conversations string         `json:"conversations"`
	Complete      bool           `json:"complete"`
	Chunks        int            `json:"chunks"`
	Lines         int            `json:"lines"`
	Accepted      int            `json:"accepted"`
	Truncated     int            `json:"truncated"`
	Refused       int            `json:"refused"`
	RefusedBy     map[string]int `json:"refused_by_reason,omitempty"`
	Refusals      string         `json:"refusals,omitempty"` // refused.jsonl, once complete
}

// prepareStatus reads the manifest of state_dir/prepare; nil when there is none.
func prepareStatus(cfg *configs.Config) *PrepareStatus {
	dir := prepare.Dir(cfg)
	m, ok, err := prepare.ReadManifest(dir)
	if err != nil || !ok {
		return nil
	}
	var c prepare.Counts
	if m.Complete {
		c = m.Counts
	} else {
		for _, ch := range m.Chunks {
			c.Add(ch.Counts)
		}
	}
	ps := &PrepareStatus{Conversations: m.Source, Complete: m.Complete, Chunks: len(m.Chunks), Lines: c.Lines,
		Accepted: c.Accepted, Truncated: c.Truncated, Refused: c.RefusedTotal(), RefusedBy: c.Refused}
	if m.Complete {
		ps.Refusals = filepath.Join(dir, prepare.RefusedName)
	}
	return ps
}
