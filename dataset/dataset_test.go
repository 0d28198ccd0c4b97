package dataset

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeDataset(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data.jsonl")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDatasetErrorsNameTheLineAndSay(t *testing.T) {
	good := `{"input_ids": [1, 2, 3]}` + "\n"
	tests := []struct {
		name, line, want string
	}{
		{"bad JSON", `{"input_ids": [1, 2`, "invalid JSON"},
		{"missing field", `{"prompt": "hi"}`, `missing "input_ids"`},
		{"both inputs", `{"input_ids": [1], "text": "a"}`, "both"},
		{"empty ids", `{"input_ids": []}`, "empty"},
		{"negative id", `{"input_ids": [1, -4]}`, `"input_ids"[1] = -4`},
		{"mask length", `{"input_ids": [1, 2], "loss_mask": [1]}`, `"loss_mask" has 1 values, "input_ids" has 2`},
		{"mask value", `{"input_ids": [1, 2], "loss_mask": [1, 2]}`, `"loss_mask"[1] = 2`},
		{"mask with text", `{"text": "hi", "loss_mask": [1, 1]}`, `"loss_mask" needs "input_ids"`},
		{"ids not ints", `{"input_ids": ["a"]}`, "invalid JSON"},
		{"null id", `{"input_ids": [1, null, 3]}`, `"input_ids"[1] is null`},
		{"null mask value", `{"input_ids": [1, 2], "loss_mask": [1, null]}`, `"loss_mask"[1] is null`},
		{"null id beside other keys", `{"id": "x", "input_ids": [null]}`, `"input_ids"[0] is null`},
		{"blank line", ``, "empty line"},
		{"two values", `{"input_ids": [1]} {"input_ids": [2]}`, "more than one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeDataset(t, good+good+tt.line+"\n"+good)
			_, err := Open(path)
			if !errors.Is(err, ErrBad) {
				t.Fatalf("err = %v, want ErrBad", err)
			}
			for _, want := range []string{path, "line 3 (sample 2)", tt.want} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
}

func TestDatasetSamplesReadBackAsWritten(t *testing.T) {
	path := writeDataset(t, `{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}`+"\n"+`{"text": "héllo"}`+"\r\n"+`{"input_ids": [9]}`)
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Len() != 3 || d.Tokens(0) != 3 || d.Tokens(1) != len("héllo") || d.TotalTokens(nil) != 3+6+1 {
		t.Fatalf("len %d, tokens %d %d, total %d", d.Len(), d.Tokens(0), d.Tokens(1), d.TotalTokens(nil))
	}
	s, err := d.Sample(0)
	if err != nil || len(s.InputIDs) != 3 || s.LossMask[0] != 0 {
		t.Errorf("sample 0 = %+v, %v", s, err)
	}
	s, err = d.Sample(1)
	if err != nil || s.Text != "héllo" || s.InputIDs != nil {
		t.Errorf("sample 1 = %+v, %v", s, err)
	}
	s, err = d.Sample(2)
	if err != nil || s.InputIDs[0] != 9 || s.LossMask != nil {
		t.Errorf("sample 2 (no trailing newline) = %+v, %v", s, err)
	}
}

func TestDatasetFingerprintFollowsContent(t *testing.T) {
	a := writeDataset(t, `{"input_ids": [1]}`+"\n")
	b := writeDataset(t, `{"input_ids": [2]}`+"\n")
	da, _ := Open(a)
	db, _ := Open(b)
	da2, _ := Open(a)
	if da.Fingerprint == db.Fingerprint || da.Fingerprint != da2.Fingerprint {
		t.Errorf("fingerprints: %s %s %s", da.Fingerprint, db.Fingerprint, da2.Fingerprint)
	}
}

func TestEmptyDatasetIsRefused(t *testing.T) {
	if _, err := Open(writeDataset(t, "")); !errors.Is(err, ErrBad) {
		t.Errorf("err = %v", err)
	}
}
