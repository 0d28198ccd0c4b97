package configs

import (
	"errors"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Upper bounds that no real job reaches but that keep products such as BytesPerToken
// (4·hidden·2 bytes) and sums of sizes far from int64 overflow.
const (
	maxHiddenSize = 1 << 20
	maxNumLayers  = 4096
	maxTPSize     = 1024
	maxReplicas   = 1024
	maxInflight   = 1 << 16
	maxMovers     = 1024
	maxAttempts   = 1000
	maxRetries    = 100
	maxCount      = 1 << 20 // health_failures, max_restarts
	maxTokens     = 1 << 24 // server.max_new_tokens
	maxByteSize   = 1 << 60 // 1 EiB
	minLogMaxSize = 1 << 20 // below this the server log is trimmed away before anyone reads it
)

// Validate checks values that decoding cannot; each problem names its key.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, keyError{key, fmt.Sprintf(format, args...)})
	}
	intIn := func(key string, v, lo, hi int) {
		if v < lo || v > hi {
			bad(key, "must be %d..%d, got %d", lo, hi, v)
		}
	}
	if c.Dataset == "" {
		bad("dataset", "required (path to a JSONL file; env %s)", EnvName("dataset"))
	}
	if c.OutputDir == "" {
		bad("output_dir", "required (env %s)", EnvName("output_dir"))
	}
	if c.ShmDir == "" {
		bad("shm_dir", "required")
	}
	// A dataset line's length is kept as an int32; past 1 GiB a line is no prompt.
	if c.DatasetMaxLine < 1<<10 || c.DatasetMaxLine > 1<<30 {
		bad("dataset_max_line", "must be 1KiB..1GiB, got %s", c.DatasetMaxLine)
	}
	intIn("server.isolate_after_deaths", c.Server.IsolateAfterDeaths, 1, maxCount)
	for _, s := range c.Server.Simulator.CrashOnSamples {
		if s < 0 {
			bad("server.simulator.crash_on_samples", "sample indices must be ≥ 0, got %d", s)
		}
	}
	errs = append(errs, c.checkDirs()...)
	switch c.Server.Kind {
	case "sglang":
		if c.Server.ModelPath == "" {
			bad("server.model_path", "required when server.kind is sglang")
		}
	case "transformers":
		if c.Server.ModelPath == "" {
			bad("server.model_path", "required when server.kind is transformers (a local model folder)")
		}
		for _, l := range c.Server.Layers {
			// Layer k is captured at the input of decoder layer k (hidden_states[k]); HF's
			// entry num_layers is the post-norm output, not an input of any layer.
			if l < 1 || l >= c.Server.NumLayers {
				bad("server.layers", "layer %d: server.kind transformers captures at the input of a decoder layer, 1..%d", l, c.Server.NumLayers-1)
			}
		}
	case "simulator":
	default:
		bad("server.kind", "must be sglang, transformers or simulator, got %q", c.Server.Kind)
	}
	// Every listed GPU is used, by exactly one replica: a GPU listed and left idle is more
	// likely a typo in replicas or tp_size than a wish.
	if n := len(c.Server.GPUs); n > 0 && c.Server.Kind != "simulator" && n != c.Server.Replicas*c.Server.TPSize {
		if c.Server.Replicas == 1 {
			bad("server.gpus", "lists %d GPUs but server.tp_size is %d", n, c.Server.TPSize)
		} else {
			bad("server.gpus", "lists %d GPUs but server.replicas %d × server.tp_size %d needs %d", n, c.Server.Replicas, c.Server.TPSize, c.Server.Replicas*c.Server.TPSize)
		}
	}
	tf := c.Server.Transformers
	intIn("server.transformers.max_batch_tokens", tf.MaxBatchTokens, 1, 1<<24)
	intIn("server.transformers.max_batch_requests", tf.MaxBatchRequests, 1, 1<<16)
	if !slices.Contains([]string{"bfloat16", "float16", "float32"}, tf.Dtype) {
		bad("server.transformers.dtype", "must be bfloat16, float16 or float32, got %q (dumps are bf16 whatever the compute dtype)", tf.Dtype)
	}
	// Both widths are checked whichever kind runs: the other one is a switch of
	// server.kind away from being used.
	intIn("server.hidden_size", c.Server.HiddenSize, 1, maxHiddenSize)
	intIn("server.simulator.hidden_size", c.Server.Simulator.HiddenSize, 1, maxHiddenSize)
	sim := c.Server.Simulator
	if math.IsNaN(sim.TokensPerSecond) || math.IsInf(sim.TokensPerSecond, 0) || sim.TokensPerSecond < 0 {
		bad("server.simulator.tokens_per_second", "must be a number ≥ 0 (0 = as fast as possible), got %g", sim.TokensPerSecond)
	}
	for key, n := range map[string]int{
		"server.simulator.exit_after": sim.ExitAfter, "server.simulator.hang_after": sim.HangAfter,
		"server.simulator.fail_503_every": sim.Fail503Every, "server.simulator.corrupt_every": sim.CorruptEvery,
	} {
		if n < 0 {
			bad(key, "must be ≥ 0 (0 = never), got %d", n)
		}
	}
	if c.Server.Host == "" {
		bad("server.host", "required (the address the server listens on, e.g. 127.0.0.1)")
	}
	if c.Server.Port < 1 || c.Server.Port > 65535 {
		bad("server.port", "must be 1..65535, got %d", c.Server.Port)
	}
	intIn("server.tp_size", c.Server.TPSize, 1, maxTPSize)
	intIn("server.replicas", c.Server.Replicas, 1, maxReplicas)
	if last := c.Server.Port + c.Server.Replicas - 1; c.Server.Replicas > 1 && c.Server.Port >= 1 && last > 65535 {
		bad("server.port", "replica %d would listen on port %d (server.port %d + replica): lower server.port", c.Server.Replicas-1, last, c.Server.Port)
	}
	seen := map[int]bool{}
	for _, g := range c.Server.GPUs {
		if g < 0 || seen[g] {
			bad("server.gpus", "must list distinct GPU indices ≥ 0, got %v", c.Server.GPUs)
			break
		}
		seen[g] = true
	}
	if f := c.Server.MemFraction; math.IsNaN(f) || f < 0 || f >= 1 {
		bad("server.mem_fraction", "must be in (0, 1), or 0 for SGLang's default; got %g", f)
	}
	intIn("server.num_layers", c.Server.NumLayers, 1, maxNumLayers)
	if len(c.Server.Layers) != 3 {
		bad("server.layers", "must list the 3 captured layers (effective layers_to_capture), got %v", c.Server.Layers)
	}
	for i, l := range c.Server.Layers {
		if l < 0 || l > c.Server.NumLayers {
			bad("server.layers", "layer %d outside 0..%d (server.num_layers)", l, c.Server.NumLayers)
		}
		if slices.Contains(c.Server.Layers[:i], l) {
			bad("server.layers", "layer %d is listed twice in %v", l, c.Server.Layers)
		}
	}
	intIn("server.max_new_tokens", c.Server.MaxNewTokens, 0, maxTokens)
	intIn("server.health_failures", c.Server.HealthFailures, 1, maxCount)
	intIn("server.max_restarts", c.Server.MaxRestarts, 0, maxCount)
	intIn("run.max_inflight", c.Run.MaxInflight, 1, maxInflight)
	intIn("run.max_attempts", c.Run.MaxAttempts, 1, maxAttempts)
	intIn("run.movers", c.Run.Movers, 1, maxMovers)
	intIn("run.request_retries", c.Run.RequestRetries, 0, maxRetries)
	for key, d := range map[string]time.Duration{
		"run.dump_timeout": c.Run.DumpTimeout, "run.request_timeout": c.Run.RequestTimeout,
		"server.startup_timeout": c.Server.StartupTimeout, "server.health_interval": c.Server.HealthInterval,
		"server.health_timeout": c.Server.HealthTimeout, "server.restart_window": c.Server.RestartWindow,
	} {
		if d <= 0 {
			bad(key, "must be a positive duration (e.g. 5m)")
		}
	}
	for key, d := range map[string]time.Duration{
		"run.drain_timeout":                c.Run.DrainTimeout,
		"server.simulator.startup_delay":   sim.StartupDelay,
		"server.simulator.late_dump_delay": sim.LateDumpDelay,
		"server.simulator.decode_delay":    sim.DecodeDelay,
	} {
		if d < 0 {
			bad(key, "must be a duration ≥ 0, got %s", d)
		}
	}
	for key, b := range map[string]ByteSize{
		"shm_budget": c.ShmBudget, "disk.reserve": c.Disk.Reserve, "server.log_max_size": c.Server.LogMaxSize,
	} {
		if b < 0 || b > maxByteSize {
			bad(key, "must be 0..%s, got %d bytes", ByteSize(maxByteSize), int64(b))
		}
	}
	if c.Server.LogMaxSize < minLogMaxSize {
		bad("server.log_max_size", "must be ≥ %s, got %s (smaller trims the server log away before it can be read)", ByteSize(minLogMaxSize), c.Server.LogMaxSize)
	}
	if c.Status.Listen != "" {
		if _, port, err := net.SplitHostPort(c.Status.Listen); err != nil {
			bad("status.listen", "want host:port: %v", err)
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			bad("status.listen", "port %q must be a number 0..65535 (0 = any free port)", port)
		}
	}
	if c.Shard.Count < 0 || c.Shard.Count > MaxShards {
		bad("shard.count", "must be 0..%d (0 = not sharded), got %d", MaxShards, c.Shard.Count)
	} else if c.Shard.Count == 0 && c.Shard.Index != 0 {
		bad("shard.index", "is %d but shard.count is 0 (not sharded); set shard.count", c.Shard.Index)
	} else if c.Shard.Count > 0 && (c.Shard.Index < 0 || c.Shard.Index >= c.Shard.Count) {
		bad("shard.index", "must be 0..%d for shard.count %d, got %d", c.Shard.Count-1, c.Shard.Count, c.Shard.Index)
	}
	if c.Disk.WhenShort != "refuse" && c.Disk.WhenShort != "warn" {
		bad("disk.when_short", "must be refuse or warn, got %q", c.Disk.WhenShort)
	}
	switch c.Output.Format {
	case "safetensors", "specforge", "modelopt":
	default:
		bad("output.format", "must be safetensors, specforge or modelopt, got %q", c.Output.Format)
	}
	switch {
	case c.Output.Compress != "none" && c.Output.Compress != "gzip":
		bad("output.compress", "must be none or gzip, got %q", c.Output.Compress)
	case c.Output.Compress == "gzip" && c.Output.Format != "specforge":
		bad("output.compress", "gzip is for output.format specforge only (SpecForge reads .ckpt.gz; %s readers do not)", c.Output.Format)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "must be debug, info, warn or error")
	}
	errs = append(errs, c.checkPrepare()...)
	errs = append(errs, c.checkGenerate()...)
	return errors.Join(errs...)
}

// checkDirs keeps the job's directories apart. The staging dir is world-writable and
// extract empties it, so nothing else may live in or above it; outputs and state are
// each other's only when state_dir sits inside output_dir (the default, .extract).
func (c *Config) checkDirs() []error {
	type dir struct{ key, path string }
	out, state, shm := dir{"output_dir", c.OutputDir}, dir{"state_dir", c.StateDir}, dir{"shm_dir", c.ShmDir}
	var errs []error
	refuse := func(a, b dir, rel string) {
		errs = append(errs, keyError{a.key, fmt.Sprintf("%s %s %s %s: keep them apart", a.path, rel, b.key, b.path)})
	}
	// Each pair once, so a shared directory is one message, not two.
	check := func(a, b dir, aInBOK bool) {
		if a.path == "" || b.path == "" {
			return
		}
		switch {
		case relation(a.path, b.path) == same:
			refuse(a, b, "is the same directory as")
		case relation(a.path, b.path) == inside && !aInBOK:
			refuse(a, b, "is inside")
		case relation(b.path, a.path) == inside:
			refuse(b, a, "is inside")
		}
	}
	check(out, shm, false)
	check(state, shm, false)
	check(state, out, true)
	if c.Dataset != "" && c.ShmDir != "" && relation(c.Dataset, c.ShmDir) == inside {
		errs = append(errs, keyError{"dataset", fmt.Sprintf("%s is inside shm_dir %s, which is world-writable and emptied by extract: keep the dataset elsewhere", c.Dataset, c.ShmDir)})
	}
	return errs
}

type pathRelation int

// relation compares a and b as written (cleaned, absolute) and with the symlinks of
// their existing parts resolved, so a link to the staging dir is still the staging dir.
func relation(a, b string) pathRelation {
	r := lexicalRelation(absClean(a), absClean(b))
	if r != apart {
		return r
	}
	return lexicalRelation(resolveExisting(a), resolveExisting(b))
}

func lexicalRelation(a, b string) pathRelation {
	switch {
	case a == b:
		return same
	case strings.HasPrefix(a, strings.TrimSuffix(b, string(filepath.Separator))+string(filepath.Separator)):
		return inside
	}
	return apart
}

func absClean(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return filepath.Clean(p)
}

// resolveExisting resolves the symlinks of p's longest existing ancestor and appends
// the rest, which does not exist yet and so cannot be a link.
func resolveExisting(p string) string {
	p = absClean(p)
	var rest []string
	for cur := p; ; {
		if r, err := filepath.EvalSymlinks(cur); err == nil {
			slices.Reverse(rest)
			return filepath.Join(append([]string{r}, rest...)...)
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return p
		}
		rest = append(rest, filepath.Base(cur))
		cur = parent
	}
}

const (
	apart pathRelation = iota
	same
	inside // the first path is below the second
)
