package configs

import (
	"fmt"
	"math"
	"strings"
)

// Generate configures regenerating a conversation file's assistant turns with the
// target (extract generate; docs/generate.md). With Enabled, extract run generates
// first and extracts what it wrote.
type Generate struct {
	Enabled bool `mapstructure:"enabled"`
	// To is the regenerated conversation file (default <state_dir>/generate/generated.jsonl).
	To string `mapstructure:"to"`
	// The sampling keys, sent as SGLang's sampling_params. Temperature 0 is greedy.
	Temperature  float64 `mapstructure:"temperature"`
	TopP         float64 `mapstructure:"top_p"`
	TopK         int     `mapstructure:"top_k"` // -1: off
	MaxNewTokens int     `mapstructure:"max_new_tokens"`
	Seed         int64   `mapstructure:"seed"`
	StopTokenIDs []int   `mapstructure:"stop_token_ids"`
	// Thinking: auto (the template's default), on or off (chat_template_kwargs
	// enable_thinking); ChatTemplateKwargs are more of them ("true"/"false" are booleans).
	Thinking           string            `mapstructure:"thinking"`
	ChatTemplateKwargs map[string]string `mapstructure:"chat_template_kwargs"`
	// ThinkMarkers are the strings that flag a reply made with thinking off.
	ThinkMarkers []string `mapstructure:"think_markers"`
	// MaxInflight is the conversations generated at once over all replicas.
	MaxInflight int `mapstructure:"max_inflight"`
	// MaxAttempts bounds the sends of one turn that the server fails (5xx after the
	// client's retries, a bad answer) and the retries a validation rule asks for.
	MaxAttempts int `mapstructure:"max_attempts"`
	// OnEmpty, OnLength, OnThink and OnOnlyStop say what a flagged reply becomes: keep,
	// drop (the conversation is left out and listed) or retry (sent again with the next
	// seed; dropped once max_attempts is spent).
	OnEmpty    string `mapstructure:"on_empty"`
	OnLength   string `mapstructure:"on_length"`
	OnThink    string `mapstructure:"on_think"`
	OnOnlyStop string `mapstructure:"on_only_stop"`
}

func defaultGenerate() Generate {
	return Generate{TopP: 1, TopK: -1, MaxNewTokens: 2048, Thinking: "auto", ThinkMarkers: []string{"<think>", "</think>"},
		MaxInflight: 32, MaxAttempts: 3, OnEmpty: "retry", OnLength: "keep", OnThink: "drop", OnOnlyStop: "retry"}
}

func (c *Config) checkGenerate() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, keyError{key, fmt.Sprintf(format, args...)})
	}
	g := c.Generate
	if math.IsNaN(g.Temperature) || g.Temperature < 0 || g.Temperature > 100 {
		bad("generate.temperature", "must be 0 (greedy) .. 100, got %v", g.Temperature)
	}
	if math.IsNaN(g.TopP) || g.TopP <= 0 || g.TopP > 1 {
		bad("generate.top_p", "must be in (0, 1], got %v", g.TopP)
	}
	if g.TopK != -1 && (g.TopK < 1 || g.TopK > 1<<24) {
		bad("generate.top_k", "must be -1 (off) or 1..2^24, got %d", g.TopK)
	}
	if g.MaxNewTokens < 1 || g.MaxNewTokens > maxTokens {
		bad("generate.max_new_tokens", "must be 1..%d, got %d", maxTokens, g.MaxNewTokens)
	}
	if g.Seed < 0 || g.Seed > 1<<53 {
		bad("generate.seed", "must be 0..2^53 (exact in JSON), got %d", g.Seed)
	}
	for _, id := range g.StopTokenIDs {
		if id < 0 || id >= 1<<24 {
			bad("generate.stop_token_ids", "token ids must be 0..2^24, got %d", id)
		}
	}
	if g.Thinking != "auto" && g.Thinking != "on" && g.Thinking != "off" {
		bad("generate.thinking", "must be one of auto, on, off, got %q", g.Thinking)
	}
	if _, set := g.ChatTemplateKwargs["enable_thinking"]; set && g.Thinking != "auto" {
		bad("generate.chat_template_kwargs", "enable_thinking is generate.thinking's to set (it is %s)", g.Thinking)
	}
	for _, m := range g.ThinkMarkers {
		if strings.TrimSpace(m) == "" {
			bad("generate.think_markers", "a marker must not be blank")
		}
	}
	if g.MaxInflight < 1 || g.MaxInflight > maxInflight {
		bad("generate.max_inflight", "must be 1..%d, got %d", maxInflight, g.MaxInflight)
	}
	if g.MaxAttempts < 1 || g.MaxAttempts > maxAttempts {
		bad("generate.max_attempts", "must be 1..%d, got %d", maxAttempts, g.MaxAttempts)
	}
	for key, v := range map[string]string{"generate.on_empty": g.OnEmpty, "generate.on_length": g.OnLength, "generate.on_think": g.OnThink, "generate.on_only_stop": g.OnOnlyStop} {
		if v != "keep" && v != "drop" && v != "retry" {
			bad(key, "must be one of keep, drop, retry, got %q", v)
		}
	}
	s := c.Server.Simulator
	if s.ReplyTokens < 0 || s.ReplyTokens > 1<<20 || s.EmptyEvery < 0 || s.ThinkEvery < 0 || s.ContextLength < 0 {
		bad("server.simulator.reply_tokens", "reply_tokens (0: 24), empty_every, think_every and context_length must not be negative")
	}
	return errs
}
