package vocab

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/extract-dev/extract/internal/testsupport"
)

func TestMappingTakesTheMostFrequentTiesToTheFirstSeenAndPadsWithLowIDs(t *testing.T) {
	c := NewCounts(10)
	// Sample 1 sees 7 and 3 (once each), sample 2 sees 5 twice and 3 once: 3 (2), 5 (2),
	// 7 (1). With draft 2, 3 and 5 tie at 2, both in; with a tie at the cut, the one
	// seen first wins.
	c.Add([]int64{7, 3, 9}, []int64{1, 1, 0})
	c.Add([]int64{5, 5, 3}, []int64{1, 1, 1})
	d2t, t2d, err := Mapping(c, 2, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d2t, []int64{3, 4}) || !t2d[3] || !t2d[5] || t2d[7] || t2d[9] {
		t.Fatalf("d2t %v t2d %v", d2t, t2d)
	}
	c2 := NewCounts(10)
	c2.Add([]int64{8, 6}, []int64{1, 1}) // 8 and 6 tie, 8 and 6 seen in the same sample: the lower id
	d2t, _, _ = Mapping(c2, 1, 10)
	if !reflect.DeepEqual(d2t, []int64{6}) {
		t.Fatalf("tie in one sample: d2t %v", d2t)
	}
	// Fewer tokens seen than the draft size: the lowest ids not seen fill it.
	d2t, t2d, _ = Mapping(c, 5, 10)
	if !reflect.DeepEqual(d2t, []int64{0, 0, 1, 2, 3}) || !t2d[0] || !t2d[1] || t2d[2] {
		t.Fatalf("padded d2t %v (targets 0,1,3,5,7)", d2t)
	}
	if _, _, err := Mapping(c, 11, 10); err == nil {
		t.Fatal("a draft vocabulary larger than the target's was accepted")
	}
	if err := c.Add([]int64{10}, []int64{1}); err == nil {
		t.Fatal("a token outside the target vocabulary was counted")
	}
}

// The files are loaded by Debian's torch and compared with SpecForge's own
// process_token_dict_to_mappings run on counts made its way from the same samples.
func TestVocabMappingLoadsInTorchAndEqualsSpecForges(t *testing.T) {
	testsupport.Require(t, testsupport.Torch)
	src, _ := filepath.Abs("../../../shared/specforge-src")
	if _, err := os.Stat(filepath.Join(src, "specforge/data/preprocessing.py")); err != nil {
		testsupport.Unavailable(t, testsupport.SGLangSrc, "SpecForge source absent at %s", src)
	}
	for _, tc := range []struct {
		name                  string
		target, draft, tokens int
		samples               int
	}{
		{"many tokens, ties at the cut", 259, 64, 259, 200},
		{"fewer tokens than the draft", 259, 200, 40, 30},
		{"a large target", 50000, 4096, 50000, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rng := rand.New(rand.NewPCG(1, uint64(tc.target)))
			c := NewCounts(tc.target)
			f, _ := os.Create(filepath.Join(dir, "samples.jsonl"))
			for range tc.samples {
				n := 1 + rng.IntN(60)
				ids, mask := make([]int64, n), make([]int64, n)
				for i := range ids {
					ids[i] = int64(rng.IntN(tc.tokens)) // few distinct values: many ties
					if tc.tokens > 1000 {
						ids[i] = int64(rng.ExpFloat64()*float64(tc.tokens)/8) % int64(tc.tokens)
					}
					mask[i] = int64(rng.IntN(3) % 2)
				}
				if err := c.Add(ids, mask); err != nil {
					t.Fatal(err)
				}
				b, _ := json.Marshal(map[string][]int64{"input_ids": ids, "loss_mask": mask})
				f.Write(append(b, '\n'))
			}
			f.Close()
			d2t, t2d, err := Mapping(c, tc.draft, tc.target)
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, "out")
			if err := Write(out, c, d2t, t2d); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(testsupport.TorchPython(), "../../scripts/check_vocab_mapping.py", filepath.Join(out, Dir),
				"--samples", filepath.Join(dir, "samples.jsonl"), "--draft", fmt.Sprint(tc.draft), "--target", fmt.Sprint(tc.target), "--specforge", src)
			res, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("check: %v\n%s", err, res)
			}
			t.Logf("%s", res)
		})
	}
}
