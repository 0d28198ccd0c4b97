// Command benchtool is the measuring half of scripts/bench.sh: it synthesizes datasets,
// dumps and indexes, drives `extract` and its simulator, and measures each figure of
// docs/performance.md against the physical path measured in the same run.
//
//	benchtool mover   -shm D -out D -results F            figure 1: mover vs cp + sync
//	benchtool small   -shm D -out D -results F            figure 2: 256 KiB dumps through the full path
//	benchtool e2e     -extract BIN -shm D -out D ...      figure 3 (+ figure 5, live status)
//	benchtool resume  -extract BIN -shm D -out D ...      figure 4 (+ figure 5, status from the index)
//	benchtool rss     -extract BIN -shm D -out D ...      figure 6: peak RSS moving 8 × 256 MiB
//	benchtool dataset -o F -n N -tokens T                 a JSONL dataset of input_ids
//	benchtool index   -config F -done N                   an index with N samples done
//	benchtool shards  -extract BIN -out D -shards 8 -per 1000000   figure 7: status --all
//	benchtool replicas -extract BIN -shm D -out D ...     figure 8: the job with 1, 2, 4 replicas vs simulators + cp + sync
//	benchtool report  -results F                          the table
//
// Each figure appends JSON lines to the results file; report prints them as a table.
// Absolute times on shared machines are noise; the ratios are the point.
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
)

type command struct {
	help string
	run  func(args []string) error
}

var commands = map[string]command{
	"mover":    {"figure 1: mover vs cp + sync of the same large dumps", cmdMover},
	"small":    {"figure 2: small dumps through validate, move, fsync, index", cmdSmall},
	"e2e":      {"figure 3: simulator alone vs the whole job (and figure 5, live status)", cmdE2E},
	"resume":   {"figure 4: time to the first request on --resume (and figure 5, status from the index)", cmdResume},
	"rss":      {"figure 6: peak RSS of extract run while it moves 8 × 256 MiB", cmdRSS},
	"dataset":  {"write a JSONL dataset of input_ids", cmdDataset},
	"index":    {"write an index with N samples done", cmdIndex},
	"report":   {"print the results as a table", cmdReport},
	"shards":   {"figure 7: status --all over 8 shards of 1M samples", cmdShards},
	"replicas": {"figure 8: the whole job with 1, 2, 4 simulator replicas vs simulators + cp + sync; overhead per sample", cmdReplicas},
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: benchtool <command> [flags]")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", n, commands[n].help)
	}
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		usage()
		os.Exit(2)
	}
	if err := c.run(os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "benchtool %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// commonFlags are the directories and files every figure uses.
type commonFlags struct {
	extract string
	shm     string
	out     string
	results string
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.extract, "extract", "", "the extract binary")
	fs.StringVar(&c.shm, "shm", "/dev/shm/extract-bench", "staging dir base (a tmpfs)")
	fs.StringVar(&c.out, "out", "", "output dir base (on the output disk)")
	fs.StringVar(&c.results, "results", "", "append results (JSON lines) to this file")
}

func (c *commonFlags) check(needExtract bool) error {
	if c.out == "" {
		return fmt.Errorf("-out is required")
	}
	if needExtract && c.extract == "" {
		return fmt.Errorf("-extract is required")
	}
	return nil
}

// logErr reports a deferred cleanup's failure (a temp dir not removed, an index not
// closed cleanly): the figures stand, but the operator should know what was left.
// Cleanup on a path that already failed (a Close after a write error, a Kill of a
// simulator that did not come up) is discarded with `_ =`: the first error is the one
// returned.
func logErr(what string, err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchtool: %s: %v\n", what, err)
	}
}
