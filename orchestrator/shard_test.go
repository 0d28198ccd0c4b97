package orchestrator

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/extract-dev/extract/configs"
)

func TestShardRangesTileTheDatasetExactlyOnceAndDifferByAtMostOne(t *testing.T) {
	for _, total := range []int{0, 1, 7, 300, 37312, 1_000_003} {
		for _, n := range []int{1, 2, 3, 4, 8, 13, 64} {
			next, smallest, largest := 0, total, 0
			for i := range n {
				lo, hi := ShardRange(total, i, n)
				if lo != next || hi < lo {
					t.Fatalf("total %d, n %d: shard %d is [%d, %d), want it to start at %d", total, n, i, lo, hi, next)
				}
				smallest, largest = min(smallest, hi-lo), max(largest, hi-lo)
				next = hi
				for _, s := range []int{lo, hi - 1, (lo + hi) / 2} {
					if s >= lo && s < hi && ShardOf(s, total, n) != i {
						t.Fatalf("total %d, n %d: ShardOf(%d) = %d, want %d", total, n, s, ShardOf(s, total, n), i)
					}
				}
			}
			if next != total || largest-smallest > 1 {
				t.Fatalf("total %d, n %d: ranges end at %d, sizes %d..%d", total, n, next, smallest, largest)
			}
		}
	}
	// The documented rule, spelled out once: 10 samples in 4 shards.
	want := [][2]int{{0, 2}, {2, 5}, {5, 7}, {7, 10}}
	for i, w := range want {
		if lo, hi := ShardRange(10, i, 4); lo != w[0] || hi != w[1] {
			t.Errorf("ShardRange(10, %d, 4) = [%d, %d), want %v", i, lo, hi, w)
		}
	}
}

func TestAChangedShardCountIsRefusedNamingHowToReplan(t *testing.T) {
	base := t.TempDir()
	mk := func(rel string) {
		if err := os.MkdirAll(filepath.Join(base, rel), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(base, rel, "index.db"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfgOf := func(i, n int) *configs.Config {
		c := &configs.Config{StateDir: base, Shard: configs.Shard{Index: i, Count: n}}
		if n > 0 {
			c.StateDir = filepath.Join(base, configs.ShardDirName(i, n))
		}
		return c
	}
	if err := checkShardPlan(cfgOf(1, 4)); err != nil {
		t.Fatalf("an empty state dir refused a plan: %v", err)
	}
	mk("shard-0-of-4")
	mk("shard-3-of-4")
	if err := checkShardPlan(cfgOf(2, 4)); err != nil {
		t.Fatalf("the same plan refused: %v", err)
	}
	for _, c := range []*configs.Config{cfgOf(2, 8), cfgOf(0, 0)} {
		err := checkShardPlan(c)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "plan of 4 shards") || !strings.Contains(err.Error(), "--fresh") {
			t.Errorf("shard %v over a 4-shard plan: %v; want ErrRefused naming the plan and how to re-plan", c.Shard, err)
		}
	}
	base2 := t.TempDir()
	os.WriteFile(filepath.Join(base2, "index.db"), nil, 0o644)
	c := &configs.Config{StateDir: filepath.Join(base2, "shard-0-of-2"), Shard: configs.Shard{Index: 0, Count: 2}}
	if err := checkShardPlan(c); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "unsharded") {
		t.Errorf("a shard over an unsharded job: %v", err)
	}
}
