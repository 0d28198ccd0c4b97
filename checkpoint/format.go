package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Format is the container and key names of the output files: what a trainer reads.
type Format string

// The output formats (config output.format).
const (
	// FormatSafetensors is output layout v1: rows_<g>-<g+2000>/data_<i>.safetensors with
	// input_ids, loss_mask [T], hidden_state [T,H], aux_hidden_state [T,3H].
	FormatSafetensors Format = "safetensors"
	// FormatSpecForge is what SpecForge's prepare_hidden_states.py writes and its
	// offline reader walks for: rows_<g>-<g+2000>/data_<i>.ckpt[.gz], a torch zip with
	// input_ids, loss_mask [T] int64, hidden_state [1,T,H], aux_hidden_state [1,T,3H] bf16.
	FormatSpecForge Format = "specforge"
	// FormatModelOpt is what Model-Optimizer's offline EAGLE dataset globs for: one flat
	// folder of <i>.pt (its reader globs a single folder, no subfolders), a torch zip with
	// input_ids, loss_mask [T] int64, hidden_states [T,H], aux_hidden_states [T,3H] bf16.
	FormatModelOpt Format = "modelopt"
)

// Formats lists the formats output.format accepts.
var Formats = []Format{FormatSafetensors, FormatSpecForge, FormatModelOpt}

// Layout is where and how one job's outputs are written. The zero Format is safetensors.
type Layout struct {
	Dir    string
	Format Format
	// Gzip wraps each specforge file in gzip (.ckpt.gz), which SpecForge also reads.
	Gzip bool
}

// ParseLayout reads a layout name as Layout.Name writes it ("specforge+gzip"); the
// empty name is safetensors, what an index from before formats holds.
func ParseLayout(dir, name string) (Layout, error) {
	f, gz := strings.CutSuffix(name, "+gzip")
	l := Layout{Dir: dir, Format: Format(f), Gzip: gz}
	if f == "" {
		l.Format = FormatSafetensors
	}
	return l, l.Check()
}

// Check refuses an unknown format, and gzip on anything but specforge.
func (l Layout) Check() error {
	switch l.format() {
	case FormatSafetensors, FormatModelOpt:
		if l.Gzip {
			return fmt.Errorf("output format %s: gzip is for specforge only", l.format())
		}
	case FormatSpecForge:
	default:
		return fmt.Errorf("output format %q: want one of safetensors, specforge, modelopt", l.Format)
	}
	return nil
}

func (l Layout) format() Format {
	if l.Format == "" {
		return FormatSafetensors
	}
	return l.Format
}

// Name is the layout's name in the index and in messages: the format, "+gzip" if so.
func (l Layout) Name() string {
	if l.Gzip {
		return string(l.format()) + "+gzip"
	}
	return string(l.format())
}

// Ext is the file name's extension, dot included.
func (l Layout) Ext() string {
	switch l.format() {
	case FormatSpecForge:
		if l.Gzip {
			return ".ckpt.gz"
		}
		return ".ckpt"
	case FormatModelOpt:
		return ".pt"
	}
	return dataSuffix
}

// grouped says whether files sit in rows_ folders of GroupSize samples.
func (l Layout) grouped() bool { return l.format() != FormatModelOpt }

// Path is where sample's file lives under this layout.
func (l Layout) Path(sample int) string {
	if !l.grouped() {
		return filepath.Join(l.Dir, strconv.Itoa(sample)+l.Ext())
	}
	g := sample / GroupSize * GroupSize
	return filepath.Join(l.Dir, fmt.Sprintf("%s%d-%d", rowsPrefix, g, g+GroupSize), dataPrefix+strconv.Itoa(sample)+l.Ext())
}

// parseName returns the sample of a file name this layout writes; only the canonical
// spelling counts, so that Path of the result names the same file.
func (l Layout) parseName(name string) (int, bool) {
	digits, ok := name, true
	if l.grouped() {
		digits, ok = strings.CutPrefix(digits, dataPrefix)
	}
	if !ok {
		return 0, false
	}
	digits, ok = strings.CutSuffix(digits, l.Ext())
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 || strconv.Itoa(n) != digits {
		return 0, false
	}
	return n, true
}

// isTemp reports whether name is a temp file the writer makes under this layout:
// exactly "." + a data file name + ".tmp". Only these are ever removed.
func (l Layout) isTemp(name string) bool {
	inner, ok := strings.CutPrefix(name, ".")
	if !ok {
		return false
	}
	inner, ok = strings.CutSuffix(inner, tmpSuffix)
	if !ok {
		return false
	}
	_, ok = l.parseName(inner)
	return ok
}

// isDataDir says whether a folder under Dir holds this layout's files (a rows_ group).
func (l Layout) isDataDir(name string) bool {
	return l.grouped() && strings.HasPrefix(name, rowsPrefix)
}

// tensorNames are the dict keys of the format, in canonical order: ids, mask, hidden, aux.
func (l Layout) tensorNames() [4]string {
	if l.format() == FormatModelOpt {
		return [4]string{tensorInputIDs, tensorLossMask, "hidden_states", "aux_hidden_states"}
	}
	return [4]string{tensorInputIDs, tensorLossMask, tensorHidden, tensorAux}
}

// batchDim says whether the hidden tensors carry SpecForge's leading batch dim of 1.
func (l Layout) batchDim() bool { return l.format() == FormatSpecForge }

// SampleOf returns the sample of a data file name this layout writes, in the canonical
// spelling only.
func (l Layout) SampleOf(name string) (int, bool) { return l.parseName(name) }

// IsTemp reports whether name is a temp file this layout's writer makes.
func (l Layout) IsTemp(name string) bool { return l.isTemp(name) }

// DataDirs lists the folders that hold this layout's files: the rows_ groups under Dir,
// or Dir itself for a flat layout. A missing Dir has none.
func (l Layout) DataDirs() ([]string, error) {
	if !l.grouped() {
		if _, err := os.Stat(l.Dir); os.IsNotExist(err) {
			return nil, nil
		}
		return []string{l.Dir}, nil
	}
	entries, err := os.ReadDir(l.Dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read output directory %s: %w", l.Dir, err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() && l.isDataDir(e.Name()) {
			dirs = append(dirs, filepath.Join(l.Dir, e.Name()))
		}
	}
	return dirs, nil
}
