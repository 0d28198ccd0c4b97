package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
)

// result is one row of the table. Ratio is the figure against its baseline, oriented so
// that 1.0 means "as fast as the physical path" (higher is better).
type result struct {
	Fig      string  `json:"fig"`
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Baseline string  `json:"baseline,omitempty"` // what the ratio is against, with its value
	Ratio    float64 `json:"ratio,omitempty"`
	Target   string  `json:"target,omitempty"`
	Met      string  `json:"met,omitempty"` // yes | NO | "" when there is no target
	Note     string  `json:"note,omitempty"`
}

func met(ok bool) string {
	if ok {
		return "yes"
	}
	return "NO"
}

// emit prints a result and appends it to the results file.
func emit(path string, r result) error {
	line := fmt.Sprintf("fig %s  %-52s %12s %-8s", r.Fig, r.Name, fmtValue(r.Value), r.Unit)
	if r.Ratio != 0 {
		line += fmt.Sprintf(" ratio %.3f vs %s", r.Ratio, r.Baseline)
	}
	if r.Target != "" {
		line += fmt.Sprintf("  [target %s: %s]", r.Target, r.Met)
	}
	fmt.Println(line)
	if path == "" {
		return nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func fmtValue(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 100:
		return fmt.Sprintf("%.1f", v)
	case v >= 1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3f", v)
}

func readResults(path string) ([]result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { logErr("f.Close()", f.Close()) }()
	var rs []result
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		rs = append(rs, r)
	}
	return rs, sc.Err()
}

// lookup finds the value of the named result, for figures that use another's baseline.
func lookup(path, fig, name string) (float64, bool) {
	if path == "" {
		return 0, false
	}
	rs, err := readResults(path)
	if err != nil {
		return 0, false
	}
	for _, r := range rs {
		if r.Fig == fig && r.Name == name {
			return r.Value, true
		}
	}
	return 0, false
}

func cmdReport(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	path := fs.String("results", "", "results file (JSON lines)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rs, err := readResults(*path)
	if err != nil {
		return err
	}
	// By figure; within one, in the order measured.
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Fig < rs[j].Fig })
	fmt.Println("| # | measurement | setup | value | ratio | against (same run) | target | met |")
	fmt.Println("|---|---|---|---:|---:|---|---|---|")
	for _, r := range rs {
		ratio := ""
		if r.Ratio != 0 {
			ratio = fmt.Sprintf("%.2f×", r.Ratio)
		}
		fmt.Printf("| %s | %s | %s | %s %s | %s | %s | %s | %s |\n", r.Fig, strings.TrimSpace(r.Name), r.Note, fmtValue(r.Value), r.Unit, ratio, r.Baseline, r.Target, r.Met)
	}
	return nil
}
