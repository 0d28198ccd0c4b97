package doctor

// Doctor's index check: the facts come from checkpoint.InspectIndex, which reads the
// index in one short read-only open; these functions judge them.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/extract-dev/extract/checkpoint"
)

// RepairFix is the fix for an index that cannot be read: the output files describe
// themselves, so nothing is lost with it.
const RepairFix = "`extract verify --repair` moves it aside (kept as index.db.broken-<time>) and rebuilds the index from the output files"

// loadIndex reads the index into d.index (checkpoint.InspectIndex opens it read-only,
// reads it, closes it and then stats a sample of the done files; a caller's open index
// is read in place), or sets d.indexVerdict when it cannot or must not be read.
func (d *doctor) loadIndex() {
	const name = "index"
	verdict := func(c Check) { d.indexVerdict = []Check{c} }
	path := filepath.Join(d.cfg.StateDir, "index.db")
	var f checkpoint.IndexFacts
	var err error
	if d.opt.Index != nil {
		f, err = heldIndexFacts(d.opt.Index, d.cfg.OutputDir)
	} else {
		if h, held := d.opt.Job.LockHolder(); held {
			if !h.Run {
				verdict(warnCheck(name, "wait for it to end, then run doctor again for the index checks (a run started now exits 75)",
					"%s holds the lock; the index is not opened meanwhile", h))
				return
			}
			d.running = h.PID
			verdict(warnCheck(name, "`extract status` shows its progress; run doctor again after it stops for the index checks",
				"a run is in progress (pid %d); the index is not opened while it runs", h.PID))
			return
		}
		f, err = checkpoint.InspectIndex(path, checkpoint.InspectOptions{OutputDir: d.cfg.OutputDir, StatSample: doctorStatSample, Timeout: doctorIndexTimeout})
	}
	switch {
	case errors.Is(err, checkpoint.ErrLocked):
		if h, held := d.opt.Job.LockHolder(); held {
			if !h.Run {
				verdict(warnCheck(name, "wait for it to end, then run doctor again for the index checks", "%s holds the index; it was not read", h))
				return
			}
			d.running = h.PID
			verdict(warnCheck(name, "`extract status` shows its progress", "a run started while doctor ran (pid %d); the index was not read", h.PID))
			return
		}
		verdict(warnCheck(name, "wait for the other extract command (e.g. verify --repair) to finish", "%v", err))
		return
	case errors.Is(err, checkpoint.ErrDamaged):
		// The error names the file and the damage (issue 8, item 6).
		verdict(failCheck(name, RepairFix, "%v", err))
		return
	case err != nil && strings.Contains(err.Error(), "schema_version"):
		verdict(failCheck(name, "use the extract release that wrote this index", "%v", err))
		return
	case err != nil:
		verdict(failCheck(name, RepairFix, "read %s: %v", path, err))
		return
	case !f.Exists || !f.Initialised:
		if n, err := d.opt.Job.OutputFiles(d.ds); err == nil && n > 0 {
			// A lost index, not a new job: a run would recompute every file.
			verdict(failCheck(name, "`extract verify --repair` rebuilds the index from them (they are self-describing), then `extract run --resume`",
				"no job in %s, but %d output files of this job are under %s: the index was lost", path, n, d.cfg.OutputDir))
			return
		}
		if !f.Exists {
			verdict(okCheck(name, "none yet at %s; the first run creates it", path))
			return
		}
	}
	d.index = f
	if !f.Initialised {
		return
	}
	progress := f.Counters.Done+f.Counters.Failed > 0
	// The progress describes this dataset only if the index was made for it.
	if d.ds != nil && (f.Meta.DatasetFingerprint == d.ds.Fingerprint || !progress) && f.Meta.Total == d.ds.Len() {
		d.prog = f.Progress
		d.complete = f.Counters.Done == f.Meta.Total
	}
}

// heldIndexFacts reads what InspectIndex reads from an index the caller holds open
// read-write (run's preflight): InspectIndex's own read-only open would wait for the
// caller's lock. It stats the same sample of done files.
func heldIndexFacts(ix *checkpoint.Index, outputDir string) (checkpoint.IndexFacts, error) {
	f := checkpoint.IndexFacts{Path: ix.Path(), Exists: true, SchemaVersion: checkpoint.SchemaVersion}
	m, ok, err := ix.Meta()
	if err != nil || !ok {
		return f, err
	}
	f.Initialised, f.Meta = true, m
	// Done files sit where the index's format puts them (safetensors for an old index).
	layout, err := checkpoint.ParseLayout(outputDir, m.OutputFormat)
	if err != nil {
		return f, err
	}
	if f.Counters, err = ix.Counters(); err != nil {
		return f, err
	}
	if f.Progress, err = ix.Load(m.Total); err != nil {
		return f, fmt.Errorf("read the records: %w", err)
	}
	for s, st := range f.Progress.State {
		if st == checkpoint.StateDone {
			f.Done = append(f.Done, s)
		}
	}
	n := min(len(f.Done), doctorStatSample)
	for k := range n {
		s := f.Done[k*len(f.Done)/n]
		r, found, err := ix.Get(s)
		if err != nil {
			return f, fmt.Errorf("read record of sample %d: %w", s, err)
		}
		if !found {
			continue
		}
		f.Checked++
		p := layout.Path(s)
		st, err := os.Stat(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			f.Problems = append(f.Problems, fmt.Sprintf("sample %d: %s missing", s, p))
		case err != nil:
			f.Problems = append(f.Problems, fmt.Sprintf("sample %d: %v", s, err))
		case st.Size() != r.Bytes:
			f.Problems = append(f.Problems, fmt.Sprintf("sample %d: %s is %d bytes, the index recorded %d", s, p, st.Size(), r.Bytes))
		}
	}
	return f, nil
}

// checkIndex says whether a resume would accept the index, and how the sample of done
// files stood; it is shown last.
func (d *doctor) checkIndex(context.Context) []Check {
	const name = "index"
	if d.indexVerdict != nil {
		return d.indexVerdict
	}
	f := d.index
	if !f.Initialised {
		return []Check{okCheck(name, "%s holds no job yet; the first run initialises it", f.Path)}
	}
	meta, c := f.Meta, f.Counters
	var checks []Check
	if d.ds != nil && c.Done+c.Failed > 0 {
		if meta.DatasetFingerprint != d.ds.Fingerprint {
			return []Check{failCheck(name, "point dataset back at the job's file, or start over with `extract run --fresh`",
				"the job in %s was started on another dataset (%s, %d samples, sha256 %.12s…; now %s, %d samples, sha256 %.12s…): `extract run --resume` would refuse",
				f.Path, meta.DatasetPath, meta.Total, meta.DatasetFingerprint, d.ds.Path, d.ds.Len(), d.ds.Fingerprint)}
		}
		if meta.ConfigFingerprint != d.cfg.Fingerprint() {
			checks = append(checks, failCheck(name, "restore server.model_path, hidden size and layers, or start over with `extract run --fresh`",
				"the model, hidden size or captured layers differ from the ones the job in %s was started with (config fingerprint %s, now %s): `extract run --resume` would refuse",
				f.Path, meta.ConfigFingerprint, d.cfg.Fingerprint()))
		}
	}
	summary := fmt.Sprintf("schema v%d, %d of %d samples done, %d failed, %s written", f.SchemaVersion, c.Done, meta.Total, c.Failed, fmtSize(c.BytesWritten))
	if len(f.Done) == 0 {
		return append(checks, okCheck(name, "%s", summary))
	}
	if len(f.Problems) > 0 {
		shown := f.Problems
		if len(shown) > 3 {
			shown = append(shown[:3:3], fmt.Sprintf("and %d more", len(f.Problems)-3))
		}
		return append(checks, failCheck(name, "run `extract verify --repair` with this config: it checks every file and returns the bad samples to pending",
			"%s; %d of %d sampled done files in %s are missing or the wrong size (%s)", summary, len(f.Problems), f.Checked, d.cfg.OutputDir, strings.Join(shown, "; ")))
	}
	return append(checks, okCheck(name, "%s; %d of %d done files checked by stat: all present", summary, f.Checked, len(f.Done)))
}
