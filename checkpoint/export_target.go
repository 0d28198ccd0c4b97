package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/extract-dev/extract/internal/atomicfile"
)

// ErrForeignTarget means an export's target folder holds files this export did not
// write: another job's export, another tool's files, or something unreadable under a
// name export would write.
var ErrForeignTarget = errors.New("the export target holds files of another job")

// ErrTargetFull means the target disk ran out of room (ENOSPC, EDQUOT).
var ErrTargetFull = errors.New("the export target disk is full")

// exportMarkerName is the file that names the export a folder holds; written before the
// first file, so that every data file under it is known to be this export's.
const exportMarkerName = ".extract-export.json"

// exportMarker is what makes an export this one: the job's config with the target
// format, its dataset, the target layout.
type exportMarker struct {
	ConfigFingerprint  string `json:"config_fingerprint"`
	DatasetFingerprint string `json:"dataset_fingerprint"`
	Format             string `json:"format"`
}

// maxForeignNamed is how many foreign files a refusal names.
const maxForeignNamed = 5

// claimTarget checks that dst.Dir holds nothing but this export's files and marks it
// as this export's; it returns the samples whose target exists (each to be verified,
// and kept or rewritten). Refused, naming up to a few files: a marker of another
// export, a data file whose record names another job, sample or format, a data name
// that is not a regular file, and (in a folder not yet marked ours) a data file extract
// cannot read as its own.
func claimTarget(dst Layout, mine exportMarker) (map[int]bool, error) {
	marker := filepath.Join(dst.Dir, exportMarkerName)
	marked := false
	switch b, err := readSmallRegular(marker); {
	case err == nil:
		var m exportMarker
		if json.Unmarshal(b, &m) != nil || m != mine {
			return nil, fmt.Errorf("%w: %s says it holds the export of config %s, dataset %.12s…, format %s; this export is config %s, dataset %.12s…, format %s: choose another --to, or move that folder aside",
				ErrForeignTarget, marker, m.ConfigFingerprint, m.DatasetFingerprint, m.Format, mine.ConfigFingerprint, mine.DatasetFingerprint, mine.Format)
		}
		marked = true
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%w: %s: %w", ErrForeignTarget, marker, err)
	}
	dirs, err := dst.DataDirs()
	if err != nil {
		return nil, err
	}
	have := map[int]bool{}
	var foreign []string
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("read export target %s: %w", dir, err)
		}
		for _, e := range entries {
			s, ok := dst.SampleOf(e.Name())
			if !ok {
				continue
			}
			path := filepath.Join(dir, e.Name())
			if why := foreignTarget(path, s, dst, mine, marked); why != "" {
				foreign = append(foreign, path+": "+why)
				continue
			}
			have[s] = true
		}
	}
	if len(foreign) > 0 {
		more := ""
		if len(foreign) > maxForeignNamed {
			more = fmt.Sprintf(" (and %d more)", len(foreign)-maxForeignNamed)
			foreign = foreign[:maxForeignNamed]
		}
		return nil, fmt.Errorf("%w: %s%s: export replaces only files it wrote; choose another --to, or move them aside",
			ErrForeignTarget, strings.Join(foreign, "; "), more)
	}
	if !marked {
		js, _ := json.Marshal(mine)
		if err := atomicfile.MkdirAll(dst.Dir, 0o755); err != nil {
			return nil, err
		}
		if err := atomicfile.WriteFile(marker, append(js, '\n'), 0o644); err != nil {
			return nil, fmt.Errorf("mark export target: %w", err)
		}
	}
	return have, nil
}

// foreignTarget says why the file at a data name is not this export's, "" when it is
// (or, in a folder marked ours, may be a damaged one of ours: verified and rewritten).
func foreignTarget(path string, sample int, dst Layout, mine exportMarker, marked bool) string {
	st, err := os.Lstat(path)
	if err != nil {
		return err.Error()
	}
	if !st.Mode().IsRegular() {
		return "not a regular file"
	}
	info, err := ReadOutput(path, false)
	switch {
	case err != nil && marked:
		return "" // this export's folder: a torn or damaged file of ours, rewritten
	case err != nil:
		return "not a file extract wrote (" + err.Error() + ")"
	case info.ConfigFingerprint != mine.ConfigFingerprint:
		return fmt.Sprintf("another job's file (config %s, this export %s)", info.ConfigFingerprint, mine.ConfigFingerprint)
	case info.DatasetFingerprint != mine.DatasetFingerprint:
		return fmt.Sprintf("another dataset's file (%.12s…)", info.DatasetFingerprint)
	case info.Sample != sample:
		return fmt.Sprintf("its record names sample %d", info.Sample)
	}
	return ""
}

// readSmallRegular reads a small regular file, never through a symlink.
func readSmallRegular(path string) ([]byte, error) {
	f, size, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if size > 1<<16 {
		return nil, fmt.Errorf("%s is %d bytes, not an export marker", path, size)
	}
	b := make([]byte, size)
	_, err = f.ReadAt(b, 0)
	return b, err
}

func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
