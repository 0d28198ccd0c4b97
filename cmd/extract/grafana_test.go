package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

const dashboardPath = "../../docs/grafana/extract.json"

// promQuery is one PromQL expression of the dashboard and the legend that names its
// labels.
type promQuery struct{ where, expr, legend string }

// dashboardQueries walks the dashboard's JSON for every PromQL it holds: panel
// targets and annotations (expr), and template variables (label_values queries).
func dashboardQueries(v any, where string) []promQuery {
	var out []promQuery
	switch x := v.(type) {
	case map[string]any:
		if title, ok := x["title"].(string); ok {
			where += "/" + title
		} else if name, ok := x["name"].(string); ok {
			where += "/" + name
		}
		if e, ok := x["expr"].(string); ok {
			legend, _ := x["legendFormat"].(string)
			if tf, ok := x["titleFormat"].(string); ok {
				legend += tf
			}
			out = append(out, promQuery{where, e, legend})
		}
		if q, ok := x["definition"].(string); ok {
			out = append(out, promQuery{where, q, ""})
		}
		for k, c := range x {
			if k != "expr" {
				out = append(out, dashboardQueries(c, where)...)
			}
		}
	case []any:
		for _, c := range x {
			out = append(out, dashboardQueries(c, where)...)
		}
	}
	return out
}

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^}]*)\}`)
	promMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	labelValues  = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
	legendLabel  = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	// promWords are PromQL's functions and keywords, which look like names.
	promWords = map[string]bool{"sum": true, "max": true, "min": true, "avg": true, "count": true, "rate": true, "irate": true,
		"increase": true, "deriv": true, "changes": true, "histogram_quantile": true, "label_values": true, "by": true,
		"without": true, "on": true, "ignoring": true, "and": true, "or": true, "unless": true, "offset": true, "time": true}
	// targetLabels are the labels Prometheus adds to every series it scrapes.
	targetLabels = []string{"instance", "job"}
)

// checkDashboard lists what the queries name that the scrape does not have: series,
// and labels (in selectors, groupings and legends) on the series they are used with.
func checkDashboard(qs []promQuery, fams map[string]*dto.MetricFamily) []string {
	var problems []string
	labelsOf := func(name string) ([]string, bool) {
		var extra []string
		f, ok := fams[name]
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, found := strings.CutSuffix(name, suffix); !ok && found {
				if hf, hok := fams[b]; hok && (hf.GetType() == dto.MetricType_HISTOGRAM || hf.GetType() == dto.MetricType_SUMMARY) {
					f, ok = hf, true
					if suffix == "_bucket" {
						extra = []string{"le"}
					}
				}
			}
		}
		if !ok || len(f.GetMetric()) == 0 {
			return nil, false
		}
		labels := append(slices.Clone(targetLabels), extra...)
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName())
			}
		}
		return labels, true
	}
	for _, q := range qs {
		expr := promRanges.ReplaceAllString(promStrings.ReplaceAllString(q.expr, `""`), "")
		var used, names, seen []string
		var all []string // every label of every series the query reads
		check := func(metric string, labels []string) {
			seen = append(seen, metric)
			have, ok := labelsOf(metric)
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: %q names series %s, which the live /metrics does not have", q.where, q.expr, metric))
				return
			}
			names = append(names, metric)
			all = append(all, have...)
			for _, l := range labels {
				if !slices.Contains(have, l) {
					problems = append(problems, fmt.Sprintf("%s: %q selects label %s on %s, which has only %v", q.where, q.expr, l, metric, slices.Compact(slices.Sorted(slices.Values(have)))))
				}
			}
		}
		if m := labelValues.FindStringSubmatch(expr); m != nil {
			check(m[1], []string{m[2]})
			continue
		}
		for _, m := range promSelector.FindAllStringSubmatch(expr, -1) {
			var ls []string
			for _, lm := range promMatcher.FindAllStringSubmatch(m[2], -1) {
				ls = append(ls, lm[1])
			}
			if m[1] != "" {
				check(m[1], ls)
			}
		}
		for _, g := range promGrouping.FindAllStringSubmatch(expr, -1) {
			for _, l := range strings.Split(g[1], ",") {
				if l = strings.TrimSpace(l); l != "" {
					used = append(used, l)
				}
			}
		}
		rest := promGrouping.ReplaceAllString(promSelector.ReplaceAllString(expr, "$1"), "")
		for _, id := range promIdent.FindAllString(rest, -1) {
			if !promWords[id] && !slices.Contains(seen, id) && strings.Contains(id, "_") {
				check(id, nil)
			}
		}
		for _, m := range legendLabel.FindAllStringSubmatch(q.legend, -1) {
			used = append(used, m[1])
		}
		if len(seen) == 0 {
			problems = append(problems, fmt.Sprintf("%s: %q reads no series", q.where, q.expr))
			continue
		}
		for _, l := range used {
			if len(names) > 0 && !slices.Contains(all, l) {
				problems = append(problems, fmt.Sprintf("%s: %q uses label %s, which none of %v has", q.where, q.expr, l, names))
			}
		}
	}
	return problems
}

// TestTheGrafanaDashboardNamesOnlySeriesAndLabelsALiveRunExports scrapes the /metrics
// of a running two-replica job and checks every query of docs/grafana/extract.json
// against it; then checks that the checker catches a misspelt series and label.
func TestTheGrafanaDashboardNamesOnlySeriesAndLabelsALiveRunExports(t *testing.T) {
	var dash map[string]any
	if err := json.Unmarshal([]byte(mustRead(t, dashboardPath)), &dash); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var rows []string
	panels, _ := dash["panels"].([]any)
	for _, p := range panels {
		p := p.(map[string]any)
		if p["type"] == "row" {
			rows = append(rows, p["title"].(string))
		} else if ts, _ := p["targets"].([]any); len(ts) == 0 {
			t.Errorf("panel %q has no query", p["title"])
		}
	}
	if want := []string{"Progress", "Servers", "Storage", "Admission"}; !slices.Equal(rows, want) {
		t.Errorf("rows %v, want one per concern: %v", rows, want)
	}

	j := newJob(t, 200, 2000)
	j.withReplicas(2)
	// A stranger's file in staging: never read, but counted as a rejected dump.
	foreign := filepath.Join(j.shmDir, "notes.txt")
	if err := os.WriteFile(foreign, []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, wait := j.start("run")
	j.waitStatus("progress on both replicas", func(st map[string]any) bool {
		ss := servers(st)
		return len(ss) == 2 && num(ss[0]["done"]) > 2 && num(ss[1]["done"]) > 2
	})
	var ri struct {
		StatusAddr string `json:"status_addr"`
	}
	if err := json.Unmarshal([]byte(mustRead(t, filepath.Join(j.state, "run.json"))), &ri); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + ri.StatusAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d\n%s", code, stderr)
	}
	os.Remove(foreign)
	j.requireExact()

	qs := dashboardQueries(dash, "")
	if len(qs) < 20 {
		t.Fatalf("found %d queries in the dashboard: the walk is broken", len(qs))
	}
	for _, p := range checkDashboard(qs, fams) {
		t.Error(p)
	}
	// The checker fails where it should: a series that does not exist, a label that a
	// series does not have, a legend naming a label of no series in the query.
	bad := []promQuery{
		{"bad/series", `sum(extract_samples_donee{instance=~"$instance"})`, ""},
		{"bad/label", `extract_server_up{replika="0"}`, ""},
		{"bad/legend", `extract_output_free_bytes`, "{{replica}}"},
	}
	if got := checkDashboard(bad, fams); len(got) != 3 {
		t.Errorf("the checker found %d problems in 3 bad queries: %q", len(got), got)
	}
}
