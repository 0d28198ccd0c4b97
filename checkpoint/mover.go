package checkpoint

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/extract-dev/extract/internal/safetensors"
)

// The names of dump protocol v1 and output layout v1.
const (
	protocolVersion = "1"
	outputFormat    = "extract/v1"

	tensorInputIDs = "input_ids"
	tensorLossMask = "loss_mask"
	tensorHidden   = "hidden_state"
	tensorAux      = "aux_hidden_state"

	// crcPlaceholder holds the crc32c's place in the header until the data is written;
	// it has the width of the real value so that no offset moves when it is patched.
	crcPlaceholder = "00000000"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Expect is what the orchestrator knows about the dump it waits for: the sample's
// dataset line and the job's config. A dump that disagrees with any of it was made by
// another attempt, dataset, model or layer set and never counts (invariants 4 and 7).
type Expect struct {
	Sample int
	// RID is the current attempt's rid; the dump's __metadata__ rid must equal it.
	RID string
	// InputIDs is nil for a text sample: the dump's input_ids are then the truth.
	InputIDs []int64
	// LossMask nil means all ones; otherwise its length must equal the dump's tokens.
	LossMask           []int64
	DatasetFingerprint string
	// Layers is the job's effective layers_to_capture, e.g. "2,30,58" (required); the
	// dump's layers must name the same ids in the same order.
	Layers string
	// Model, when non-empty, must equal the dump's model metadata (the server's model path).
	Model string
	// HiddenSize is the model's hidden width (required, > 0).
	HiddenSize int
	// ConfigFingerprint is written into the output's metadata as config_fingerprint, so
	// that verify can tell a file of another config from one of this job.
	ConfigFingerprint string
	// SourceID, when set, is the sample's own id in the data it came from (a
	// conversation's id), written into the output's metadata as source_id.
	SourceID string
}

// Moved describes an output that Move made durable.
type Moved struct {
	Path        string
	Bytes       int64
	CRC32C      uint32
	Tokens      int
	Layers      string
	Model       string
	HookVersion string
	Protocol    string
}

// DumpError means the dump itself is bad: the caller quarantines it and retries the
// sample. Any other error from Move is about the output side or the context.
type DumpError struct {
	Path   string
	Reason string
}

func (e *DumpError) Error() string { return fmt.Sprintf("dump %s: %s", e.Path, e.Reason) }

// Mover validates dumps from the staging directory and streams them into the output layout.
// Moves of different samples may run concurrently; two moves of one sample may not,
// since they share the temp file.
type Mover struct {
	OutputDir string
	// Layout is the output format; its Dir defaults to OutputDir, its Format to safetensors.
	Layout Layout
	// BufferSize is the copy memory of one move, two chunks of half of it (one being
	// read while the other is written); 0 means 2 MiB. It does not grow with the dump.
	BufferSize int

	buffers sync.Pool // of *[]byte of BufferSize: small dumps would otherwise zero 2 MiB each
}

// dump is a validated dump.
type dump struct {
	path                string
	header              *safetensors.Header
	ids, hidden, aux    safetensors.Tensor
	tokens, hiddenSize  int64
	layers, model, hook string
}

// Move validates the dump src against want and writes the sample's output: to a temp
// file, fsynced, renamed to OutputPath, directory fsynced. It leaves the dump in place;
// the caller deletes it once the index commit is durable. Move is Stage then Commit.
func (m *Mover) Move(ctx context.Context, src *os.File, dumpPath string, want Expect) (Moved, error) {
	st, err := m.Stage(ctx, src, dumpPath, want)
	if err != nil {
		return Moved{}, err
	}
	return st.Commit()
}

// Staged is a sample whose output is written under its temp name and not yet durable.
type Staged struct {
	file   *pendingFile
	moved  Moved
	sample int
}

// Commit makes the output durable under its final name (fsync, rename, fsync the
// directory) and says what was written. On an error the caller may Stage the dump again.
func (s *Staged) Commit() (Moved, error) {
	if err := s.file.commit(); err != nil {
		return Moved{}, fmt.Errorf("sample %d: %w", s.sample, err)
	}
	return s.moved, nil
}

// IndexError is CommitTo's failure to record a durable output in the index: the state
// disk's fault, not the output disk's.
type IndexError struct{ Err error }

func (e *IndexError) Error() string { return e.Err.Error() }
func (e *IndexError) Unwrap() error { return e.Err }

// CommitTo is Commit, then the sample marked done in ix (r's attempt, rid, source id
// and time, with the output's bytes, crc32c and tokens): the index never says done
// before the file is durable under its name. A failure of the index is an *IndexError;
// the output stays, and a retry Stages the dump again.
func (s *Staged) CommitTo(ix *Index, r Record) (Moved, error) {
	moved, err := s.Commit()
	if err != nil {
		return moved, err
	}
	r.Sample, r.State = s.sample, StateDone
	r.Bytes, r.CRC32C, r.Tokens = moved.Bytes, moved.CRC32C, moved.Tokens
	if err := ix.CommitDone(r); err != nil {
		return moved, &IndexError{fmt.Errorf("index sample %d: %w", s.sample, err)}
	}
	return moved, nil
}

// Stage validates the dump src against want and writes the sample's output under its
// temp name, without an fsync. Staging is CPU and memory bound and Commit waits on the
// disk, so the caller may run few stages and many commits at once. The temp name is the
// sample's: stage a sample again only after its Commit returned.
//
// The caller opens the staging file itself (lstat, O_NOFOLLOW|O_NONBLOCK, fstat: the
// staging dir is world-writable) and hands it over; dumpPath only names it in errors.
// Stage never opens dumpPath, reads src only by offset (its file position does not
// matter), and reads nothing beyond src's size at the time of its fstat.
func (m *Mover) Stage(ctx context.Context, src *os.File, dumpPath string, want Expect) (*Staged, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sample %d: move %s: %w", want.Sample, dumpPath, err)
	}
	if err := want.check(); err != nil {
		return nil, fmt.Errorf("sample %d: move %s: %w", want.Sample, dumpPath, err)
	}
	st, err := src.Stat()
	if err != nil {
		return nil, fmt.Errorf("sample %d: stat dump %s: %w", want.Sample, dumpPath, err)
	}
	if !st.Mode().IsRegular() {
		return nil, &DumpError{Path: dumpPath, Reason: fmt.Sprintf("not a regular file (%s)", st.Mode().Type())}
	}
	buf := m.buffer()
	defer m.buffers.Put(buf)

	// Every read goes through this window: a dump that grows after the fstat (a writer
	// still at it, or an attacker) cannot make the mover read more than it sized.
	win := io.NewSectionReader(src, 0, st.Size())
	d, err := checkDump(ctx, win, dumpPath, st.Size(), want, *buf)
	if err != nil {
		if _, bad := errors.AsType[*DumpError](err); bad {
			return nil, err
		}
		return nil, fmt.Errorf("sample %d: check dump %s: %w", want.Sample, dumpPath, err)
	}
	l := m.layout()
	final := l.Path(want.Sample)
	p, n, sum, err := createSample(ctx, l, final, d.sample(win, want), *buf)
	if err != nil {
		if _, bad := errors.AsType[*DumpError](err); bad {
			return nil, err
		}
		return nil, fmt.Errorf("sample %d: %w", want.Sample, err)
	}
	return &Staged{file: p, moved: Moved{
		Path: final, Bytes: n, CRC32C: sum, Tokens: int(d.tokens),
		Layers: d.layers, Model: d.model, HookVersion: d.hook, Protocol: protocolVersion,
	}, sample: want.Sample}, nil
}

// buffer takes a copy buffer from the pool: whole int64s, so that input_ids compare
// chunk by chunk.
func (m *Mover) buffer() *[]byte {
	if b, ok := m.buffers.Get().(*[]byte); ok {
		return b
	}
	size := m.BufferSize
	if size <= 0 {
		size = 2 << 20
	}
	b := make([]byte, max(size/16*16, 16))
	return &b
}

// checkDump applies every check of dump protocol v1 before anything is written, so a
// bad dump never touches the output disk.
func checkDump(ctx context.Context, src io.ReaderAt, path string, size int64, want Expect, buf []byte) (*dump, error) {
	bad := func(format string, args ...any) error {
		return &DumpError{Path: path, Reason: fmt.Sprintf(format, args...)}
	}
	h, err := safetensors.ReadHeader(io.NewSectionReader(src, 0, size), size)
	if err != nil {
		return nil, bad("%v", err)
	}
	md := h.Metadata
	if md["protocol"] != protocolVersion {
		return nil, bad("protocol %q, want %q", md["protocol"], protocolVersion)
	}
	if md["rid"] != want.RID {
		return nil, bad("rid %q is not the current attempt %q", md["rid"], want.RID)
	}
	got, err := parseLayers(md["layers"])
	if err != nil {
		return nil, bad("%v", err)
	}
	if wantLayers, _ := parseLayers(want.Layers); !slices.Equal(got, wantLayers) {
		return nil, bad("layers %q, the job captures %q", md["layers"], want.Layers)
	}
	if want.Model != "" && md["model"] != want.Model {
		return nil, bad("model %q, the job runs %q", md["model"], want.Model)
	}
	if len(h.Tensors) != 3 {
		names := make([]string, len(h.Tensors))
		for i, t := range h.Tensors {
			names[i] = t.Name
		}
		return nil, bad("tensors %v, want exactly %s, %s, %s", names, tensorAux, tensorHidden, tensorInputIDs)
	}
	d := &dump{path: path, header: h, layers: md["layers"], model: md["model"], hook: md["hook_version"]}
	if d.ids, err = tensorOf(h, tensorInputIDs, safetensors.I64, 1); err != nil {
		return nil, bad("%v", err)
	}
	if d.hidden, err = tensorOf(h, tensorHidden, safetensors.BF16, 2); err != nil {
		return nil, bad("%v", err)
	}
	if d.aux, err = tensorOf(h, tensorAux, safetensors.BF16, 2); err != nil {
		return nil, bad("%v", err)
	}
	d.tokens, d.hiddenSize = d.ids.Shape[0], d.hidden.Shape[1]
	switch {
	case d.tokens < 1:
		return nil, bad("no tokens")
	case d.hiddenSize < 1:
		return nil, bad("hidden size 0")
	case d.hiddenSize != int64(want.HiddenSize):
		return nil, bad("hidden size %d, want %d", d.hiddenSize, want.HiddenSize)
	case d.hidden.Shape[0] != d.tokens:
		return nil, bad("%s has %d rows, %s has %d tokens", tensorHidden, d.hidden.Shape[0], tensorInputIDs, d.tokens)
	case d.aux.Shape[0] != d.tokens || d.aux.Shape[1] != 3*d.hiddenSize:
		return nil, bad("%s shape %v, want [%d %d]", tensorAux, d.aux.Shape, d.tokens, 3*d.hiddenSize)
	case want.InputIDs != nil && int64(len(want.InputIDs)) != d.tokens:
		return nil, bad("server saw %d tokens, dataset sample %d has %d", d.tokens, want.Sample, len(want.InputIDs))
	case want.LossMask != nil && int64(len(want.LossMask)) != d.tokens:
		return nil, bad("loss_mask has %d entries, dump has %d tokens", len(want.LossMask), d.tokens)
	}
	if want.InputIDs != nil {
		if err := compareIDs(ctx, src, path, h.DataStart+d.ids.Begin, want.InputIDs, buf); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// check refuses an Expect that cannot tell this job's dumps from another's: that is
// the caller's bug, not the dump's.
func (e Expect) check() error {
	if e.HiddenSize <= 0 {
		return fmt.Errorf("expect: hidden size %d, want > 0", e.HiddenSize)
	}
	if _, err := parseLayers(e.Layers); err != nil {
		return fmt.Errorf("expect: %w", err)
	}
	return nil
}

// parseLayers reads the three captured layer ids that aux_hidden_state concatenates.
func parseLayers(s string) ([]int, error) {
	if s == "" {
		return nil, errors.New("no layers")
	}
	parts := strings.Split(s, ",")
	if len(parts) != 3 {
		return nil, fmt.Errorf("layers %q: want 3 comma-separated layer ids", s)
	}
	ids := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("layers %q: %q is not a layer id", s, p)
		}
		ids[i] = n
	}
	return ids, nil
}

// tensorOf returns the named tensor after checking its dtype and rank.
func tensorOf(h *safetensors.Header, name string, dt safetensors.DType, rank int) (safetensors.Tensor, error) {
	t, ok := h.Tensor(name)
	if !ok {
		return t, fmt.Errorf("no tensor %s", name)
	}
	if t.DType != dt {
		return t, fmt.Errorf("tensor %s is %s, want %s", name, t.DType, dt)
	}
	if len(t.Shape) != rank {
		return t, fmt.Errorf("tensor %s has shape %v, want rank %d", name, t.Shape, rank)
	}
	return t, nil
}

// compareIDs checks the dump's input_ids against the dataset's in chunks, naming the
// first position that differs.
func compareIDs(ctx context.Context, src io.ReaderAt, path string, off int64, want []int64, buf []byte) error {
	for pos := 0; pos < len(want); {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(len(want)-pos, len(buf)/8)
		chunk := buf[:n*8]
		if _, err := src.ReadAt(chunk, off+int64(pos)*8); err != nil {
			return &DumpError{Path: path, Reason: fmt.Sprintf("read %s: %v", tensorInputIDs, err)}
		}
		for i := range n {
			if got := int64(binary.LittleEndian.Uint64(chunk[i*8:])); got != want[pos+i] {
				return &DumpError{Path: path, Reason: fmt.Sprintf("%s differ from the dataset at position %d: server saw %d, dataset has %d", tensorInputIDs, pos+i, got, want[pos+i])}
			}
		}
		pos += n
	}
	return nil
}

// layout is the mover's layout with its defaults filled in.
func (m *Mover) layout() Layout {
	l := m.Layout
	if l.Dir == "" {
		l.Dir = m.OutputDir
	}
	return l
}

// sample is the dump as the writers stream it, with the output's metadata.
func (d *dump) sample(src io.ReaderAt, want Expect) *sample {
	at := d.header.DataStart
	s := &sample{
		T: d.tokens, H: d.hiddenSize,
		ids:      segment{src, at + d.ids.Begin, d.ids.Len()},
		idVals:   want.InputIDs,
		hidden:   segment{src, at + d.hidden.Begin, d.hidden.Len()},
		aux:      segment{src, at + d.aux.Begin, d.aux.Len()},
		maskVals: want.LossMask,
		readErr: func(off int64, err error) error {
			return &DumpError{Path: d.path, Reason: fmt.Sprintf("read at %d: %v", off, err)}
		},
		md: map[string]string{
			"format":              outputFormat,
			"sample":              strconv.Itoa(want.Sample),
			"rid":                 want.RID,
			"dataset_fingerprint": want.DatasetFingerprint,
			"layers":              d.layers,
			"model":               d.model,
			"hook_version":        d.hook,
			"protocol":            protocolVersion,
			"tokens":              strconv.FormatInt(d.tokens, 10),
			"hidden_size":         strconv.FormatInt(d.hiddenSize, 10),
			"config_fingerprint":  want.ConfigFingerprint,
		},
	}
	if want.SourceID != "" {
		s.md["source_id"] = want.SourceID
	}
	return s
}
