package sglang

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// SampleParams are SGLang's sampling_params for a generation (extract generate). Nil
// fields are left to the server's defaults.
type SampleParams struct {
	MaxNewTokens int      `json:"max_new_tokens"`
	Temperature  *float64 `json:"temperature,omitempty"`
	TopP         *float64 `json:"top_p,omitempty"`
	TopK         *int     `json:"top_k,omitempty"`
	Seed         *int64   `json:"sampling_seed,omitempty"`
	StopTokenIDs []int64  `json:"stop_token_ids,omitempty"`
	// SkipSpecialTokens false keeps the text of special tokens the reply holds, so a
	// think marker that is a special token is seen by validation.
	SkipSpecialTokens bool `json:"skip_special_tokens"`
}

// SampleRequest is one generation from token ids.
type SampleRequest struct {
	RID      string
	InputIDs []int64
	Params   SampleParams
}

// SampleResponse is the server's answer: the ids it generated (never a re-tokenization
// of the text) and why it stopped.
type SampleResponse struct {
	Text      string
	OutputIDs []int64
	// Finish is "stop" (a stop token or string matched), "length" (max_new_tokens
	// reached) or "abort"; Matched is the stop token when one matched.
	Finish       string
	Matched      *int64
	PromptTokens int
}

type sampleBody struct {
	RID            string       `json:"rid"`
	InputIDs       []int64      `json:"input_ids"`
	SamplingParams SampleParams `json:"sampling_params"`
}

// Sample runs one generation on /generate with input_ids and sampling_params, retried
// on 5xx and transport errors as Generate is (a repeat under the same rid recomputes the
// same request). An answer for another rid, with no output_ids field or an abort is an
// error naming the rid.
func (c *Client) Sample(ctx context.Context, req SampleRequest) (SampleResponse, error) {
	if req.RID == "" || len(req.InputIDs) == 0 {
		return SampleResponse{}, fmt.Errorf("sample rid %q: a rid and input ids are required", req.RID)
	}
	js, err := json.Marshal(sampleBody{RID: req.RID, InputIDs: req.InputIDs, SamplingParams: req.Params})
	if err != nil {
		return SampleResponse{}, fmt.Errorf("sample rid %s: %w", req.RID, err)
	}
	var out struct {
		Text      string   `json:"text"`
		OutputIDs *[]int64 `json:"output_ids"`
		MetaInfo  struct {
			ID           string `json:"id"`
			PromptTokens int    `json:"prompt_tokens"`
			FinishReason *struct {
				Type    string          `json:"type"`
				Matched json.RawMessage `json:"matched"`
				Message string          `json:"message"`
			} `json:"finish_reason"`
		} `json:"meta_info"`
	}
	if err := c.do(ctx, http.MethodPost, "/generate", js, &out); err != nil {
		return SampleResponse{}, fmt.Errorf("sample rid %s: %w", req.RID, err)
	}
	m := out.MetaInfo
	switch {
	case m.ID != req.RID:
		return SampleResponse{}, fmt.Errorf("sample rid %s: server answered for rid %q", req.RID, m.ID)
	case out.OutputIDs == nil:
		return SampleResponse{}, fmt.Errorf("sample rid %s: the answer has no output_ids (an SGLang too old to return them?)", req.RID)
	case m.FinishReason == nil:
		return SampleResponse{}, fmt.Errorf("sample rid %s: the answer has no meta_info.finish_reason", req.RID)
	case m.FinishReason.Type == "abort":
		return SampleResponse{}, fmt.Errorf("sample rid %s: the server aborted the request: %s", req.RID, m.FinishReason.Message)
	}
	res := SampleResponse{Text: out.Text, OutputIDs: *out.OutputIDs, Finish: m.FinishReason.Type, PromptTokens: m.PromptTokens}
	var tok int64
	if json.Unmarshal(m.FinishReason.Matched, &tok) == nil && len(m.FinishReason.Matched) > 0 {
		res.Matched = &tok
	}
	return res, nil
}
