// Package configs defines the job's configuration, loads it from YAML, EXTRACT_* env and
// flags (viper), and ships the demo and production configs as files beside it.
package configs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// ErrInvalid marks a configuration the user must fix (exit 2).
var ErrInvalid = errors.New("invalid config")

// Config is one extraction job. Every key is settable in YAML, by env EXTRACT_<KEY>
// (nested keys joined with _) and, for the common ones, by flags.
type Config struct {
	Dataset   string   `mapstructure:"dataset"`
	OutputDir string   `mapstructure:"output_dir"`
	StateDir  string   `mapstructure:"state_dir"` // default <output_dir>/.extract
	ShmDir    string   `mapstructure:"shm_dir"`
	ShmBudget ByteSize `mapstructure:"shm_budget"` // 0: half of the staging filesystem
	Server    Server   `mapstructure:"server"`
	Run       Run      `mapstructure:"run"`
	Disk      Disk     `mapstructure:"disk"`
	Output    Output   `mapstructure:"output"`
	Status    Status   `mapstructure:"status"`
	Log       Log      `mapstructure:"log"`
	Shard     Shard    `mapstructure:"shard"`
}

// Server describes the SGLang server (or the simulator standing in for it).
type Server struct {
	Kind      string `mapstructure:"kind"` // sglang | transformers | simulator
	Host      string `mapstructure:"host"`
	Port      int    `mapstructure:"port"`
	ModelPath string `mapstructure:"model_path"`
	TPSize    int    `mapstructure:"tp_size"`
	// Replicas is how many servers of tp_size GPUs each the job runs on this node; replica
	// r takes GPUs gpus[r*tp_size:(r+1)*tp_size] and port port+r.
	Replicas       int               `mapstructure:"replicas"`
	GPUs           []int             `mapstructure:"gpus"`
	MemFraction    float64           `mapstructure:"mem_fraction"`
	ExtraArgs      []string          `mapstructure:"extra_args"`
	Env            map[string]string `mapstructure:"env"`
	Python         string            `mapstructure:"python"`
	NumLayers      int               `mapstructure:"num_layers"`
	HiddenSize     int               `mapstructure:"hidden_size"`
	Layers         []int             `mapstructure:"layers"` // effective layers_to_capture
	MaxNewTokens   int               `mapstructure:"max_new_tokens"`
	StartupTimeout time.Duration     `mapstructure:"startup_timeout"`
	// HealthInterval, HealthTimeout and HealthFailures define a hang: that many probes
	// of /health_generate in a row failing or timing out.
	HealthInterval time.Duration `mapstructure:"health_interval"`
	HealthTimeout  time.Duration `mapstructure:"health_timeout"`
	HealthFailures int           `mapstructure:"health_failures"`
	// MaxRestarts deaths or hangs within RestartWindow end the run with exit 75.
	MaxRestarts   int           `mapstructure:"max_restarts"`
	RestartWindow time.Duration `mapstructure:"restart_window"`
	LogMaxSize    ByteSize      `mapstructure:"log_max_size"`
	Simulator     Simulator     `mapstructure:"simulator"`
	Transformers  Transformers  `mapstructure:"transformers"`
}

// Transformers configures extract's own server over a Hugging Face model
// (server.kind: transformers; see docs/server.md).
type Transformers struct {
	// MaxBatchTokens bounds one forward: longest prompt × prompts in the batch.
	MaxBatchTokens   int    `mapstructure:"max_batch_tokens"`
	MaxBatchRequests int    `mapstructure:"max_batch_requests"`
	Dtype            string `mapstructure:"dtype"` // bfloat16 | float16 | float32
	// AttnImplementation goes to from_pretrained when set: sdpa, eager, flash_attention_2.
	AttnImplementation string `mapstructure:"attn_implementation"`
}

// Simulator configures the embedded SGLang simulator (server.kind: simulator).
type Simulator struct {
	TokensPerSecond float64       `mapstructure:"tokens_per_second"`
	HiddenSize      int           `mapstructure:"hidden_size"`
	StartupDelay    time.Duration `mapstructure:"startup_delay"`
	ExitAfter       int           `mapstructure:"exit_after"`
	HangAfter       int           `mapstructure:"hang_after"`
	Fail503Every    int           `mapstructure:"fail_503_every"`
	CorruptEvery    int           `mapstructure:"corrupt_every"`
	LateDumpDelay   time.Duration `mapstructure:"late_dump_delay"`
	// RequestLog is a file the simulator appends "rid port" of every request to (tests);
	// replicas share it (O_APPEND, one write a line).
	RequestLog string `mapstructure:"request_log"`
}

// Run tunes the pipeline.
type Run struct {
	MaxInflight    int           `mapstructure:"max_inflight"`
	MaxAttempts    int           `mapstructure:"max_attempts"`
	DumpTimeout    time.Duration `mapstructure:"dump_timeout"`
	RequestTimeout time.Duration `mapstructure:"request_timeout"`
	RequestRetries int           `mapstructure:"request_retries"`
	Movers         int           `mapstructure:"movers"`
	DrainTimeout   time.Duration `mapstructure:"drain_timeout"`
}

// Disk guards the output disk.
type Disk struct {
	Reserve ByteSize `mapstructure:"reserve"` // bytes kept free on the output disk
	// WhenShort decides a start whose remaining samples do not fit above the reserve:
	// "warn" (start, and let admission pause at the reserve until room returns, the
	// default) or "refuse" (exit 3, for a job that must not start short).
	WhenShort string `mapstructure:"when_short"`
}

// Output chooses the files a trainer reads (docs/formats.md).
type Output struct {
	// Format is safetensors (extract's layout v1), specforge (rows_*/data_<i>.ckpt, torch
	// zip, SpecForge's keys and shapes) or modelopt (flat <i>.pt, Model-Optimizer's keys).
	Format string `mapstructure:"format"`
	// Compress is none or gzip (specforge only: data_<i>.ckpt.gz).
	Compress string `mapstructure:"compress"`
}

// LayoutName is the output layout as checkpoint names it: the format, "+gzip" if so.
func (o Output) LayoutName() string {
	if o.Compress == "gzip" {
		return o.Format + "+gzip"
	}
	return o.Format
}

// Status configures the live status and metrics endpoint.
type Status struct {
	Listen string `mapstructure:"listen"`
}

// Log configures logging.
type Log struct {
	Level string `mapstructure:"level"`
}

// Default is the configuration before any file, env or flag is applied.
func Default() Config {
	return Config{
		ShmDir: "/dev/shm/sglang_hs",
		Server: Server{
			Kind:           "sglang",
			Host:           "127.0.0.1",
			Port:           30000,
			TPSize:         1,
			Replicas:       1,
			Python:         "python3",
			NumLayers:      61,
			HiddenSize:     7168,
			Layers:         []int{2, 30, 58},
			MaxNewTokens:   1,
			StartupTimeout: 40 * time.Minute,
			HealthInterval: 15 * time.Second,
			HealthTimeout:  60 * time.Second,
			HealthFailures: 3,
			MaxRestarts:    3,
			RestartWindow:  30 * time.Minute,
			LogMaxSize:     256 << 20,
			Simulator:      Simulator{HiddenSize: 64},
			Transformers:   Transformers{MaxBatchTokens: 16384, MaxBatchRequests: 64, Dtype: "bfloat16"},
		},
		Run: Run{
			MaxInflight:    32,
			MaxAttempts:    5,
			DumpTimeout:    5 * time.Minute,
			RequestTimeout: 30 * time.Minute,
			RequestRetries: 4,
			Movers:         4,
			DrainTimeout:   2 * time.Minute,
		},
		Disk:   Disk{Reserve: 1 << 30, WhenShort: "warn"},
		Output: Output{Format: "safetensors", Compress: "none"},
		Status: Status{Listen: "127.0.0.1:0"},
		Log:    Log{Level: "info"},
	}
}

// upperEnvKeys undoes viper's folding of map keys to lower case for server.env: the
// server would otherwise get hf_home=... for HF_HOME. Environment variable names are
// taken as upper case.
func upperEnvKeys(env map[string]string) map[string]string {
	if env == nil {
		return nil
	}
	out := make(map[string]string, len(env))
	for k, v := range env {
		out[strings.ToUpper(k)] = v
	}
	return out
}

// Flag binds a command-line flag to a config key.
type Flag struct {
	Key  string
	Flag *pflag.Flag
}

// Load reads the config file (if any), then EXTRACT_* env, then the given flags, validates
// the result and makes its paths absolute. Relative paths from the file resolve against
// the file's folder; those from env or flags against the working directory.
func Load(file string, flags []Flag) (*Config, error) {
	return LoadShard(file, flags, "")
}

// LoadShard is Load with the --shard flag's value ("i/n", "auto" or "auto/n"; "" leaves
// the shard keys as file and env set them). A sharded config's state_dir and shm_dir
// are the shard's own subdirs (see Shard).
func LoadShard(file string, flags []Flag, shard string) (*Config, error) {
	if err := checkEnv(os.Environ()); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	v := viper.New()
	v.SetEnvPrefix("EXTRACT")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	// Without a default, viper's Unmarshal never sees a key that only env sets.
	for key, val := range flatten(Default()) {
		v.SetDefault(key, val)
	}
	if file != "" {
		v.SetConfigFile(file)
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("%w: read %s: %v", ErrInvalid, file, err)
		}
	}
	for _, f := range flags {
		if err := v.BindPFlag(f.Key, f.Flag); err != nil {
			return nil, fmt.Errorf("bind flag --%s: %w", f.Flag.Name, err)
		}
	}
	var c Config
	err := v.UnmarshalExact(&c, viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(
		mapstructure.StringToTimeDurationHookFunc(),
		mapstructure.StringToWeakSliceHookFunc(","),
		byteSizeHook,
	)))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, describe(file), err)
	}
	c.Server.Env = upperEnvKeys(c.Server.Env)
	base := ""
	if file != "" {
		abs, err := filepath.Abs(file)
		if err != nil {
			return nil, err
		}
		base = filepath.Dir(abs)
	}
	for key, p := range map[string]*string{
		"dataset": &c.Dataset, "output_dir": &c.OutputDir, "state_dir": &c.StateDir,
		"shm_dir": &c.ShmDir, "server.model_path": &c.Server.ModelPath,
	} {
		*p = resolve(*p, base, fromFile(v, key, flags))
	}
	if c.StateDir == "" && c.OutputDir != "" {
		c.StateDir = filepath.Join(c.OutputDir, ".extract")
	}
	if err := c.resolveShard(shard, os.Getenv); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, describe(file), err)
	}
	return &c, nil
}

func describe(file string) string {
	if file == "" {
		return "config from env and flags"
	}
	return file
}

// fromFile says whether key's value came from the config file rather than env or a flag.
func fromFile(v *viper.Viper, key string, flags []Flag) bool {
	if _, ok := os.LookupEnv(EnvName(key)); ok {
		return false
	}
	for _, f := range flags {
		if f.Key == key && f.Flag.Changed {
			return false
		}
	}
	return v.InConfig(key)
}

// envNotKeys are EXTRACT_* variables that are no config key by design, so checkEnv
// must not call them typos. Each names who reads it.
var envNotKeys = map[string]string{
	"EXTRACT_CONFIG":         "cmd/extract: the config file, the default of --config",
	"EXTRACT_SERVER_ID":      "sglang: marks the server's processes as this job's (process.go, owner.go)",
	"EXTRACT_BENCH_OUT":      "checkpoint's mover benchmark and scripts/bench.sh: the output dir to measure",
	"EXTRACT_TEST_INHERITED": "sglang's launch test: an inherited variable it looks for",
	"EXTRACT_PROFILE_DIR":    "cmd/extract: write CPU, block and mutex profiles there at exit (docs/performance.md)",
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
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "EXTRACT_") || known[name] != "" || envNotKeys[name] != "" {
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

func resolve(p, base string, inFile bool) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	if inFile && base != "" {
		return filepath.Join(base, p)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return abs
}

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
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
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
		errs = append(errs, fmt.Errorf("%s %s %s %s %s: keep them apart", a.key, a.path, rel, b.key, b.path))
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
		errs = append(errs, fmt.Errorf("dataset %s is inside shm_dir %s, which is world-writable and emptied by extract: keep the dataset elsewhere", c.Dataset, c.ShmDir))
	}
	return errs
}

type pathRelation int

const (
	apart pathRelation = iota
	same
	inside // the first path is below the second
)

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

// HiddenSize is the width of the dumps this job expects.
func (c *Config) HiddenSize() int {
	if c.Server.Kind == "simulator" {
		return c.Server.Simulator.HiddenSize
	}
	return c.Server.HiddenSize
}

// GPUIndices are the NVML indices the servers will use, every replica's: server.gpus,
// else the first replicas·tp_size GPUs, which is what SGLang takes without
// CUDA_VISIBLE_DEVICES.
func (c *Config) GPUIndices() []int {
	if len(c.Server.GPUs) > 0 {
		return c.Server.GPUs
	}
	out := make([]int, c.replicas()*c.Server.TPSize)
	for i := range out {
		out[i] = i
	}
	return out
}

func (c *Config) replicas() int { return max(c.Server.Replicas, 1) }

// ReplicaGPUs are replica r's GPUs: GPUIndices()[r*tp_size:(r+1)*tp_size].
func (c *Config) ReplicaGPUs(r int) []int {
	all := c.GPUIndices()
	lo, hi := r*c.Server.TPSize, (r+1)*c.Server.TPSize
	if hi > len(all) {
		return nil
	}
	return all[lo:hi]
}

// ReplicaPort is the port replica r listens on: server.port + r.
func (c *Config) ReplicaPort(r int) int { return c.Server.Port + r }

// StagingDir is where replica r's server dumps: shm_dir itself for a single server (the
// layout of a job without replicas), shm_dir/r<r> when there are several, so a replica's
// restart discards only its own partial dumps and its hook marker sits alone.
func (c *Config) StagingDir(r int) string {
	if c.replicas() == 1 {
		return c.ShmDir
	}
	return filepath.Join(c.ShmDir, fmt.Sprintf("r%d", r))
}

// StagingDirs are the dirs where dumps of this job can be: shm_dir and every existing
// shm_dir/r<k>, whatever server.replicas is now, so leftovers of a run with another
// number of replicas are still found (and adopted). Replicas' dirs that do not exist yet
// are listed too.
func (c *Config) StagingDirs() []string {
	dirs := []string{c.ShmDir}
	seen := map[string]bool{c.ShmDir: true}
	add := func(d string) {
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	for r := range c.replicas() {
		add(c.StagingDir(r))
	}
	entries, _ := os.ReadDir(c.ShmDir)
	for _, e := range entries {
		var k int
		if e.IsDir() && e.Type()&os.ModeSymlink == 0 {
			if _, err := fmt.Sscanf(e.Name(), "r%d", &k); err == nil && e.Name() == fmt.Sprintf("r%d", k) {
				add(filepath.Join(c.ShmDir, e.Name()))
			}
		}
	}
	return dirs
}

// BytesPerToken is the size of one token's row in a dump: 3 captured layers and the
// final one in bf16, plus its int64 input id.
func (c *Config) BytesPerToken() int64 { return int64(4*c.HiddenSize())*2 + 8 }

// OutputBytesPerToken is the size of one token in an output file: a dump's row plus the
// int64 loss mask.
func (c *Config) OutputBytesPerToken() int64 { return c.BytesPerToken() + 8 }

// Fingerprint covers what shapes the output files, so resuming a job with a different
// model, width or layer set is caught instead of mixing files.
func (c *Config) Fingerprint() string {
	h := sha256.New()
	fmt.Fprintf(h, "kind=%s\nmodel=%s\nhidden=%d\nlayers=%v\n", c.Server.Kind, c.Server.ModelPath, c.HiddenSize(), c.Server.Layers)
	// The format shapes the files too. The default adds nothing, so that a job begun
	// before formats existed keeps its fingerprint and resumes.
	if l := c.Output.LayoutName(); l != "safetensors" {
		fmt.Fprintf(h, "format=%s\n", l)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// flatten lists every leaf key of a Config with its value, by mapstructure tag.
func flatten(c Config) map[string]any {
	out := map[string]any{}
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			key := prefix + t.Field(i).Tag.Get("mapstructure")
			f := v.Field(i)
			if f.Kind() == reflect.Struct {
				walk(key+".", f)
				continue
			}
			out[key] = f.Interface()
		}
	}
	walk("", reflect.ValueOf(c))
	return out
}
