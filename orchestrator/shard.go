package orchestrator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
)

// ShardRange is the rule that splits a job across nodes: of a dataset of total samples,
// shard i of n owns the contiguous range [lo, hi) with lo = ⌊i·total/n⌋ and
// hi = ⌊(i+1)·total/n⌋. The ranges tile 0..total-1 exactly once, their sizes differ by
// at most one, and they depend on nothing but (total, i, n), so every node, `plan`,
// `status --all` and `verify --all` compute the same split with no coordination.
//
// Contiguous ranges rather than an interleave (i, i+n, i+2n, ...) because that is what
// the peers do (Model-Optimizer's --dp-rank/--dp-world-size, SpecForge, DeepSpec): a
// split made by one of them reads the same way here; and because a shard then writes
// its own rows_<g>-<g+2000> folders instead of every shard creating entries in every
// folder, which a shared filesystem serialises. The cost is balance on a dataset sorted
// by length; `extract plan` shows each shard's tokens and bytes before anything runs.
func ShardRange(total, i, n int) (lo, hi int) {
	if n <= 0 {
		return 0, total
	}
	at := func(k int) int { return int(int64(k) * int64(total) / int64(n)) }
	return at(i), at(i + 1)
}

// ShardOf says which shard of n owns sample s of total (ShardRange's inverse).
func ShardOf(s, total, n int) int {
	if n <= 0 {
		return 0
	}
	// The first shard whose range ends past s.
	i := int((int64(s)*int64(n) + int64(n) - 1) / int64(max(total, 1)))
	for i > 0 {
		if lo, _ := ShardRange(total, i, n); lo <= s {
			break
		}
		i--
	}
	for {
		if _, hi := ShardRange(total, i, n); s < hi || i == n-1 {
			return i
		}
		i++
	}
}

// shardSpan is the part of the dataset this run owns: all of it when unsharded.
type shardSpan struct{ lo, hi int }

func spanOf(cfg *configs.Config, total int) shardSpan {
	lo, hi := ShardRange(total, cfg.Shard.Index, cfg.Shard.Count)
	return shardSpan{lo, hi}
}

func (p shardSpan) owns(s int) bool { return s >= p.lo && s < p.hi }
func (p shardSpan) size() int       { return p.hi - p.lo }

// planDirs lists the shard subdirs under a job's state dir that hold an index, by
// their plan's shard count.
func planDirs(jobStateDir string) (map[int][]string, error) {
	entries, err := os.ReadDir(jobStateDir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state dir: %w", err)
	}
	plans := map[int][]string{}
	for _, e := range entries {
		_, n, ok := configs.ParseShardDirName(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(jobStateDir, e.Name(), "index.db")); err == nil || hasGenerateIndex(filepath.Join(jobStateDir, e.Name())) {
			plans[n] = append(plans[n], e.Name())
		}
	}
	return plans, nil
}

// checkShardPlan refuses a run whose split differs from the one already under the job's
// state dir: with a changed n the new ranges cut across the old ones, and each sample
// would be owned by two indexes, done twice or counted by neither.
func checkShardPlan(cfg *configs.Config) error {
	base := cfg.JobStateDir()
	plans, err := planDirs(base)
	if err != nil {
		return err
	}
	n := cfg.Shard.Count
	var other []int
	for m := range plans {
		if m != n {
			other = append(other, m)
		}
	}
	slices.Sort(other)
	_, statErr := os.Stat(filepath.Join(base, "index.db"))
	unsharded := statErr == nil
	// howTo says the two ways on: keep the old plan, or move it aside and start over.
	howTo := func(old string) string {
		start := "start it with `extract run --fresh`"
		if n > 0 {
			start = fmt.Sprintf("start every shard of the new plan with `extract run --fresh --shard i/%d`", n)
		}
		return fmt.Sprintf("or re-plan: stop the old plan's runs, move its state aside (`mkdir %s/old && mv %s %s/old/`), and %s (outputs already written are rewritten)",
			base, old, base, start)
	}
	switch {
	case n > 0 && unsharded:
		return fmt.Errorf("%w: state dir %s holds an unsharded job (index.db) but this run asks for shard %s: run it without --shard, %s",
			ErrRefused, base, cfg.Shard, howTo(filepath.Join(base, "index.db")))
	case len(other) > 0:
		m := other[0]
		ask := "is unsharded"
		if n > 0 {
			ask = fmt.Sprintf("asks for shard %s, a plan of %d", cfg.Shard, n)
		}
		return fmt.Errorf("%w: state dir %s holds a plan of %d shards (%s) but this run %s: keep that plan with --shard i/%d (or %s=%d with --shard auto), %s",
			ErrRefused, base, m, strings.Join(plans[m], ", "), ask, m, configs.EnvName("shard.count"), m,
			howTo(filepath.Join(base, fmt.Sprintf("shard-*-of-%d", m))))
	}
	return nil
}

// PlanRow is one shard of `extract plan`: its range and what it will write.
type PlanRow struct {
	Shard   int    `json:"shard"`
	Dir     string `json:"state_dir"`
	First   int    `json:"first"` // the range is [first, end)
	End     int    `json:"end"`
	Samples int    `json:"samples"`
	Tokens  int64  `json:"tokens"`
	// Bytes estimates the shard's output: its tokens at the job's bytes per token.
	Bytes int64 `json:"estimated_bytes"`
}

// Plan splits the job's dataset in n shards by ShardRange and estimates each one's output.
func Plan(cfg *configs.Config, n int) ([]PlanRow, error) {
	if n < 1 || n > configs.MaxShards {
		return nil, fmt.Errorf("%w: --shards must be 1..%d, got %d", ErrRefused, configs.MaxShards, n)
	}
	ds, err := dataset.OpenJob(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = ds.Close() }()
	rows := make([]PlanRow, n)
	for i := range rows {
		lo, hi := ShardRange(ds.Len(), i, n)
		var tokens int64
		for s := lo; s < hi; s++ {
			tokens += int64(ds.Tokens(s))
		}
		rows[i] = PlanRow{Shard: i, Dir: filepath.Join(cfg.JobStateDir(), configs.ShardDirName(i, n)),
			First: lo, End: hi, Samples: hi - lo, Tokens: tokens, Bytes: tokens * cfg.OutputBytesPerToken()}
	}
	return rows, nil
}
