package dataset

import (
	"os"
	"path/filepath"
	"testing"
)

// A prepared conversation's line carries "id" and "line" beside the ids: the fast scan
// takes it, and the sample keeps its source id.
func TestPreparedLinesScanFastAndKeepTheirSourceID(t *testing.T) {
	for _, tc := range []struct {
		line string
		fast bool
		id   string
	}{
		{`{"input_ids":[1,2,3],"loss_mask":[0,1,1],"id":"conv-7","line":9}`, true, "conv-7"},
		{`{"id":"a","input_ids":[1,2],"line":3}`, true, "a"},
		{`{"input_ids":[1,2],"id":"with \"escape\""}`, false, `with "escape"`},
		{`{"input_ids":[1,2],"id":12}`, false, "12"},
		{`{"input_ids":[1,2],"line":-1}`, false, ""},
	} {
		n, fast := scanIDsLine([]byte(tc.line))
		if fast != tc.fast || (fast && n == 0) {
			t.Errorf("%s: fast %v (%d tokens), want %v", tc.line, fast, n, tc.fast)
		}
		s, err := decodeLine([]byte(tc.line), 0)
		if err != nil {
			t.Fatalf("%s: %v", tc.line, err)
		}
		if s.SourceID != tc.id {
			t.Errorf("%s: source id %q, want %q", tc.line, s.SourceID, tc.id)
		}
	}
	p := filepath.Join(t.TempDir(), "d.jsonl")
	os.WriteFile(p, []byte(`{"input_ids":[5,6],"loss_mask":[0,1],"id":"x","line":2}`+"\n"), 0o644)
	ds, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if s, err := ds.Sample(0); err != nil || s.SourceID != "x" || ds.Tokens(0) != 2 {
		t.Fatalf("sample %+v, %v", s, err)
	}
}
