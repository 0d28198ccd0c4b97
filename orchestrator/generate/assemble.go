package generate

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/conversation"
)

// outLine is one line of the output: a conversation file's line and a pre-tokenized
// dataset's at once.
type outLine struct {
	ID       string                 `json:"id"`
	Messages []conversation.Message `json:"messages"`
	Tools    []json.RawMessage      `json:"tools,omitempty"`
	InputIDs []int64                `json:"input_ids"`
	LossMask []int64                `json:"loss_mask"`
}

// assemble writes the done records in [lo, hi) to path from the index alone, in sample
// order: a temp name beside it, fsync, rename, fsync the dir. It replaces only a file
// this index wrote there before (or none): any other is the user's.
func assemble(ix *index, path string, lo, hi int, sum *Summary) error {
	m, _, err := ix.meta()
	if err != nil {
		return err
	}
	if st, err := os.Lstat(path); err == nil {
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%w: output %s exists and is not a regular file", ErrBadInput, path)
		}
		if m.Output != path {
			return fmt.Errorf("%w: output %s exists and this job did not write it; move it away or name another --to", ErrBadInput, path)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("output %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	if err := atomicfile.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// The index records the name before it exists, so a kill between the rename and
	// this record never leaves a file we would refuse to replace.
	if m.Output != path {
		m.Output = path
		if err := ix.setMeta(m); err != nil {
			return err
		}
	}
	tmp := filepath.Join(dir, "."+filepath.Base(path)+".extract-tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return fmt.Errorf("output temp %s: %w", tmp, err)
	}
	defer func() { _ = os.Remove(tmp) }() // after the rename it names nothing
	w := bufio.NewWriterSize(f, 1<<20)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	sum.Done, sum.Dropped, sum.Failed, sum.Generated, sum.Flags = 0, 0, 0, 0, map[string]int{}
	err = ix.each(func(s int, r *Record) error {
		if s < lo || s >= hi {
			return nil
		}
		sum.Generated += int64(r.Generated)
		for _, f := range r.Flags {
			sum.Flags[string(f)]++
		}
		switch r.State {
		case Dropped:
			sum.Dropped++
			return nil
		case Failed:
			sum.Failed++
			return nil
		}
		sum.Done++
		id := r.ID
		if id == "" {
			id = "line-" + strconv.Itoa(r.Line)
		}
		return enc.Encode(outLine{ID: id, Messages: r.Messages, Tools: r.Tools, InputIDs: r.InputIDs, LossMask: r.LossMask})
	})
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, path, err)
	}
	return atomicfile.SyncDir(dir)
}
