// Package vocab makes the draft vocabulary a SpecForge-style EAGLE-3 draft model trains
// with: <output_dir>/vocab_mapping/vocab_mapping.pt, {"d2t": int64 [draft_size], "t2d":
// bool [target_size]}, from the counts of the loss-masked tokens of the samples done,
// and the raw counts beside it (token_freq.pt, {token id: count}, speculators' form).
//
// What it keeps: the mapping is a pure function of the counts and the two sizes
// (Mapping, tested without I/O, and against SpecForge's own function under torch); each
// file is written to a temp name, fsynced, renamed and its dir fsynced, so a reader sees
// the old mapping or the new one.
package vocab

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"sort"

	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/torchzip"
)

// Dir and the file names SpecForge's prepare_hidden_states.py uses.
const (
	Dir         = "vocab_mapping"
	MappingName = "vocab_mapping.pt"
	FreqName    = "token_freq.pt"
)

// Counts are token frequencies, indexed by token id, and for each token the sample it
// was first seen in: SpecForge breaks ties by that order.
type Counts struct {
	N       []int64
	first   []int64 // 1 + the Add call that first saw the token; 0: never seen
	samples int64
}

// NewCounts counts tokens of a target vocabulary of size tokens.
func NewCounts(size int) *Counts {
	return &Counts{N: make([]int64, size), first: make([]int64, size)}
}

// Add counts the tokens of one sample whose mask is 1; samples must come in sample
// order. An id outside the target vocabulary is an error: the sample is not of this
// target.
func (c *Counts) Add(ids, mask []int64) error {
	if len(ids) != len(mask) {
		return fmt.Errorf("%d ids and %d mask values", len(ids), len(mask))
	}
	c.samples++
	for i, id := range ids {
		if mask[i] != 1 {
			continue
		}
		if id < 0 || id >= int64(len(c.N)) {
			return fmt.Errorf("token %d at %d is outside the target vocabulary of %d", id, i, len(c.N))
		}
		if c.first[id] == 0 {
			c.first[id] = c.samples
		}
		c.N[id]++
	}
	return nil
}

// Mapping is SpecForge's process_token_dict_to_mappings over the counts SpecForge's
// generate_vocab_mapping_file makes (a Counter updated sample by sample with each
// sample's sorted unique loss tokens): the draft vocabulary is the draftSize most
// frequent tokens, a tie going to the token first seen in an earlier sample, then to
// the lower id (Counter.most_common keeps insertion order); padded, when fewer tokens
// were seen, with the lowest ids not in it yet; sorted. d2t[i] is the offset from draft
// id i to its target id (target = i + d2t[i]); t2d[t] says whether target token t is in
// the draft vocabulary.
func Mapping(c *Counts, draftSize, targetSize int) (d2t []int64, t2d []bool, err error) {
	if draftSize < 1 || targetSize < 1 || draftSize > targetSize {
		return nil, nil, fmt.Errorf("vocab.draft_size %d must be 1..the target vocabulary %d", draftSize, targetSize)
	}
	if len(c.N) > targetSize {
		return nil, nil, fmt.Errorf("counts of %d tokens for a target vocabulary of %d", len(c.N), targetSize)
	}
	var seen []int
	for id, n := range c.N {
		if n > 0 {
			seen = append(seen, id)
		}
	}
	sort.SliceStable(seen, func(i, j int) bool {
		a, b := seen[i], seen[j]
		if c.N[a] != c.N[b] {
			return c.N[a] > c.N[b]
		}
		return c.first[a] < c.first[b]
	})
	if len(seen) > draftSize {
		seen = seen[:draftSize]
	}
	in := make([]bool, targetSize)
	for _, id := range seen {
		in[id] = true
	}
	for id := 0; len(seen) < draftSize; id++ {
		if !in[id] {
			in[id] = true
			seen = append(seen, id)
		}
	}
	sort.Ints(seen)
	d2t = make([]int64, draftSize)
	for i, id := range seen {
		d2t[i] = int64(id - i)
	}
	return d2t, in, nil
}

// Write writes the mapping and the counts into outputDir/vocab_mapping.
func Write(outputDir string, c *Counts, d2t []int64, t2d []bool) error {
	dir := filepath.Join(outputDir, Dir)
	if err := atomicfile.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	d := make([]byte, 0, 8*len(d2t))
	for _, v := range d2t {
		d = binary.LittleEndian.AppendUint64(d, uint64(v))
	}
	t := make([]byte, len(t2d))
	for i, v := range t2d {
		if v {
			t[i] = 1
		}
	}
	pkl := torchzip.EncodeDict([]torchzip.Tensor{
		{Name: "d2t", DType: torchzip.Int64, Key: "0", StorageNumel: int64(len(d2t)), Shape: []int64{int64(len(d2t))}, Stride: []int64{1}},
		{Name: "t2d", DType: torchzip.Bool, Key: "1", StorageNumel: int64(len(t2d)), Shape: []int64{int64(len(t2d))}, Stride: []int64{1}},
	})
	b, err := torchzip.WriteSmall("archive", pkl, []torchzip.Storage{{Key: "0", Data: d}, {Key: "1", Data: t}})
	if err != nil {
		return fmt.Errorf("vocab mapping: %w", err)
	}
	var keys, vals []int64
	for id, n := range c.N {
		if n > 0 {
			keys, vals = append(keys, int64(id)), append(vals, n)
		}
	}
	freq, err := torchzip.WriteSmall("archive", torchzip.EncodeIntDict(keys, vals), nil)
	if err != nil {
		return fmt.Errorf("token counts: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, FreqName), freq, 0o644); err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, MappingName), b, 0o644)
}
