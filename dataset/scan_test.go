package dataset

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// scanIDsLine is Open's fast path: whatever it accepts, decodeLine must accept
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
		{`{"input_ids":[1],"source":"x"}`, 0},      // other keys are decodeLine's
		{`{"input_ids":[1],"id":"x","line":4}`, 1}, // a prepared conversation's id and line
		{`{"input_ids":[1],"id":"\u0078"}`, 0},     // an escaped id: decodeLine's
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

// FuzzDecodeLineKeepsEveryIDAsWritten pins what the null fix is for: every id decodeLine
// returns is the number the line says at that place, never a 0 made from a null.
func FuzzDecodeLineKeepsEveryIDAsWritten(f *testing.F) {
	for _, s := range []string{`{"input_ids":[1,2,3]}`, `{"input_ids":[1,null,3]}`, `{"input_ids":[0],"loss_mask":[null]}`, `{"id":null,"input_ids":[4]}`, `{"Input_IDs":[null],"input_ids":[1]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		s, err := decodeLine(line, 0)
		if err != nil || s.InputIDs == nil {
			return
		}
		var m map[string]any
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.UseNumber()
		if dec.Decode(&m) != nil {
			return
		}
		for _, key := range []string{"input_ids", "loss_mask"} {
			var variants []any
			for k, v := range m {
				if strings.EqualFold(k, key) {
					variants = append(variants, v)
				}
			}
			if len(variants) != 1 {
				continue // case-folded or duplicate keys: which one encoding/json took is its business
			}
			list, _ := variants[0].([]any)
			want := s.InputIDs
			if key == "loss_mask" {
				want = s.LossMask
			}
			for i, v := range list {
				n, ok := v.(json.Number)
				if !ok || i >= len(want) || n.String() != strconv.FormatInt(want[i], 10) {
					t.Fatalf("%q: %s[%d] is %v in the line but %v decoded", line, key, i, v, want)
				}
			}
		}
	})
}
