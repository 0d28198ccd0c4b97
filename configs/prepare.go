package configs

import (
	"fmt"
	"strings"
)

// Prepare configures turning a conversation dataset into tokens and assistant loss masks
// (docs/dataset.md).
type Prepare struct {
	// Strict stops at the first refused line instead of listing and counting it.
	Strict bool `mapstructure:"strict"`
	// MaxTokens bounds a conversation's tokens (0: no bound); LengthPolicy says what a
	// longer one becomes: truncate (cut there) or skip (refused, counted).
	MaxTokens    int    `mapstructure:"max_tokens"`
	LengthPolicy string `mapstructure:"length_policy"`
	// MinLossTokens refuses a conversation with fewer tokens in the loss (at least 1).
	MinLossTokens int `mapstructure:"min_loss_tokens"`
	// EndOfTurn: include (the token that ends each assistant turn is in the loss, as
	// SpecForge counts it) or exclude. EndOfTurnTokens names more such tokens than the
	// tokenizer's eos and generation_config.json's eos_token_id.
	EndOfTurn       string   `mapstructure:"end_of_turn"`
	EndOfTurnTokens []string `mapstructure:"end_of_turn_tokens"`
	// Reasoning: keep | drop | refuse; Tools: keep | refuse (reasoning_content, tool calls).
	Reasoning string `mapstructure:"reasoning"`
	Tools     string `mapstructure:"tools"`
	// Mask: auto (generation tags where the template has them, else token prefixes),
	// tags, or prefix.
	Mask string `mapstructure:"mask"`
	// ChatTemplate is a template file to use instead of the tokenizer's own.
	ChatTemplate string `mapstructure:"chat_template"`
	// TemplateKwargs are more variables for the template (Qwen3's enable_thinking), as
	// apply_chat_template's keyword arguments; YAML only, names lower case.
	TemplateKwargs map[string]any `mapstructure:"template_kwargs"`
	// Tokenizer is the tokenizer folder; default server.model_path.
	Tokenizer       string `mapstructure:"tokenizer"`
	TrustRemoteCode bool   `mapstructure:"trust_remote_code"`
	// Workers is the number of tokenizer processes (0: one per core); Batch the
	// conversations sent to one at a time.
	Workers      int      `mapstructure:"workers"`
	Batch        int      `mapstructure:"batch"`
	MaxLineBytes ByteSize `mapstructure:"max_line_bytes"`
	// ChunkLines is the number of source lines per durable chunk: what a kill can lose.
	ChunkLines int `mapstructure:"chunk_lines"`
}

// Vocab configures the draft vocabulary written at the end of a job
// (<output_dir>/vocab_mapping/vocab_mapping.pt).
type Vocab struct {
	// DraftSize is the draft vocabulary's size; 0: SpecForge's default 32000, or the
	// target's whole vocabulary where that is smaller (the simulator's 259).
	DraftSize int `mapstructure:"draft_size"`
	// TargetSize is the target's vocabulary (0: from the model's config.json; 259 for
	// the simulator).
	TargetSize int `mapstructure:"target_size"`
}

func defaultPrepare() Prepare {
	return Prepare{LengthPolicy: "truncate", MinLossTokens: 1, EndOfTurn: "include", Reasoning: "keep", Tools: "keep",
		Mask: "auto", Batch: 64, MaxLineBytes: 4 << 20, ChunkLines: 4096}
}

// EffectiveDraftSize is the draft vocabulary's size for a target of target tokens.
func (v Vocab) EffectiveDraftSize(target int) int {
	if v.DraftSize == 0 {
		return min(32000, target)
	}
	return v.DraftSize
}

// TokenizerPath is the tokenizer folder prepare loads.
func (c *Config) TokenizerPath() string {
	if c.Prepare.Tokenizer != "" {
		return c.Prepare.Tokenizer
	}
	return c.Server.ModelPath
}

func (c *Config) checkPrepare() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	oneOf := func(key, v, allowed string) {
		for _, a := range strings.Fields(allowed) {
			if v == a {
				return
			}
		}
		bad(key, "must be one of %s, got %q", strings.Join(strings.Fields(allowed), ", "), v)
	}
	p := c.Prepare
	oneOf("dataset_format", c.DatasetFormat, "auto tokens sharegpt openai ultrachat")
	oneOf("prepare.length_policy", p.LengthPolicy, "truncate skip")
	oneOf("prepare.end_of_turn", p.EndOfTurn, "include exclude")
	oneOf("prepare.reasoning", p.Reasoning, "keep drop refuse")
	oneOf("prepare.tools", p.Tools, "keep refuse")
	oneOf("prepare.mask", p.Mask, "auto tags prefix")
	if p.MaxTokens < 0 || p.MaxTokens > 1<<24 {
		bad("prepare.max_tokens", "must be 0 (no bound) .. 2^24, got %d", p.MaxTokens)
	}
	if p.MinLossTokens < 1 || p.MinLossTokens > 1<<24 {
		bad("prepare.min_loss_tokens", "must be at least 1 (a sample with no loss token teaches nothing), got %d", p.MinLossTokens)
	}
	// 480: sglang/tokenizer.MaxWorkers, what one zygote forks within a child's default
	// descriptor limit (orchestrator/prepare's test holds the two equal).
	if p.Workers < 0 || p.Workers > 480 {
		bad("prepare.workers", "must be 0 (one per core, at most 480) .. 480, got %d", p.Workers)
	}
	if p.Batch < 1 || p.Batch > 65536 {
		bad("prepare.batch", "must be 1..65536, got %d", p.Batch)
	}
	if p.ChunkLines < 1 || p.ChunkLines > 1<<24 {
		bad("prepare.chunk_lines", "must be 1..2^24, got %d", p.ChunkLines)
	}
	if p.MaxLineBytes < 1024 || p.MaxLineBytes > 1<<30 {
		bad("prepare.max_line_bytes", "must be 1KiB..1GiB, got %d", p.MaxLineBytes)
	}
	if c.Vocab.DraftSize < 0 || c.Vocab.DraftSize > 1<<24 {
		bad("vocab.draft_size", "must be 0 (32000, at most the target's) .. 2^24, got %d", c.Vocab.DraftSize)
	}
	if c.Vocab.TargetSize < 0 || c.Vocab.TargetSize > 1<<24 {
		bad("vocab.target_size", "must be 0 (from the model config) .. 2^24, got %d", c.Vocab.TargetSize)
	}
	return errs
}
