package prepare

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/internal/conversation"
	"github.com/extract-dev/extract/internal/userfile"
	"github.com/extract-dev/extract/sglang/tokenizer"
)

// Dir is where a run keeps its prepared dataset: state_dir/prepare.
func Dir(cfg *configs.Config) string { return filepath.Join(cfg.StateDir, "prepare") }

// OptionsFrom turns the config's prepare.* keys into Options for preparing from into dir.
func OptionsFrom(cfg *configs.Config, from, dir string, log *slog.Logger) (Options, error) {
	format := conversation.Auto
	if cfg.DatasetFormat != "tokens" {
		f, err := conversation.ParseFormat(cfg.DatasetFormat)
		if err != nil {
			return Options{}, err
		}
		format = f
	}
	p := cfg.Prepare
	o := Options{
		From: from, Dir: dir, Format: format,
		Policy:       conversation.Policy{Reasoning: p.Reasoning, Tools: p.Tools, EndOfTurn: p.EndOfTurn},
		Length:       Length{MaxTokens: p.MaxTokens, OnLong: p.LengthPolicy, MinLossTokens: p.MinLossTokens},
		Strict:       p.Strict,
		MaxLineBytes: int(p.MaxLineBytes),
		Batch:        p.Batch,
		ChunkLines:   p.ChunkLines,
		Log:          log,
	}
	if cfg.Server.Kind != "simulator" {
		eot := append([]string(nil), p.EndOfTurnTokens...)
		sort.Strings(eot)
		kw, err := json.Marshal(p.TemplateKwargs) // map keys sorted: a stable digest
		if err != nil {
			return Options{}, fmt.Errorf("prepare.template_kwargs: %w", err)
		}
		o.Extra = []string{"mask=" + p.Mask, "end_of_turn_tokens=" + strings.Join(eot, "\x00"), fmt.Sprintf("trust_remote_code=%v", p.TrustRemoteCode),
			"template_kwargs=" + string(kw)}
	}
	return o, nil
}

// NewTokenizer is the job's tokenizer: the simulator's contract for server.kind
// simulator, else the target's own in server.python (started at its first use).
// workDir receives the worker file.
func NewTokenizer(cfg *configs.Config, workDir string, log *slog.Logger) (Tokenizer, error) {
	workers := cfg.Prepare.Workers
	if cfg.Server.Kind == "simulator" {
		if workers == 0 {
			workers = runtime.NumCPU()
		}
		return Simulator{EndOfTurn: cfg.Prepare.EndOfTurn == "include", N: workers}, nil
	}
	if workers == 0 {
		workers = workersPerCore(runtime.NumCPU())
	}
	var env []string
	for k, v := range cfg.Server.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return tokenizer.New(tokenizer.Config{
		Python: cfg.Server.Python, Env: env, Tokenizer: cfg.TokenizerPath(), TemplateFile: cfg.Prepare.ChatTemplate,
		TrustRemoteCode: cfg.Prepare.TrustRemoteCode, Mask: cfg.Prepare.Mask, EndOfTurn: cfg.Prepare.EndOfTurn,
		EndOfTurnTokens: cfg.Prepare.EndOfTurnTokens, TemplateKwargs: cfg.Prepare.TemplateKwargs,
		Workers: workers, WorkDir: workDir, Log: log,
	})
}

// IsConversations says whether the dataset is a conversation file: dataset_format names
// a conversation format, or (auto) its first non-blank line is an object with
// "conversations", "messages" or "data" and no "input_ids" or "text".
func IsConversations(cfg *configs.Config) (bool, error) {
	switch cfg.DatasetFormat {
	case "tokens":
		return false, nil
	case "sharegpt", "openai", "ultrachat":
		return true, nil
	}
	f, err := userfile.OpenRegular(cfg.Dataset)
	if err != nil {
		return false, fmt.Errorf("%w: %v", ErrBadInput, err)
	}
	defer func() { _ = f.Close() }()
	return sniff(f), nil
}

// TargetVocabSize is the target's vocabulary: vocab.target_size, the simulator's 259, or
// the model config's vocab_size.
func TargetVocabSize(cfg *configs.Config) (int, error) {
	if cfg.Vocab.TargetSize > 0 {
		return cfg.Vocab.TargetSize, nil
	}
	if cfg.Server.Kind == "simulator" {
		return Simulator{}.VocabSize(), nil
	}
	v, err := tokenizer.ModelVocabSize(cfg.Server.ModelPath)
	if err != nil {
		return 0, fmt.Errorf("the target's vocabulary size (set vocab.target_size): %w", err)
	}
	return v, nil
}

// workersPerCore is prepare.workers 0: one tokenizer worker a core, up to the most one
// pool forks (a 768-thread host would otherwise fail to start them).
func workersPerCore(cpus int) int { return min(cpus, tokenizer.MaxWorkers) }
