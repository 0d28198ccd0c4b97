package checkpoint

import (
	"path/filepath"
)

// GroupSize is the number of samples per rows_ directory, as SpecForge groups them.
const GroupSize = 2000

const (
	dataPrefix = "data_"
	dataSuffix = ".safetensors"
	rowsPrefix = "rows_"
	tmpSuffix  = ".tmp"
)

// OutputPath is where sample's output lives in the default format (safetensors):
// <out>/rows_<g>-<g+2000>/data_<sample>.safetensors. Layout.Path serves every format.
func OutputPath(outputDir string, sample int) string {
	return Layout{Dir: outputDir}.Path(sample)
}

// tempPath is the name an output is written under before its rename. It is hidden and
// deterministic, so a retry overwrites a crashed attempt's file instead of leaving litter.
func tempPath(final string) string {
	return filepath.Join(filepath.Dir(final), "."+filepath.Base(final)+tmpSuffix)
}

// isTempName and parseDataName are Layout.isTemp and Layout.parseName of safetensors.
func isTempName(name string) bool { return Layout{}.isTemp(name) }

func parseDataName(name string) (int, bool) { return Layout{}.parseName(name) }
