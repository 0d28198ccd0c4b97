package orchestrator

import (
	"testing"
)

// scanIDsLine is OpenDataset's fast path: whatever it accepts, decodeLine must accept
// with the same token count; whatever else it leaves to decodeLine.
func TestScanIDsLineAgreesWithDecodeLine(t *testing.T) {
	for _, tc := range []struct {
		line   string
		tokens int // 0: the fast path must decline
	}{
		{`{"input_ids":[1,2,3]}`, 3},
		{`{"input_ids": [1, 2, 3]}`, 3},
		{` { "input_ids" : [ 0 , 10 , 999999999999999999 ] } `, 3},
		{`{"input_ids":[5,6],"loss_mask":[0,1]}`, 2},
		{`{"loss_mask":[1],"input_ids":[7]}`, 1},
		{"{\t\"input_ids\":\t[1]\r}", 1},
		{`{"input_ids":[]}`, 0},                    // empty: decodeLine's error
		{`{"input_ids":[-1]}`, 0},                  // negative: decodeLine's error
		{`{"input_ids":[01]}`, 0},                  // not JSON
		{`{"input_ids":[1.0]}`, 0},                 // not an int
		{`{"input_ids":[1e3]}`, 0},                 // not an int
		{`{"input_ids":[9999999999999999999]}`, 0}, // 19 digits: decodeLine decides
		{`{"input_ids":[1,]}`, 0},                  // not JSON
		{`{"input_ids":[1 2]}`, 0},                 // not JSON
		{`{"input_ids":[1]} {"input_ids":[2]}`, 0}, // two values
		{`{"input_ids":[1],}`, 0},                  // not JSON
		{`{"input_ids":[1],"input_ids":[2,3]}`, 0}, // duplicate key: decodeLine's rule
		{`{"Input_IDs":[1]}`, 0},                   // case-folded key: decodeLine's rule
		{`{"input_ids":[1],"loss_mask":[2]}`, 0},   // bad mask value
		{`{"input_ids":[1,2],"loss_mask":[1]}`, 0}, // mask length
		{`{"input_ids":[1],"loss_mask":null}`, 0},  // null
		{`{"input_ids":[1],"id":"x"}`, 0},          // other keys are decodeLine's
		{`{"text":"hi"}`, 0},                       // text samples are decodeLine's
		{`{"input_ids":[1]`, 0},                    // truncated
		{`{"input_\u0069ds":[1]}`, 0},              // escaped key
		{``, 0},
	} {
		n, ok := scanIDsLine([]byte(tc.line))
		if (tc.tokens > 0) != ok || n != tc.tokens && ok {
			t.Errorf("scanIDsLine(%q) = %d, %v; want %d", tc.line, n, ok, tc.tokens)
		}
		if ok {
			s, err := decodeLine([]byte(tc.line), 0)
			if err != nil || len(s.InputIDs) != n || s.Text != "" {
				t.Errorf("fast path took %q (%d tokens) but decodeLine says %d ids, %v", tc.line, n, len(s.InputIDs), err)
			}
		}
	}
}

func FuzzScanIDsLineAgreesWithDecodeLine(f *testing.F) {
	for _, s := range []string{`{"input_ids":[1,2,3]}`, `{"input_ids": [0, 1], "loss_mask": [1, 0]}`, `{"loss_mask":[1],"input_ids":[7]}`, `{"text":"x"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		n, ok := scanIDsLine(line)
		if !ok {
			return
		}
		s, err := decodeLine(line, 0)
		if err != nil || len(s.InputIDs) != n || s.Text != "" {
			t.Fatalf("fast path took %q (%d tokens) but decodeLine says %d ids, %v", line, n, len(s.InputIDs), err)
		}
	})
}
