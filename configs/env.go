package configs

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// envNotKeys are EXTRACT_* variables that are no config key by design, so checkEnv
// must not call them typos. Each names who reads it.
var envNotKeys = map[string]string{
	"EXTRACT_CONFIG":         "cmd/extract: the config file, the default of --config",
	"EXTRACT_SERVER_ID":      "sglang: marks the server's processes as this job's (process.go, owner.go)",
	"EXTRACT_BENCH_OUT":      "checkpoint's mover benchmark and scripts/bench.sh: the output dir to measure",
	"EXTRACT_TEST_INHERITED": "sglang's launch test: an inherited variable it looks for",
	"EXTRACT_PROFILE_DIR":    "cmd/extract: write CPU, block and mutex profiles there at exit (docs/performance.md)",
	// The test suites' own switches: set for `go test ./...`, they reach every extract
	// the end-to-end tests start.
	"EXTRACT_CI_REQUIRE":   "internal/testsupport: the kinds of test that must run, not skip (.ci/run)",
	"EXTRACT_CI_REPORT":    "internal/testsupport: the file each required kind's outcome is appended to (.ci/run)",
	"EXTRACT_TEST_DEVICE":  "sglang/hook/test_real_sglang.py: the torch device of the real-SGLang cases (cpu, cuda)",
	"EXTRACT_SGLANG_SRC":   "sglang/hook/test_real_sglang.py: the SGLang checkouts, instead of ../shared/sglang-src",
	"EXTRACT_TORCH_PYTHON": "sglang/hook/test_real_sglang.py: a Python with torch, instead of the first one found",
}

// checkEnv refuses an EXTRACT_* variable that names no key: viper would ignore it, and
// a job would run with a setting the operator believes changed.
func checkEnv(environ []string) error {
	known := map[string]string{}
	for key := range flatten(Default()) {
		known[EnvName(key)] = key
	}
	var errs []error
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "EXTRACT_") {
			continue
		}
		// An empty value is most often a script's unset variable (EXTRACT_OUTPUT_DIR=$OUT):
		// taken as unset it would move the job, taken as "" it is no path at all.
		if val == "" && (known[name] != "" || name == "EXTRACT_CONFIG") {
			errs = append(errs, fmt.Errorf("env %s is set but empty: give it a value or unset it (`unset %s`)", name, name))
			continue
		}
		if known[name] != "" || envNotKeys[name] != "" {
			continue
		}
		best, bestD := "", math.MaxInt
		for env := range known {
			if d := editDistance(name, env); d < bestD || d == bestD && env < best {
				best, bestD = env, d
			}
		}
		if bestD <= max(3, len(name)/4) {
			errs = append(errs, fmt.Errorf("env %s names no config key; did you mean %s (%s)?", name, best, known[best]))
		} else {
			errs = append(errs, fmt.Errorf("env %s names no config key (the keys are in docs/configuration.md; unset it)", name))
		}
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// EnvName is the environment variable that overrides key.
func EnvName(key string) string {
	return "EXTRACT_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}
