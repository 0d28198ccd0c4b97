package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/doctor"
	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/orchestrator/generate"
	"github.com/extract-dev/extract/sglang"
	"github.com/extract-dev/extract/sglang/tokenizer"
)

// GenerateOptions are extract generate's choices.
type GenerateOptions struct {
	From, To      string // default: the config's dataset, generate.to
	Resume, Fresh bool
	// KeepServers leaves the servers up at the end for the extraction that follows
	// (extract run adopts a server of the same launch spec).
	KeepServers bool
	Executable  string
	Log         *slog.Logger
	OnStatus    func(generate.Status)
}

// GenerateDir is where a job keeps its generate index: state_dir/generate.
func GenerateDir(cfg *configs.Config) string { return filepath.Join(cfg.StateDir, "generate") }

// GenerateOutput is the regenerated file generate writes: --to, else generate.to, else
// state_dir/generate/generated.jsonl.
func GenerateOutput(cfg *configs.Config, to string) string {
	if to == "" {
		to = cfg.Generate.To
	}
	if to == "" {
		return filepath.Join(GenerateDir(cfg), "generated.jsonl")
	}
	return to
}

// Generate regenerates the assistant turns of opt.From into opt.To under the state
// dir's lock, on the job's servers (launched, adopted and restarted as the run does).
func Generate(ctx context.Context, cfg *configs.Config, opt GenerateOptions) (generate.Summary, error) {
	if opt.Resume && opt.Fresh {
		return generate.Summary{}, fmt.Errorf("%w: --resume and --fresh exclude each other", ErrRefused)
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.From == "" {
		opt.From = cfg.Dataset
	}
	if err := doctor.MakeJobDirs(cfg); err != nil {
		return generate.Summary{}, err
	}
	lock, err := AcquireLock(cfg.StateDir, "generate")
	var held *HeldError
	if errors.As(err, &held) {
		return generate.Summary{}, fmt.Errorf("%w: %s holds %s; run again after it ends", ErrTemporary, held.Holder, held.Path)
	}
	if err != nil {
		return generate.Summary{}, err
	}
	defer lock.Release()
	return generateLocked(ctx, cfg, opt)
}

// generateLocked is Generate for a caller that holds the lock (extract run).
func generateLocked(ctx context.Context, cfg *configs.Config, opt GenerateOptions) (generate.Summary, error) {
	o, closeR, err := generateOptions(cfg, opt)
	if err != nil {
		return generate.Summary{}, err
	}
	defer closeR()
	sum, err := generate.Run(ctx, o)
	if err != nil || !opt.KeepServers {
		stopGenerateServers(o.Replicas, opt.Log)
	}
	switch {
	case errors.Is(err, generate.ErrBadInput), errors.Is(err, generate.ErrChanged):
		return sum, fmt.Errorf("%w: %w", ErrRefused, err)
	case errors.Is(err, generate.ErrStopped), errors.Is(err, generate.ErrServers):
		return sum, fmt.Errorf("%w: %w", ErrTemporary, err)
	}
	return sum, err
}

func stopGenerateServers(reps []generate.Replica, log *slog.Logger) {
	for i, r := range reps {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		r.Client.CloseIdleConnections() // the simulator's graceful stop waits on idle ones
		if err := r.Mgr.Stop(ctx, 30*time.Second); err != nil {
			log.Warn("generate: stopping server", "replica", i, "err", err)
		}
		cancel()
	}
}

// generateOptions turns the config into generate.Options: the replicas as the run
// makes them, the renderer of the target's template, the sampling and validation keys.
func generateOptions(cfg *configs.Config, opt GenerateOptions) (generate.Options, func(), error) {
	g := cfg.Generate
	format := conversation.Auto
	if cfg.DatasetFormat != "tokens" && cfg.DatasetFormat != "auto" {
		f, err := conversation.ParseFormat(cfg.DatasetFormat)
		if err != nil {
			return generate.Options{}, nil, fmt.Errorf("%w: %v", ErrRefused, err)
		}
		format = f
	}
	renderer, closeR, err := newRenderer(cfg, opt.Log)
	if err != nil {
		return generate.Options{}, nil, err
	}
	seed := g.Seed
	temp, topP, topK := g.Temperature, g.TopP, g.TopK
	params := sglang.SampleParams{MaxNewTokens: g.MaxNewTokens, Temperature: &temp, TopP: &topP, TopK: &topK, Seed: &seed}
	stop := map[int64]bool{}
	for id := range renderer.EndOfTurn() {
		stop[id] = true
	}
	for _, id := range g.StopTokenIDs {
		params.StopTokenIDs = append(params.StopTokenIDs, int64(id))
		stop[int64(id)] = true
	}
	rules := generate.Rules{
		On: map[generate.Flag]generate.Action{
			generate.FlagEmpty: generate.Action(g.OnEmpty), generate.FlagLength: generate.Action(g.OnLength),
			generate.FlagThink: generate.Action(g.OnThink), generate.FlagOnlyStop: generate.Action(g.OnOnlyStop),
		},
		ThinkingOff: g.Thinking == "off", ThinkMarkers: g.ThinkMarkers, Stop: stop,
	}
	to := GenerateOutput(cfg, opt.To)
	if cfg.Shard.Sharded() && opt.To != "" {
		// Each shard writes its own part; concatenated in shard order they are the file.
		ext := filepath.Ext(to)
		to = strings.TrimSuffix(to, ext) + "." + cfg.Shard.DirName() + ext
	}
	from, err := filepath.Abs(opt.From)
	if err != nil {
		return generate.Options{}, nil, err
	}
	if to, err = filepath.Abs(to); err != nil {
		return generate.Options{}, nil, err
	}
	o := generate.Options{
		From: from, To: to, Dir: GenerateDir(cfg), Format: format, MaxLine: int(cfg.Prepare.MaxLineBytes),
		Renderer: renderer, Replicas: generateReplicas(cfg, opt.Executable, opt.Log),
		Params: params, Rules: rules, EndOfTurn: cfg.Prepare.EndOfTurn == "include",
		MaxInflight: g.MaxInflight, MaxAttempts: g.MaxAttempts, IsolateAfterDeaths: cfg.Server.IsolateAfterDeaths,
		MaxRestarts: cfg.Server.MaxRestarts, RestartWindow: cfg.Server.RestartWindow,
		Health:      generate.Health{Interval: cfg.Server.HealthInterval, Timeout: cfg.Server.HealthTimeout, Failures: cfg.Server.HealthFailures},
		OptionsText: generateOptionsText(cfg), Fresh: opt.Fresh, Resume: opt.Resume, Log: opt.Log, OnStatus: opt.OnStatus,
		Listen: cfg.Status.Listen,
	}
	if cfg.Shard.Sharded() {
		o.Span = func(lines int) (int, int) { return ShardRange(lines, cfg.Shard.Index, cfg.Shard.Count) }
	}
	return o, closeR, nil
}

// generateReplicas are the job's server.replicas servers, as newReplicas makes them.
func generateReplicas(cfg *configs.Config, exe string, log *slog.Logger) []generate.Replica {
	reps := make([]generate.Replica, max(cfg.Server.Replicas, 1))
	for r := range reps {
		spec := launchSpec(cfg, exe)
		spec.Port = cfg.ReplicaPort(r)
		spec.ShmDir = cfg.StagingDir(r)
		if cfg.Server.Replicas > 1 || len(cfg.Server.GPUs) > 0 {
			spec.GPUs = cfg.ReplicaGPUs(r)
		}
		reps[r] = generate.Replica{
			Mgr: &sglang.Manager{StateDir: cfg.StateDir, Spec: spec, StartupTimeout: cfg.Server.StartupTimeout, Log: log, Replica: r},
			Client: sglang.NewClient(spec.BaseURL(), sglang.ClientOptions{RetryMax: cfg.Run.RequestRetries, AttemptTimeout: cfg.Run.RequestTimeout,
				MaxConns: cfg.Generate.MaxInflight, Logger: log}),
		}
	}
	return reps
}

// generateOptionsText is every key that shapes the generated file, for its fingerprint.
func generateOptionsText(cfg *configs.Config) []string {
	g := cfg.Generate
	kw := make([]string, 0, len(g.ChatTemplateKwargs))
	for k, v := range g.ChatTemplateKwargs {
		kw = append(kw, k+"="+v)
	}
	sort.Strings(kw)
	stops := make([]string, len(g.StopTokenIDs))
	for i, id := range g.StopTokenIDs {
		stops[i] = strconv.Itoa(id)
	}
	return []string{
		"generate.temperature=" + strconv.FormatFloat(g.Temperature, 'g', -1, 64),
		"generate.top_p=" + strconv.FormatFloat(g.TopP, 'g', -1, 64),
		"generate.top_k=" + strconv.Itoa(g.TopK),
		"generate.max_new_tokens=" + strconv.Itoa(g.MaxNewTokens),
		"generate.seed=" + strconv.FormatInt(g.Seed, 10),
		"generate.stop_token_ids=" + strings.Join(stops, ","),
		"generate.thinking=" + g.Thinking,
		"generate.chat_template_kwargs=" + strings.Join(kw, ","),
		"generate.think_markers=" + strings.Join(g.ThinkMarkers, "\x00"),
		"generate.max_attempts=" + strconv.Itoa(g.MaxAttempts),
		"generate.on_empty=" + g.OnEmpty, "generate.on_length=" + g.OnLength,
		"generate.on_think=" + g.OnThink, "generate.on_only_stop=" + g.OnOnlyStop,
		"prepare.end_of_turn=" + cfg.Prepare.EndOfTurn,
		"dataset_format=" + cfg.DatasetFormat,
		"server.kind=" + cfg.Server.Kind, "server.model_path=" + cfg.Server.ModelPath,
	}
}

// newRenderer is the target's chat template: the simulator's contract, or the target's
// tokenizer in server.python.
func newRenderer(cfg *configs.Config, log *slog.Logger) (generate.Renderer, func(), error) {
	if cfg.Server.Kind == sglang.KindSimulator {
		return generate.SimRenderer{}, func() {}, nil
	}
	var env []string
	for k, v := range cfg.Server.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	kwargs := map[string]any{}
	for k, v := range cfg.Generate.ChatTemplateKwargs {
		switch v {
		case "true":
			kwargs[k] = true
		case "false":
			kwargs[k] = false
		default:
			kwargs[k] = v
		}
	}
	switch cfg.Generate.Thinking {
	case "on":
		kwargs["enable_thinking"] = true
	case "off":
		kwargs["enable_thinking"] = false
	}
	workers := cfg.Prepare.Workers
	if workers == 0 {
		workers = min(runtime.NumCPU(), 4)
	}
	pool, err := tokenizer.New(tokenizer.Config{
		Python: cfg.Server.Python, Env: env, Tokenizer: cfg.TokenizerPath(), TemplateFile: cfg.Prepare.ChatTemplate,
		TrustRemoteCode: cfg.Prepare.TrustRemoteCode, Mask: "prefix", EndOfTurn: cfg.Prepare.EndOfTurn,
		EndOfTurnTokens: cfg.Prepare.EndOfTurnTokens, TemplateKwargs: kwargs, Workers: workers,
		WorkDir: filepath.Join(GenerateDir(cfg), ".worker"), Log: log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: tokenizer: %w", ErrPreflight, err)
	}
	eot, err := pool.EndOfTurnTexts(context.Background())
	if err != nil {
		_ = pool.Close() // the error above is the one to report
		return nil, nil, fmt.Errorf("%w: tokenizer: %w", ErrPreflight, err)
	}
	tok, tmpl := pool.Identity()
	return generate.PoolRenderer{Pool: pool, EOT: eot, ID: tok + "/" + tmpl}, func() { _ = pool.Close() }, nil
}

// runGenerate is the run's first stage with generate.enabled: the conversations
// regenerated (or resumed) under the run lock into generate.to, which the run then
// extracts as is (it holds input_ids and loss_mask). The servers stay up for the
// extraction, which adopts them.
func runGenerate(ctx context.Context, cfg *configs.Config, opt RunOptions) (string, error) {
	if cfg.Shard.Sharded() {
		return "", fmt.Errorf("%w: generate.enabled with a sharded run: each shard would extract a file of its own lines only; run `extract generate --shard i/n` per task, concatenate the parts in shard order, and extract that", ErrRefused)
	}
	if err := doctor.MakeJobDirs(cfg); err != nil {
		return "", err
	}
	lock, err := acquireStageLock(cfg)
	if err != nil {
		return "", err
	}
	defer lock.Release()
	sum, err := generateLocked(ctx, cfg, GenerateOptions{From: cfg.Dataset, Resume: opt.Resume, Fresh: opt.Fresh, KeepServers: true, Executable: opt.Executable, Log: opt.Log})
	if err != nil {
		return "", fmt.Errorf("generate: %w", err)
	}
	opt.Log.Info("generate: conversations regenerated", "conversations", cfg.Dataset, "output", sum.Output, "done", sum.Done,
		"dropped", sum.Dropped, "failed", sum.Failed, "generated_tokens", sum.Generated, "already_done", sum.AlreadyDone)
	if sum.Done == 0 {
		return "", fmt.Errorf("%w: generate kept no conversation of %s (%d dropped, %d failed); see `extract generate --report`", dataset.ErrBad, cfg.Dataset, sum.Dropped, sum.Failed)
	}
	return sum.Output, nil
}
