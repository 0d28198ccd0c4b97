package simulator

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/extract-dev/extract/internal/safetensors"
)

// writeDump writes one request's dump by protocol v1: rows are streamed through a
// buffer into <rid>.safetensors.partial, which is renamed to its final name only once
// complete, so a reader never sees a partial file under the final name.
func writeDump(cfg Config, rid string, ids []int64) error {
	h := cfg.HiddenSize
	t := int64(len(ids))
	meta := map[string]string{
		"rid":          rid,
		"protocol":     "1",
		"layers":       joinInts(cfg.Layers),
		"model":        cfg.Model,
		"hook_version": cfg.HookVersion,
	}
	header, _, err := safetensors.EncodeHeader([]safetensors.Spec{
		{Name: "aux_hidden_state", DType: safetensors.BF16, Shape: []int64{t, int64(len(cfg.Layers) * h)}},
		{Name: "hidden_state", DType: safetensors.BF16, Shape: []int64{t, int64(h)}},
		{Name: "input_ids", DType: safetensors.I64, Shape: []int64{t}},
	}, meta)
	if err != nil {
		return fmt.Errorf("encode dump header for rid %s: %w", rid, err)
	}
	final := filepath.Join(cfg.ShmDir, rid+".safetensors")
	partial := final + ".partial"
	f, err := os.Create(partial)
	if err != nil {
		return fmt.Errorf("create dump for rid %s: %w", rid, err)
	}
	if err := writeBody(f, header, cfg, ids); err != nil {
		_ = f.Close()
		_ = os.Remove(partial)
		return fmt.Errorf("write dump %s: %w", partial, err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(partial)
		return fmt.Errorf("close dump %s: %w", partial, err)
	}
	if err := os.Rename(partial, final); err != nil {
		return fmt.Errorf("publish dump for rid %s: %w", rid, err)
	}
	return nil
}

func writeBody(f *os.File, header []byte, cfg Config, ids []int64) error {
	h := cfg.HiddenSize
	w := bufio.NewWriterSize(f, 1<<20)
	if _, err := w.Write(header); err != nil {
		return err
	}
	row := make([]byte, 2*h*len(cfg.Layers))
	for pos, tok := range ids {
		for i, layer := range cfg.Layers {
			FillRow(row[2*h*i:], tok, pos, layer, h)
		}
		if _, err := w.Write(row); err != nil {
			return err
		}
	}
	row = row[:2*h]
	for pos, tok := range ids {
		FillRow(row, tok, pos, cfg.NumLayers, h)
		if _, err := w.Write(row); err != nil {
			return err
		}
	}
	var b [8]byte
	for _, tok := range ids {
		binary.LittleEndian.PutUint64(b[:], uint64(tok))
		if _, err := w.Write(b[:]); err != nil {
			return err
		}
	}
	return w.Flush()
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// writeMarker announces the simulated hook the way the real one does at activation:
// `.hook-<pid>.json` in the staging dir, written by rename.
func writeMarker(cfg Config) (string, error) {
	removeDeadMarkers(cfg.ShmDir)
	path := filepath.Join(cfg.ShmDir, fmt.Sprintf(".hook-%d.json", os.Getpid()))
	b, err := json.Marshal(map[string]any{
		"pid": os.Getpid(), "hook_version": cfg.HookVersion, "protocol": "1",
		"layers": joinInts(cfg.Layers), "model": cfg.Model, "tp_size": cfg.TPSize,
	})
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(path+".tmp", b, 0o644); err != nil {
		return "", fmt.Errorf("write hook marker: %w", err)
	}
	return path, os.Rename(path+".tmp", path)
}

// removeDeadMarkers drops the markers of servers that died without cleaning up, as the
// real hook does, so the markers left always belong to live servers.
func removeDeadMarkers(dir string) {
	matches, _ := filepath.Glob(filepath.Join(dir, ".hook-*.json"))
	for _, m := range matches {
		pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), ".hook-"), ".json"))
		if err != nil {
			continue
		}
		if !alive(pid) {
			_ = os.Remove(m)
		}
	}
}

// alive is false for a pid that is gone or a zombie: a killed server whose parent died
// too waits, unreaped, for an init that may never reap it.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}
