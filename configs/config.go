// Package configs defines the job's configuration, loads it from YAML, EXTRACT_* env and
// flags (viper), and ships the demo and production configs as files beside it.
package configs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

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

	// ShmGroup is the group (name or gid) of a server that runs as another user: the
	// staging dir is then made group-owned and group-writable (02770), and only then may
	// it be group-writable. "": the staging dir is ours alone (0700).
	ShmGroup string `mapstructure:"shm_group"`
	// DatasetMaxLine bounds one dataset line: a longer one is refused, naming it.
	DatasetMaxLine ByteSize `mapstructure:"dataset_max_line"`
	// DatasetFormat: auto (from the lines), tokens (input_ids or text), or a conversation
	// format (sharegpt, openai, ultrachat), which prepare turns into tokens first.
	DatasetFormat string   `mapstructure:"dataset_format"`
	Prepare       Prepare  `mapstructure:"prepare"`
	Vocab         Vocab    `mapstructure:"vocab"`
	Generate      Generate `mapstructure:"generate"`
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

	// IsolateAfterDeaths: a sample in flight at that many server deaths or hangs is sent
	// alone; if the server dies with it alone, it fails ("server died with it in flight").
	IsolateAfterDeaths int `mapstructure:"isolate_after_deaths"`
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

// Simulator configures the embedded SGLang simulator (server.kind: simulator): its
// width, its prefill rate, the faults tests inject and the shape of generated replies.
// It is the options' one declaration: sglang.SimulatorSpec carries it to the launch,
// whose argv the simulate command parses back into simulator.Config, which embeds it.
// One field per server.simulator key (16): the keys are flat in config files, and
// grouping them here would rename them.
type Simulator struct {
	// TokensPerSecond is one prefill rate shared by all requests, like one GPU queue;
	// 0 runs as fast as it can.
	TokensPerSecond float64 `mapstructure:"tokens_per_second"`
	HiddenSize      int     `mapstructure:"hidden_size"`
	// StartupDelay is how long /health_generate and /generate answer 503, like a model loading.
	StartupDelay time.Duration `mapstructure:"startup_delay"`
	// ExitAfter makes the process exit with status 3 after that many completed requests.
	ExitAfter int `mapstructure:"exit_after"`
	// HangAfter makes /generate and /health_generate block after that many completed
	// requests, like a stuck scheduler behind a live HTTP frontend.
	HangAfter int `mapstructure:"hang_after"`
	// Fail503Every answers every Nth /generate with 503 before doing any work.
	Fail503Every int `mapstructure:"fail_503_every"`
	// CorruptEvery writes every Nth dump with input_ids that differ from the request's,
	// as a server that tokenized or cached wrongly would.
	CorruptEvery int `mapstructure:"corrupt_every"`
	// LateDumpDelay writes each dump this long after the response, like a slow hook.
	LateDumpDelay time.Duration `mapstructure:"late_dump_delay"`
	// DecodeDelay is the time to generate each token after the first: the answer comes
	// (server.max_new_tokens − 1) × DecodeDelay after the dump, as SGLang's hook dumps at
	// the end of the prefill and answers after decoding.
	DecodeDelay time.Duration `mapstructure:"decode_delay"`
	// RequestLog, when set, is a file that gets one line per /generate received ("rid port
	// open", open being the requests under way with this one), appended across restarts
	// and shared by replicas (O_APPEND, one write a line): tests count the work the
	// server was asked to do, and how much of it at once.
	RequestLog string `mapstructure:"request_log"`

	// CrashOnSamples makes the simulator exit (status 3) as soon as a request for one of
	// these samples (by its rid, s<sample>-a<attempt>) arrives, with whatever else is in
	// flight: a prompt that kills the server, for tests of the poison rule.
	CrashOnSamples []int `mapstructure:"crash_on_samples"`
	// ReplyTokens, EmptyEvery and ThinkEvery shape the replies to extract generate
	// (docs/generate.md): at most ReplyTokens content bytes (0: 24), about one reply in
	// EmptyEvery empty and one in ThinkEvery with a think marker (0: none). CrashOnRID
	// kills the simulator when a generation rid with one of these prefixes arrives (a
	// poison conversation, for tests).
	ReplyTokens int      `mapstructure:"reply_tokens"`
	EmptyEvery  int      `mapstructure:"empty_every"`
	ThinkEvery  int      `mapstructure:"think_every"`
	CrashOnRID  []string `mapstructure:"crash_on_rid"`
	// ContextLength refuses a longer generation prompt with 400, as SGLang refuses one
	// past the model's context (0: no bound).
	ContextLength int `mapstructure:"context_length"`
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

			IsolateAfterDeaths: 2,
		},
		Run: Run{
			MaxInflight:    32,
			MaxAttempts:    5,
			DumpTimeout:    5 * time.Minute,
			RequestTimeout: 30 * time.Minute,
			RequestRetries: 4,
			Movers:         8, // 4 held the server back at hidden 7168 on a tmpfs (0.87× of its forward; 8: 0.91×, docs/performance.md)
			DrainTimeout:   2 * time.Minute,
		},
		Disk:   Disk{Reserve: 1 << 30, WhenShort: "warn"},
		Output: Output{Format: "safetensors", Compress: "none"},
		Status: Status{Listen: "127.0.0.1:0"},
		Log:    Log{Level: "info"},

		DatasetMaxLine: 32 << 20,
		DatasetFormat:  "auto",
		Prepare:        defaultPrepare(),
		Generate:       defaultGenerate(),
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
	o, fileErrs := newOrigin(file, flags)
	if len(fileErrs) > 0 {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, errors.Join(fileErrs...))
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
	if errs := decodeKeys(v, shapeOf(Default())); len(errs) > 0 {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, o.explain(errors.Join(errs...)))
	}
	var c Config
	if err := v.UnmarshalExact(&c, viper.DecodeHook(decodeHook())); err != nil {
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
		"prepare.chat_template": &c.Prepare.ChatTemplate, "prepare.tokenizer": &c.Prepare.Tokenizer,
		"generate.to": &c.Generate.To,
	} {
		*p = resolve(*p, base, fromFile(v, key, flags))
	}
	if c.StateDir == "" && c.OutputDir != "" {
		c.StateDir = filepath.Join(c.OutputDir, ".extract")
	}
	// A key written with no value ("max_inflight:") is YAML's null: viper keeps the
	// default for it, and so does this.
	c.applyKindDefaults(func(key string) bool { _, raw, ok := o.where(key); return ok && raw != "" })
	if err := c.resolveShard(shard, os.Getenv); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, o.explain(err))
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
	for _, f := range c.FingerprintFields() {
		fmt.Fprintf(h, "%s\n", f)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// FingerprintFields are the settings Fingerprint hashes, as "name=value" in order. The
// index stores them, so that a mismatch can name the setting that changed.
func (c *Config) FingerprintFields() []string {
	f := []string{"kind=" + c.Server.Kind, "model=" + c.Server.ModelPath, fmt.Sprintf("hidden=%d", c.HiddenSize()), fmt.Sprintf("layers=%v", c.Server.Layers)}
	// The format shapes the files too. The default adds nothing, so that a job begun
	// before formats existed keeps its fingerprint and resumes.
	if l := c.Output.LayoutName(); l != "safetensors" {
		f = append(f, "format="+l)
	}
	return f
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
