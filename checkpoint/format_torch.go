package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/extract-dev/extract/internal/safetensors"
	"github.com/extract-dev/extract/internal/torchzip"
)

var zipDTypes = map[torchzip.DType]safetensors.DType{
	torchzip.Int64: safetensors.I64, torchzip.BFloat16: safetensors.BF16, torchzip.Float16: "F16",
	torchzip.Float32: "F32", torchzip.Float64: "F64", torchzip.Int32: "I32", torchzip.Int16: "I16",
	torchzip.Int8: "I8", torchzip.Bool: "BOOL", torchzip.Uint8: "U8",
}

// torchRecords are the records besides data.pkl and the storages that torch.save (1.13
// to 2.x) or extract's writer put in a torch zip; a file with any other is rewritten,
// not placed as is.
var torchRecords = map[string]bool{
	"version": true, ".data/version": true, "byteorder": true, ".data/serialization_id": true,
	".format_version": true, ".storage_alignment": true, extractRecord: true,
}

// storageRecord is where a torch zip keeps storage key's bytes.
func storageRecord(key string) string { return "data/" + key }

// fromPickle fills the tensors from data.pkl (which the decoder accepts only in the shape
// a plain torch.save writes); locate gives each storage record's bytes and CRC-32.
func (s *sampleFile) fromPickle(pkl []byte, locate func(key string) (torchzip.File, bool)) error {
	ts, err := torchzip.DecodeDict(pkl)
	if err != nil {
		return err
	}
	var seen [4]bool
	s.keys = map[string]int{}
	for _, t := range ts {
		r, ok := roles[t.Name]
		if !ok || seen[r] {
			s.inexact = fmt.Sprintf("tensor %s is not one of the format's four", t.Name)
			continue
		}
		if !t.Contiguous() {
			return fmt.Errorf("tensor %s is not contiguous (stride %v)", t.Name, t.Stride)
		}
		off, n, err := t.Span()
		if err != nil {
			return fmt.Errorf("tensor %s: %w", t.Name, err)
		}
		ft := fileTensor{name: t.Name, dtype: zipDTypes[t.DType], shape: t.Shape, off: -1, n: n}
		whole := off == 0 && n == t.StorageBytes()
		if !whole {
			s.inexact = fmt.Sprintf("tensor %s is a view of part of its storage", t.Name)
		}
		if rec, ok := locate(t.Key); ok {
			if rec.Size != t.StorageBytes() {
				return fmt.Errorf("storage %s of %s is %d bytes, the pickle says %d", t.Key, t.Name, rec.Size, t.StorageBytes())
			}
			ft.off = rec.Offset + off // both within the record, checked above: no overflow
			ft.zipCRC, ft.hasZipCRC = rec.CRC32, whole
		} else if !s.gz {
			return fmt.Errorf("tensor %s: storage record %s missing", t.Name, storageRecord(t.Key))
		}
		s.keys[t.Key] = r
		s.t[r] = ft
		seen[r] = true
	}
	return s.settle(seen)
}

func (s *sampleFile) openZip() error {
	a, err := torchzip.Open(s.f, s.size)
	if err != nil {
		return err
	}
	pf, ok := a.Get("data.pkl")
	if !ok {
		return errors.New("no data.pkl: not a torch checkpoint")
	}
	pkl, err := torchzip.ReadSmall(s.f, pf, 1<<20)
	if err != nil {
		return err
	}
	if ef, ok := a.Get(extractRecord); ok {
		b, err := torchzip.ReadSmall(s.f, ef, 1<<20)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &s.md); err != nil {
			return fmt.Errorf("%s: %w", extractRecord, err)
		}
	}
	// torch byte-swaps every storage of a file that says "big": the values it loads
	// would not be the bytes checked here.
	if bf, ok := a.Get("byteorder"); ok {
		b, err := torchzip.ReadSmall(s.f, bf, 64)
		if err != nil {
			return err
		}
		if string(b) != "little" {
			return fmt.Errorf("byteorder %q: only little-endian storages are read", b)
		}
	}
	if err := s.fromPickle(pkl, func(key string) (torchzip.File, bool) { return a.Get(storageRecord(key)) }); err != nil {
		return err
	}
	for _, name := range a.Order {
		rel := strings.TrimPrefix(name, a.Prefix+"/")
		if key, ok := strings.CutPrefix(rel, "data/"); ok {
			if _, used := s.keys[key]; used {
				continue
			}
		}
		if rel != "data.pkl" && !torchRecords[rel] && s.inexact == "" {
			s.inexact = fmt.Sprintf("record %s is not one torch.save writes for these tensors", rel)
		}
	}
	return nil
}
