package prepare

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/extract-dev/extract/internal/atomicfile"
	"github.com/extract-dev/extract/internal/userfile"
)

// ManifestName is the prepare dir's record of what it holds, rewritten (temp, fsync,
// rename) after each chunk: a chunk counts only once the manifest lists it.
const ManifestName = "manifest.json"

// manifestVersion changes when the files' layout or meaning changes.
const manifestVersion = 1

// Fingerprint is what prepared data is a pure function of. Each part is a digest, so a
// refused resume can name the part that changed.
type Fingerprint struct {
	Conversations string `json:"conversations"` // sha256 of the conversation file
	Tokenizer     string `json:"tokenizer"`     // digest of the tokenizer's files
	Template      string `json:"template"`      // digest of the chat template used
	Options       string `json:"options"`       // digest of the prepare.* keys that shape the output
}

// Sum is the whole fingerprint as one digest (16 hex digits, as the config's).
func (f Fingerprint) Sum() string {
	h := sha256.Sum256([]byte(f.Conversations + "\n" + f.Tokenizer + "\n" + f.Template + "\n" + f.Options))
	return hex.EncodeToString(h[:])[:16]
}

// Diff names the parts of f that differ from g, for a refused resume.
func (f Fingerprint) Diff(g Fingerprint) []string {
	var out []string
	for _, p := range []struct{ name, a, b string }{
		{"the conversation file", f.Conversations, g.Conversations},
		{"the tokenizer files", f.Tokenizer, g.Tokenizer},
		{"the chat template", f.Template, g.Template},
		{"the prepare options", f.Options, g.Options},
	} {
		if p.a != p.b {
			out = append(out, p.name)
		}
	}
	return out
}

// Chunk is one durable piece of output: the results of source lines [FirstLine, LastLine].
type Chunk struct {
	Index     int    `json:"index"`
	FirstLine int    `json:"first_line"`
	LastLine  int    `json:"last_line"`
	End       int64  `json:"end"` // byte offset in the conversation file after LastLine
	Accepted  int    `json:"accepted"`
	Counts    Counts `json:"counts"`
	SHA256    string `json:"sha256"` // of the chunk's accepted file
}

// Manifest is manifest.json.
type Manifest struct {
	Version     int         `json:"version"`
	Source      string      `json:"source"`
	Fingerprint Fingerprint `json:"fingerprint"`
	ChunkLines  int         `json:"chunk_lines"`
	VocabSize   int         `json:"vocab_size"`
	Chunks      []Chunk     `json:"chunks"`
	Complete    bool        `json:"complete"`
	Counts      Counts      `json:"counts"` // all chunks', once complete
	Samples     int         `json:"samples"`
	DatasetSHA  string      `json:"dataset_sha256,omitempty"`
}

// ReadManifest reads dir's manifest; ok is false when there is none.
func ReadManifest(dir string) (m Manifest, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if errors.Is(err, os.ErrNotExist) {
		return Manifest{}, false, nil
	}
	if err != nil {
		return Manifest{}, false, fmt.Errorf("read prepare manifest: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, false, fmt.Errorf("prepare manifest %s: %w", filepath.Join(dir, ManifestName), err)
	}
	if m.Version != manifestVersion {
		return Manifest{}, false, fmt.Errorf("prepare manifest %s has version %d, this build writes %d", filepath.Join(dir, ManifestName), m.Version, manifestVersion)
	}
	return m, true, nil
}

func writeManifest(dir string, m Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, ManifestName), append(b, '\n'), 0o644)
}

// hashFile is the sha256 of a file's bytes (the conversation file, which may be a
// symlink to one, or a chunk of ours).
func hashFile(path string) (string, int64, error) {
	f, err := userfile.OpenRegular(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, f, make([]byte, 1<<20))
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// openRegular opens path for reading only if it is a regular file, never through a
// symlink at the last component and never blocking on a FIFO.
func openRegular(path string) (*os.File, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	f, err := os.OpenFile(path, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return f, nil
}

// digest is the sha256 of the given lines, for the options part of the fingerprint.
func digest(lines ...string) string {
	h := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(h[:])
}

// Clear removes what prepare wrote in dir, by name, and nothing else: the manifest
// first (so a kill midway leaves a dir that prepares again), then the assembled files,
// the chunks and the worker copy.
func Clear(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	names := []string{filepath.Join(dir, ManifestName), filepath.Join(dir, DatasetName), filepath.Join(dir, RefusedName)}
	chunks, _ := filepath.Glob(filepath.Join(dir, "chunks", "chunk-[0-9]*.jsonl"))
	names = append(names, chunks...)
	for _, n := range names {
		if err := os.Remove(n); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("clear the prepared data: %w", err)
		}
	}
	return atomicfile.SyncDir(dir)
}
