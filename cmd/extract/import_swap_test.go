package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/extract-dev/extract/checkpoint"
)

// TestImportWhileAnotherToolSwapsGoodAndNaNFilesCountsOnlyGoodOnesDone runs `extract
// import` (linking into a specforge job, and with --copy into a safetensors one) while
// the test, as another tool, renames a good and a NaN version of every torch-written
// source file over its name, round and round: every file import counts done must hold
// the good version.
func TestImportWhileAnotherToolSwapsGoodAndNaNFilesCountsOnlyGoodOnesDone(t *testing.T) {
	const n = 40
	for _, c := range []struct{ name, format, flag string }{{"link", "specforge", ""}, {"copy", "safetensors", "--copy"}} {
		t.Run(c.name, func(t *testing.T) {
			j := newJob(t, n, 50000)
			j.format = c.format
			j.env = append(j.env, "EXTRACT_OUTPUT_FORMAT="+c.format)
			all, nan := make([]int, n), map[int]string{}
			for i := range all {
				all[i], nan[i] = i, "NaN"
			}
			good, bad, from := filepath.Join(j.dir, "good"), filepath.Join(j.dir, "bad"), filepath.Join(j.dir, "from")
			j.writeSpecForgeFiles(good, all, nil)
			j.writeSpecForgeFiles(bad, all, nan)
			rel := func(s int) string { return fmt.Sprintf("rows_0-2000/data_%d.ckpt", s) }
			for s := range n {
				os.MkdirAll(filepath.Join(from, "rows_0-2000"), 0o755)
				if err := os.Link(filepath.Join(good, rel(s)), filepath.Join(from, rel(s))); err != nil {
					t.Fatal(err)
				}
			}
			stop := make(chan struct{})
			var swaps atomic.Int64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					s, master := i%n, []string{good, bad}[i/n%2]
					name := filepath.Join(from, rel(s))
					if os.Link(filepath.Join(master, rel(s)), name+".swap") == nil && os.Rename(name+".swap", name) == nil {
						swaps.Add(1)
					}
					os.Remove(name + ".swap")
				}
			}()
			args := []string{"import", "--from", from, "--json"}
			if c.flag != "" {
				args = append(args, c.flag)
			}
			r := j.run(args...)
			close(stop)
			wg.Wait()
			var sum struct {
				Imported int `json:"imported"`
				Rejected []struct {
					Reason string `json:"reason"`
				} `json:"rejected"`
			}
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &sum) != nil {
				t.Fatalf("import: exit %d\n%s%s", r.code, r.stdout, r.stderr)
			}
			for _, rj := range sum.Rejected {
				if !strings.Contains(rj.Reason, "not finite") && !strings.Contains(rj.Reason, "changed while") {
					t.Errorf("refused for another reason: %s", rj.Reason)
				}
			}
			bads := 0
			for s := range n {
				out := j.layout().Path(s)
				got, err := checkpoint.ReadTensors(out)
				if os.IsNotExist(err) || (err != nil && strings.Contains(err.Error(), "no such file")) {
					continue
				}
				want, _ := checkpoint.ReadTensors(filepath.Join(good, rel(s)))
				if err != nil || !bytes.Equal(got["hidden_state"], want["hidden_state"]) {
					bads++
				}
			}
			t.Logf("%d swaps during the import: %d imported, %d refused", swaps.Load(), sum.Imported, len(sum.Rejected))
			if len(sum.Rejected) == 0 {
				t.Fatalf("no file was refused: the swaps never reached the import (%d swaps)", swaps.Load())
			}
			if bads > 0 || sum.Imported+len(sum.Rejected) != n {
				t.Fatalf("%d of %d imported files are not the good version (%d refused)", bads, sum.Imported, len(sum.Rejected))
			}
		})
	}
}
