package doctor

import (
	"context"
	"path/filepath"

	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/orchestrator/prepare"
)

// loadConversations is the dataset check for a conversation file: the prepared dataset
// when prepare has finished (the rest of doctor then sizes the job by it), else a note
// that run prepares it first. done is false for a dataset that is not conversations.
func (d *doctor) loadConversations() (c Check, done bool) {
	conv, err := prepare.IsConversations(d.cfg)
	if err != nil {
		return failCheck("dataset", "point dataset at the job's JSONL file", "%v", err), true
	}
	if !conv {
		return Check{}, false
	}
	dir := prepare.Dir(d.cfg)
	m, ok, err := prepare.ReadManifest(dir)
	if err != nil {
		return failCheck("dataset", "remove "+dir+" (extract run --fresh prepares it again)", "%v", err), true
	}
	if ok && m.Complete {
		if ds, err := dataset.Open(filepath.Join(dir, prepare.DatasetName)); err == nil {
			d.ds, d.ownDS = ds, true
			return okCheck("dataset", "conversations %s, prepared into %s: %d samples, %d tokens, %d lines refused", d.cfg.Dataset, ds.Path, ds.Len(), ds.TotalTokens(nil), m.Counts.RefusedTotal()), true
		}
	}
	return okCheck("dataset", "conversations %s, not prepared yet: extract run prepares it before the first request (or run extract prepare)", d.cfg.Dataset), true
}

// checkTokenizer is, for a conversation job, whether prepare can run: the tokenizer
// folder (present, readable, a chat template, no remote code the config did not allow)
// and a draft vocabulary that fits the target's.
func (d *doctor) checkTokenizer(context.Context) []Check {
	if conv, err := prepare.IsConversations(d.cfg); err != nil || !conv {
		return nil
	}
	if err := d.opt.Job.CheckConversations(); err != nil {
		return []Check{failCheck("tokenizer", "point prepare.tokenizer (or server.model_path) at the model's folder; set prepare.trust_remote_code or vocab.draft_size as the reason says", "%v", err)}
	}
	if d.cfg.Server.Kind == "simulator" {
		return []Check{okCheck("tokenizer", "the simulator's chat contract (vocabulary 259)")}
	}
	return []Check{okCheck("tokenizer", "%s", d.cfg.TokenizerPath())}
}
