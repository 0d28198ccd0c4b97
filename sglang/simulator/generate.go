package simulator

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/extract-dev/extract/configs"
)

// The simulator's generation contract, which outside checks compute on their own. A
// request whose rid starts with "g" (extract generate's rids; dumps are only ever
// written for protocol v1 rids "s…") is answered by Reply: the content is a function of
// the prompt ids and the seed only, so a resent request gets the same reply.
//
//	h     = mix(seed XOR golden), then h = mix((h XOR id) + golden) for each prompt id,
//	        mix being SplitMix64's finalizer and golden 0x9e3779b97f4a7c15 (values.go)
//	empty = EmptyEvery > 0 and (h>>32) % EmptyEvery == 0: the content is empty
//	think = ThinkEvery > 0 and (h>>40) % ThinkEvery == 0: the content starts "<think>\n"
//	n     = 1 + h % ReplyTokens content bytes, each from replyAlphabet by a 64-bit LCG
//	        on h (x = x*6364136223846793005 + 1442695040888963407; byte (x>>33) % 28)
//	ids   = each content byte b as b+3, then <|im_end|> (2), cut at max_new_tokens
//
// finish_reason is {"type":"stop","matched":2} when <|im_end|> fits, else
// {"type":"length","length":max_new_tokens}. The content is ASCII, so it is valid UTF-8
// at every cut and its text and tokens agree.
const replyAlphabet = "abcdefghijklmnopqrstuvwxyz ."

// replyHash is h of the contract above.
func replyHash(prompt []int64, seed int64) uint64 {
	h := mix(uint64(seed) ^ golden)
	for _, id := range prompt {
		h = mix((h ^ uint64(id)) + golden)
	}
	return h
}

// ReplyContent is the reply's content text for prompt and seed, before <|im_end|> and
// before any cut at max_new_tokens.
func ReplyContent(prompt []int64, seed int64, g configs.Simulator) string {
	if g.ReplyTokens <= 0 {
		g.ReplyTokens = 24
	}
	h := replyHash(prompt, seed)
	if g.EmptyEvery > 0 && (h>>32)%uint64(g.EmptyEvery) == 0 {
		return ""
	}
	n := 1 + int(h%uint64(g.ReplyTokens))
	var b strings.Builder
	if g.ThinkEvery > 0 && (h>>40)%uint64(g.ThinkEvery) == 0 {
		b.WriteString("<think>\n")
	}
	x := h
	for range n {
		x = x*6364136223846793005 + 1442695040888963407
		b.WriteByte(replyAlphabet[(x>>33)%uint64(len(replyAlphabet))])
	}
	return b.String()
}

// Reply is the generated ids and the finish reason for prompt, seed and max_new_tokens.
func Reply(prompt []int64, seed int64, maxNew int, g configs.Simulator) ([]int64, string) {
	ids := append(Tokenize(ReplyContent(prompt, seed, g)), ChatIMEnd)
	if maxNew > 0 && len(ids) > maxNew {
		return ids[:maxNew], "length"
	}
	return ids, "stop"
}

type genFinish struct {
	Type    string `json:"type"`
	Matched *int   `json:"matched,omitempty"`
	Length  int    `json:"length,omitempty"`
}

type genResponse struct {
	Text      string  `json:"text"`
	OutputIDs []int64 `json:"output_ids"`
	MetaInfo  struct {
		ID               string    `json:"id"`
		PromptTokens     int       `json:"prompt_tokens"`
		CompletionTokens int       `json:"completion_tokens"`
		FinishReason     genFinish `json:"finish_reason"`
	} `json:"meta_info"`
}

// isGeneration says whether rid is one of extract generate's (answered by Reply, no dump).
func isGeneration(rid string) bool { return strings.HasPrefix(rid, "g") }

// crashes says whether the request must kill the server (CrashOnRIDPrefix).
func (s *Server) crashes(rid string) bool {
	for _, p := range s.cfg.CrashOnRID {
		if p != "" && strings.HasPrefix(rid, p) {
			return true
		}
	}
	return false
}

// answerGeneration generates ids for a g-rid: the prefill's wait, then DecodeDelay per
// generated token, then the answer in SGLang's shape (text without the stop token).
func (s *Server) answerGeneration(w http.ResponseWriter, r *http.Request, req *generateRequest, ids []int64, start time.Time) {
	if s.crashes(req.RID) {
		s.log.Info("injected fault: a poison prompt kills the server", "rid", req.RID)
		exitNow(3)
	}
	if c := s.cfg.ContextLength; c > 0 && len(ids) > c {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("The input (%d tokens) is longer than the model's context length (%d tokens).", len(ids), c))
		return
	}
	if err := s.prefill(r.Context(), len(ids)); err != nil {
		return
	}
	out, finish := Reply(ids, req.SamplingParams.Seed, req.SamplingParams.MaxNewTokens, s.cfg.Simulator)
	if s.cfg.DecodeDelay > 0 {
		if !sleepCtx(r.Context(), time.Duration(len(out))*s.cfg.DecodeDelay) {
			return
		}
	}
	var resp genResponse
	text := out
	if finish == "stop" {
		text = out[:len(out)-1]
		m := ChatIMEnd
		resp.MetaInfo.FinishReason = genFinish{Type: "stop", Matched: &m}
	} else {
		resp.MetaInfo.FinishReason = genFinish{Type: "length", Length: len(out)}
	}
	b := make([]byte, len(text))
	for i, id := range text {
		b[i] = byte(id - 3)
	}
	resp.Text, resp.OutputIDs = string(b), out
	resp.MetaInfo.ID, resp.MetaInfo.PromptTokens, resp.MetaInfo.CompletionTokens = req.RID, len(ids), len(out)
	writeJSON(w, http.StatusOK, resp)
	s.log.Debug("generated", "rid", req.RID, "prompt_tokens", len(ids), "output_tokens", len(out), "finish", finish, "latency", time.Since(start))
	s.complete(w)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// exitNow ends the process at once, as a crashing server would.
var exitNow = os.Exit
