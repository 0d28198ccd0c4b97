package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/extract-dev/extract/sglang/simulator"
)

// An independent checker of a safetensors job's output: it knows the layout and the
// file format from the contract (README, docs/formats.md), not from extract's code. Paths
// are spelled out, the header is parsed by hand (8-byte little-endian length, then
// JSON), the crc32c is recomputed here, and samples are counted from the files on disk,
// so a bug shared by the writer and extract's reader cannot pass.

// dataName is an output's name as the contract spells it,
// rows_<g>-<g+2000>/data_<i>.safetensors, read loosely (any group, leading zeros) so
// that a file of a sample in the wrong place counts as that sample's.
var dataName = regexp.MustCompile(`^rows_(\d+)-(\d+)/data_(\d+)\.safetensors$`)

// stTensor is the part of a safetensors header entry the checker reads.
type stTensor struct {
	DType   string  `json:"dtype"`
	Shape   []int64 `json:"shape"`
	Offsets []int64 `json:"data_offsets"`
}

// outsideReport is what the independent checker found.
type outsideReport struct {
	lost, corrupt, duplicated, stray int
	problems                         []string
}

func (r *outsideReport) bad() int { return r.lost + r.corrupt + r.duplicated + r.stray }

// checkFromOutside walks the output dir and checks every file against the dataset and
// the simulator's function: samples with no file, with a bad or misplaced one, with more
// than one, and files that are no sample's.
func (j *job) checkFromOutside() outsideReport {
	j.t.Helper()
	var r outsideReport
	problem := func(format string, args ...any) { r.problems = append(r.problems, fmt.Sprintf(format, args...)) }
	files := map[int][]string{}
	err := filepath.WalkDir(j.out, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == j.state {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(j.out, path)
		m := dataName.FindStringSubmatch(rel)
		i := len(j.samples)
		if m != nil {
			if n, err := strconv.Atoi(m[3]); err == nil {
				i = n
			}
		}
		if i >= len(j.samples) {
			problem("stray file in the output: %s", rel)
			r.stray++
			return nil
		}
		files[i] = append(files[i], rel)
		return nil
	})
	if err != nil {
		j.t.Fatalf("walk %s: %v", j.out, err)
	}
	for i, s := range j.samples {
		want := fmt.Sprintf("rows_%d-%d/data_%d.safetensors", i/2000*2000, i/2000*2000+2000, i)
		switch rels := files[i]; {
		case len(rels) == 0:
			problem("sample %d: no file", i)
			r.lost++
		case len(rels) > 1:
			problem("sample %d: %d files %v", i, len(rels), rels)
			r.duplicated++
		case rels[0] != want:
			problem("sample %d: its file is %s, want %s", i, rels[0], want)
			r.corrupt++
		default:
			if err := j.checkFileFromOutside(filepath.Join(j.out, want), i, s); err != nil {
				problem("sample %d: %s: %v", i, want, err)
				r.corrupt++
			}
		}
	}
	entries, _ := os.ReadDir(j.shmDir)
	for _, e := range entries {
		problem("staging dir not empty: %s", e.Name())
		r.stray++
	}
	return r
}

func (j *job) checkFileFromOutside(path string, idx int, s sample) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if len(b) < 8 {
		return fmt.Errorf("%d bytes", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > uint64(len(b)-8) {
		return fmt.Errorf("header length %d beyond the file's %d bytes", n, len(b))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &raw); err != nil {
		return fmt.Errorf("header: %v", err)
	}
	var md map[string]string
	if err := json.Unmarshal(raw["__metadata__"], &md); err != nil {
		return fmt.Errorf("__metadata__: %v", err)
	}
	T, H := int64(len(s.ids)), int64(j.hidden)
	want := []struct {
		name, dtype string
		shape       []int64
		size        int64
	}{
		{"input_ids", "I64", []int64{T}, 8 * T},
		{"loss_mask", "I64", []int64{T}, 8 * T},
		{"hidden_state", "BF16", []int64{T, H}, 2 * T * H},
		{"aux_hidden_state", "BF16", []int64{T, 3 * H}, 6 * T * H},
	}
	if len(raw) != len(want)+1 {
		return fmt.Errorf("header holds %d entries, want 4 tensors and __metadata__", len(raw))
	}
	data := b[8+n:]
	crc := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	tensor := map[string][]byte{}
	for _, w := range want {
		var t stTensor
		if err := json.Unmarshal(raw[w.name], &t); err != nil {
			return fmt.Errorf("tensor %s: %v", w.name, err)
		}
		if t.DType != w.dtype || fmt.Sprint(t.Shape) != fmt.Sprint(w.shape) || len(t.Offsets) != 2 || t.Offsets[1]-t.Offsets[0] != w.size || t.Offsets[1] > int64(len(data)) || t.Offsets[0] < 0 {
			return fmt.Errorf("tensor %s is %+v, want %s %v of %d bytes", w.name, t, w.dtype, w.shape, w.size)
		}
		tensor[w.name] = data[t.Offsets[0]:t.Offsets[1]]
		crc.Write(tensor[w.name])
	}
	switch {
	case md["sample"] != strconv.Itoa(idx):
		return fmt.Errorf("metadata sample %q", md["sample"])
	case md["tokens"] != strconv.FormatInt(T, 10):
		return fmt.Errorf("metadata tokens %q, the dataset has %d", md["tokens"], T)
	case !regexp.MustCompile(fmt.Sprintf(`^s%09d-a[1-9]\d*$`, idx)).MatchString(md["rid"]):
		return fmt.Errorf("metadata rid %q is not an attempt of sample %d", md["rid"], idx)
	case md["layers"] != "2,30,58":
		return fmt.Errorf("metadata layers %q", md["layers"])
	case md["crc32c"] != fmt.Sprintf("%08x", crc.Sum32()):
		return fmt.Errorf("metadata crc32c %q, the data's is %08x", md["crc32c"], crc.Sum32())
	}
	ints := func(b []byte) string {
		v := make([]int64, len(b)/8)
		for i := range v {
			v[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
		}
		return fmt.Sprint(v)
	}
	if ints(tensor["input_ids"]) != fmt.Sprint(s.ids) {
		return fmt.Errorf("input_ids differ from the dataset")
	}
	if ints(tensor["loss_mask"]) != fmt.Sprint(s.mask) {
		return fmt.Errorf("loss_mask differs from the dataset")
	}
	row := make([]byte, 2*H)
	for p, tok := range s.ids {
		simulator.FillRow(row, tok, p, 61, int(H))
		if !bytes.Equal(tensor["hidden_state"][int64(p)*2*H:int64(p+1)*2*H], row) {
			return fmt.Errorf("hidden_state row %d differs from the simulator's", p)
		}
		for k, layer := range []int{2, 30, 58} {
			simulator.FillRow(row, tok, p, layer, int(H))
			off := int64(p)*6*H + int64(k)*2*H
			if !bytes.Equal(tensor["aux_hidden_state"][off:off+2*H], row) {
				return fmt.Errorf("aux_hidden_state row %d layer %d differs from the simulator's", p, layer)
			}
		}
	}
	return nil
}

// The checker itself can fail: each fault below is found, and counted under its kind.
func TestTheOutsideCheckerFindsLossCorruptionDuplicatesAndStrays(t *testing.T) {
	j := newJob(t, 6, 0)
	j.mustRun("run")
	if r := j.checkFromOutside(); r.bad() != 0 {
		t.Fatalf("a good job: %+v", r)
	}
	rows := filepath.Join(j.out, "rows_0-2000")
	if err := os.Remove(filepath.Join(rows, "data_0.safetensors")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(rows, "data_1.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 1
	if err := os.WriteFile(filepath.Join(rows, "data_1.safetensors"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	copyTo := func(from, to string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	copyTo(filepath.Join(rows, "data_2.safetensors"), filepath.Join(j.out, "rows_2000-4000", "data_2.safetensors"))
	copyTo(filepath.Join(rows, "data_3.safetensors"), filepath.Join(rows, "notes.txt"))
	r := j.checkFromOutside()
	if r.lost != 1 || r.corrupt != 1 || r.duplicated != 1 || r.stray != 1 {
		t.Fatalf("checker found %+v; want 1 lost, 1 corrupt, 1 duplicated, 1 stray", r)
	}
}
