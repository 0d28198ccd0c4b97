package checkpoint

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// GroupSize is the number of samples per rows_ directory, as SpecForge groups them.
const GroupSize = 2000

const (
	dataPrefix = "data_"
	dataSuffix = ".safetensors"
	rowsPrefix = "rows_"
	tmpSuffix  = ".tmp"
)

// OutputPath is where sample's output lives: <out>/rows_<g>-<g+2000>/data_<sample>.safetensors.
func OutputPath(outputDir string, sample int) string {
	g := sample / GroupSize * GroupSize
	return filepath.Join(outputDir, fmt.Sprintf("%s%d-%d", rowsPrefix, g, g+GroupSize), dataPrefix+strconv.Itoa(sample)+dataSuffix)
}

// tempPath is the name an output is written under before its rename. It is hidden and
// deterministic, so a retry overwrites a crashed attempt's file instead of leaving litter.
func tempPath(final string) string {
	return filepath.Join(filepath.Dir(final), "."+filepath.Base(final)+tmpSuffix)
}

// isTempName reports whether a file name inside a rows_ directory is a temp file the
// mover writes: exactly tempPath's ".data_<sample>.safetensors.tmp". Verify removes
// only these; any other ".*.tmp" is someone else's and stays.
func isTempName(name string) bool {
	inner, ok := strings.CutPrefix(name, ".")
	if !ok {
		return false
	}
	inner, ok = strings.CutSuffix(inner, tmpSuffix)
	if !ok {
		return false
	}
	_, ok = parseDataName(inner)
	return ok
}

// parseDataName returns the sample of "data_<n>.safetensors". Only the canonical
// spelling counts, so that OutputPath of the result names the same file.
func parseDataName(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, dataPrefix)
	if !ok {
		return 0, false
	}
	digits, ok = strings.CutSuffix(digits, dataSuffix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 || strconv.Itoa(n) != digits {
		return 0, false
	}
	return n, true
}
