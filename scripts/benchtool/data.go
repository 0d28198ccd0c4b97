package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"github.com/extract-dev/extract/internal/safetensors"
	"github.com/extract-dev/extract/shm"
)

// Datasets and dumps are deterministic: sample i has tokens(i) ids given by tokenID, so a
// dump written here always matches the dataset written here.

func tokenID(sample, pos int) int64 {
	x := uint64(sample)*0x9e3779b97f4a7c15 + uint64(pos)*0xbf58476d1ce4e5b9
	x ^= x >> 29
	return int64(x%150000) + 3
}

func sampleIDs(sample, tokens int) []int64 {
	ids := make([]int64, tokens)
	for p := range ids {
		ids[p] = tokenID(sample, p)
	}
	return ids
}

// tokenPlan gives each sample its token count.
type tokenPlan func(sample int) int

func fixedTokens(t int) tokenPlan { return func(int) int { return t } }

// spreadTokens varies the length between lo and hi, like a real prompt mix.
func spreadTokens(lo, hi int) tokenPlan {
	return func(s int) int {
		r := rand.New(rand.NewPCG(uint64(s), 7))
		return lo + r.IntN(hi-lo+1)
	}
}

// writeDataset writes n samples as {"input_ids":[...]} lines and returns the sha256 of
// the file, which is the dataset fingerprint extract computes.
func writeDataset(path string, n int, plan tokenPlan) (string, int64, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", 0, err
	}
	f, err := os.Create(path)
	if err != nil {
		return "", 0, err
	}
	h := sha256.New()
	w := bufio.NewWriterSize(f, 4<<20)
	var line []byte
	var tokens int64
	for s := range n {
		t := plan(s)
		tokens += int64(t)
		line = append(line[:0], `{"input_ids":[`...)
		for p := range t {
			if p > 0 {
				line = append(line, ',')
			}
			line = strconv.AppendInt(line, tokenID(s, p), 10)
		}
		line = append(line, "]}\n"...)
		h.Write(line)
		if _, err := w.Write(line); err != nil {
			_ = f.Close()
			return "", 0, err
		}
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return "", 0, err
	}
	if err := f.Close(); err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), tokens, nil
}

// noise is what dumps are filled with: incompressible, and cheap to repeat.
var noise = func() []byte {
	b := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}()

// benchLayers is the layers_to_capture the bench dumps carry and the mover expects.
const benchLayers = "2,30,58"

// dumpBytes is the size of a protocol v1 dump body: 3 aux layers and the final one in
// bf16, plus the int64 input ids.
func dumpBytes(tokens, hidden int) int64 {
	return int64(tokens) * (int64(4*hidden)*2 + 8)
}

// writeDump writes sample's dump as the server hook does: a partial file renamed to
// <rid>.safetensors once complete.
func writeDump(dir string, sample, tokens, hidden int) (string, error) {
	rid := shm.RID{Sample: sample, Attempt: 1}
	T, H := int64(tokens), int64(hidden)
	hdr, _, err := safetensors.EncodeHeader([]safetensors.Spec{
		{Name: "aux_hidden_state", DType: safetensors.BF16, Shape: []int64{T, 3 * H}},
		{Name: "hidden_state", DType: safetensors.BF16, Shape: []int64{T, H}},
		{Name: "input_ids", DType: safetensors.I64, Shape: []int64{T}},
	}, map[string]string{"rid": rid.String(), "protocol": "1", "layers": benchLayers, "model": "bench", "hook_version": "bench-1"})
	if err != nil {
		return "", err
	}
	final := filepath.Join(dir, rid.FileName())
	partial := final + shm.PartialSuffix
	f, err := os.Create(partial)
	if err != nil {
		return "", err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	// bufio keeps the first write error for Flush, which is checked.
	_, _ = w.Write(hdr)
	for left, off := T*4*H*2, int64(sample)*4099%int64(len(noise)); left > 0; {
		n := min(left, int64(len(noise))-off)
		_, _ = w.Write(noise[off : off+n])
		left -= n
		off = 0
	}
	var b [8]byte
	for p := range tokens {
		binary.LittleEndian.PutUint64(b[:], uint64(tokenID(sample, p)))
		_, _ = w.Write(b[:])
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return final, os.Rename(partial, final)
}

func cmdDataset(args []string) error {
	fs := flag.NewFlagSet("dataset", flag.ExitOnError)
	out := fs.String("o", "", "output JSONL")
	n := fs.Int("n", 1000, "samples")
	tokens := fs.Int("tokens", 32, "tokens per sample")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("-o is required")
	}
	fp, tok, err := writeDataset(*out, *n, fixedTokens(*tokens))
	if err != nil {
		return err
	}
	fmt.Printf("%s: %d samples, %d tokens, sha256 %s\n", *out, *n, tok, fp)
	return nil
}
