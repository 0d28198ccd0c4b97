package tokenizer

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/extract-dev/extract/internal/conversation"
)

// RenderText is the chat template's rendering of msgs, with the generation prompt or
// without (extract generate splices its samples from these pieces). w picks the worker.
func (p *Pool) RenderText(ctx context.Context, w int, msgs []conversation.Message, tools []json.RawMessage, generationPrompt bool) (string, error) {
	var resp struct {
		Text    string `json:"text"`
		Error   string `json:"error"`
		Refused *struct {
			Reason string `json:"reason"`
			Detail string `json:"detail"`
		} `json:"refused"`
	}
	if err := p.ask(ctx, w, map[string]any{"op": "render_text", "messages": msgs, "tools": tools, "generation_prompt": generationPrompt}, &resp); err != nil {
		return "", err
	}
	switch {
	case resp.Refused != nil:
		return "", fmt.Errorf("%s: %s", resp.Refused.Reason, resp.Refused.Detail)
	case resp.Error != "":
		return "", fmt.Errorf("tokenizer worker %d: %s", w, resp.Error)
	}
	return resp.Text, nil
}

// EncodeText encodes one piece of rendered text without adding special tokens (the
// template writes its own; the special tokens in the text are encoded as themselves).
func (p *Pool) EncodeText(ctx context.Context, w int, text string) ([]int64, error) {
	var resp struct {
		IDs   []int64 `json:"ids"`
		Error string  `json:"error"`
	}
	if err := p.ask(ctx, w, map[string]any{"op": "encode_text", "text": text}, &resp); err != nil {
		return nil, err
	}
	if resp.Error != "" {
		return nil, fmt.Errorf("tokenizer worker %d: %s", w, resp.Error)
	}
	return resp.IDs, nil
}

// EndOfTurnTexts are the tokens that end an assistant turn (the tokenizer's eos,
// generation_config.json's, prepare.end_of_turn_tokens), each with its text.
func (p *Pool) EndOfTurnTexts(ctx context.Context) (map[int64]string, error) {
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	ids := p.ready.EndOfTurnIDs
	pieces, err := p.Pieces(ctx, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]string, len(ids))
	for i, id := range ids {
		out[id] = pieces[i]
	}
	return out, nil
}

func (p *Pool) ask(ctx context.Context, w int, req map[string]any, v any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if err := p.start(ctx); err != nil {
		return err
	}
	w %= len(p.procs)
	if err := p.procs[w].call(ctx, b, v); err != nil {
		return fmt.Errorf("tokenizer worker %d: %w", w, err)
	}
	return nil
}
