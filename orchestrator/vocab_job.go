package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/orchestrator/prepare"
	"github.com/extract-dev/extract/orchestrator/vocab"
)

// VocabReport is what a vocabulary write did.
type VocabReport struct {
	Path       string `json:"path"`
	Samples    int    `json:"samples"` // done samples counted
	Tokens     int64  `json:"loss_tokens"`
	Seen       int    `json:"tokens_seen"` // distinct loss tokens
	DraftSize  int    `json:"draft_size"`
	TargetSize int    `json:"target_size"`
}

// jobVocab writes the draft vocabulary at the end of a conversation job: when it
// finished, or when it was already complete and has none yet.
func jobVocab(cfg *configs.Config, ds *dataset.Dataset, ix *checkpoint.Index, outcome Outcome, log *slog.Logger) error {
	path := filepath.Join(cfg.OutputDir, vocab.Dir, vocab.MappingName)
	if outcome != Finished {
		if _, err := os.Stat(path); outcome != AlreadyComplete || err == nil {
			return nil
		}
	}
	rep, err := writeVocab(cfg, ds, ix)
	if err != nil {
		return fmt.Errorf("draft vocabulary: %w", err)
	}
	log.Info("draft vocabulary written", "path", rep.Path, "samples", rep.Samples, "loss_tokens", rep.Tokens,
		"tokens_seen", rep.Seen, "draft_size", rep.DraftSize, "target_size", rep.TargetSize)
	return nil
}

// writeVocab counts the loss-masked tokens of the done samples, in sample order, from
// the dataset the job reads, and writes the mapping and the counts.
func writeVocab(cfg *configs.Config, ds *dataset.Dataset, ix *checkpoint.Index) (VocabReport, error) {
	target, err := prepare.TargetVocabSize(cfg)
	if err != nil {
		return VocabReport{}, err
	}
	rep := VocabReport{DraftSize: cfg.Vocab.EffectiveDraftSize(target), TargetSize: target, Path: filepath.Join(cfg.OutputDir, vocab.Dir, vocab.MappingName)}
	prog, err := ix.Load(ds.Len())
	if err != nil {
		return rep, err
	}
	c := vocab.NewCounts(target)
	for i, st := range prog.State {
		if st != checkpoint.StateDone {
			continue
		}
		s, err := ds.Sample(i)
		if err != nil {
			return rep, err
		}
		if s.InputIDs == nil {
			return rep, fmt.Errorf("sample %d is text: its tokens are the server's, not the dataset's; a vocabulary needs a tokenized dataset", i)
		}
		mask := s.LossMask
		if mask == nil {
			mask = make([]int64, len(s.InputIDs))
			for k := range mask {
				mask[k] = 1
			}
		}
		if err := c.Add(s.InputIDs, mask); err != nil {
			return rep, fmt.Errorf("sample %d: %w (vocab.target_size)", i, err)
		}
		rep.Samples++
	}
	for _, n := range c.N {
		rep.Tokens += n
		if n > 0 {
			rep.Seen++
		}
	}
	d2t, t2d, err := vocab.Mapping(c, rep.DraftSize, target)
	if err != nil {
		return rep, err
	}
	return rep, vocab.Write(cfg.OutputDir, c, d2t, t2d)
}

// Vocab writes the draft vocabulary of a finished or partial job from its done samples
// (`extract vocab`). It takes the run lock: a running job writes its own at its end.
func Vocab(ctx context.Context, cfg *configs.Config) (VocabReport, error) {
	path := filepath.Join(cfg.StateDir, "index.db")
	if _, err := os.Stat(path); err != nil {
		return VocabReport{}, fmt.Errorf("%w: no index at %s: no sample is done yet", ErrRefused, path)
	}
	lock, err := AcquireLock(cfg.StateDir, "vocab")
	var held *HeldError
	if errors.As(err, &held) {
		return VocabReport{}, fmt.Errorf("%w: %v; it writes the vocabulary when it finishes", ErrTemporary, held)
	}
	if err != nil {
		return VocabReport{}, err
	}
	defer lock.Release()
	ds, err := openExtractedDataset(ctx, cfg)
	if err != nil {
		return VocabReport{}, err
	}
	defer func() { _ = ds.Close() }()
	ix, err := checkpoint.Open(path, checkpoint.OpenOptions{ReadOnly: true, Timeout: 2 * time.Second})
	if err != nil {
		return VocabReport{}, err
	}
	defer func() { _ = ix.Close() }()
	meta, ok, err := ix.Meta()
	if err != nil {
		return VocabReport{}, err
	}
	if !ok || meta.DatasetFingerprint != ds.Fingerprint {
		return VocabReport{}, fmt.Errorf("%w: the index at %s is not of the dataset %s", ErrRefused, path, ds.Path)
	}
	if err := ctx.Err(); err != nil {
		return VocabReport{}, err
	}
	return writeVocab(cfg, ds, ix)
}
