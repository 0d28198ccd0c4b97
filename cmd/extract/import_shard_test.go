package main

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/extract-dev/extract/checkpoint"
)

type shardImport struct {
	Imported int `json:"imported"`
	Done     int `json:"done"`
	Total    int `json:"total"`
	Skipped  []struct {
		Sample int    `json:"sample"`
		Reason string `json:"reason"`
	} `json:"skipped"`
}

func TestImportWithShardTakesOnlyThatShardsSamplesAndListsTheRestAsSkipped(t *testing.T) {
	const n = 40
	j := newJob(t, n, 50000)
	from := j.dir + "/specforge-out"
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	j.writeSpecForgeFiles(from, all, nil)
	imp := func(shard string) shardImport {
		t.Helper()
		r := j.run("import", "--from", from, "--shard", shard, "--json")
		var s shardImport
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &s) != nil {
			t.Fatalf("import --shard %s: exit %d\n%s%s", shard, r.code, r.stdout, r.stderr)
		}
		return s
	}
	s0 := imp("0/2")
	if s0.Imported != n/2 || s0.Done != n/2 || s0.Total != n/2 || len(s0.Skipped) != n/2 || s0.Skipped[0].Sample != n/2 || s0.Skipped[0].Reason != "shard 1 of 2 owns it" {
		t.Fatalf("import --shard 0/2 = %+v; want the first %d imported, the rest skipped", s0, n/2)
	}
	if js := j.statusAll(); js.Done != n/2 || js.Pending != n/2 || js.Total != n {
		t.Fatalf("status --all after shard 0's import: %+v; want %d of %d done, %d pending", js, n/2, n, n/2)
	}
	l := checkpoint.Layout{Dir: j.out}
	before := map[int]os.FileInfo{}
	for s := range n / 2 {
		st, err := os.Stat(l.Path(s))
		if err != nil {
			t.Fatalf("shard 0's sample %d: %v", s, err)
		}
		before[s] = st
	}
	for s := n / 2; s < n; s++ {
		if _, err := os.Stat(l.Path(s)); !os.IsNotExist(err) {
			t.Fatalf("shard 1's sample %d was written by shard 0's import (%v)", s, err)
		}
	}
	if s1 := imp("1/2"); s1.Imported != n/2 || s1.Done != n/2 || len(s1.Skipped) != n/2 || s1.Skipped[0].Sample != 0 {
		t.Fatalf("import --shard 1/2 = %+v", s1)
	}
	for s, st := range before {
		if now, err := os.Stat(l.Path(s)); err != nil || !os.SameFile(st, now) || now.ModTime() != st.ModTime() {
			t.Errorf("shard 0's sample %d was rewritten by shard 1's import", s)
		}
	}
	if js := j.statusAll(); js.Done != n || js.Pending != 0 || js.State != "complete" {
		t.Fatalf("status --all after both imports: %+v; want all %d done", js, n)
	}
	if r := j.run("verify", "--all", "--deep"); r.code != 0 {
		t.Fatalf("verify --all --deep: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
