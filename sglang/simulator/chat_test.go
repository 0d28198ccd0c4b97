package simulator

import (
	"reflect"
	"testing"

	"github.com/extract-dev/extract/internal/conversation"
)

// The expected ids are written out by hand from the contract: 'u'=117 → 120, 's'=115 →
// 118, 'e'=101 → 104, 'r'=114 → 117, '\n'=10 → 13, 'a'=97 → 100, ...
func TestChatEncodeFollowsTheSimulatorContract(t *testing.T) {
	msgs := []conversation.Message{{Role: conversation.User, Content: "hi"}, {Role: conversation.Assistant, Content: "ok"}}
	e := ChatEncode(msgs, true)
	user := []int64{1, 120, 118, 104, 117, 13, 'h' + 3, 'i' + 3, 2, 13}
	asst := []int64{1, 100, 118, 118, 108, 118, 119, 100, 113, 119, 13, 'o' + 3, 'k' + 3, 2, 13}
	wantIDs := append(append([]int64{}, user...), asst...)
	wantMask := make([]int64, len(wantIDs))
	for _, i := range []int{len(user) + 11, len(user) + 12, len(user) + 13} { // "o", "k", <|im_end|>
		wantMask[i] = 1
	}
	if !reflect.DeepEqual(e.IDs, wantIDs) || !reflect.DeepEqual(e.Mask, wantMask) {
		t.Fatalf("ids %v\nmask %v\nwant %v\n     %v", e.IDs, e.Mask, wantIDs, wantMask)
	}
	if e.LossTokens() != 3 {
		t.Fatalf("loss tokens %d", e.LossTokens())
	}
	// Spans tile the tokens in order with the mask's values.
	at := 0
	for _, s := range e.Spans {
		if s.Start != at || s.End <= s.Start {
			t.Fatalf("spans %+v", e.Spans)
		}
		for i := s.Start; i < s.End; i++ {
			if (e.Mask[i] == 1) != s.Loss {
				t.Fatalf("span %+v disagrees with the mask at %d", s, i)
			}
		}
		at = s.End
	}
	if at != len(e.IDs) {
		t.Fatalf("spans end at %d of %d", at, len(e.IDs))
	}
}

func TestChatEncodeLeavesTheEndOfTurnOutWhenExcluded(t *testing.T) {
	e := ChatEncode([]conversation.Message{{Role: conversation.User, Content: "q"}, {Role: conversation.Assistant, Content: "a"}}, false)
	if e.LossTokens() != 1 || e.Mask[len(e.Mask)-2] != 0 || e.IDs[len(e.IDs)-2] != ChatIMEnd {
		t.Fatalf("ids %v mask %v", e.IDs, e.Mask)
	}
}
