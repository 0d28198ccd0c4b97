package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/extract-dev/extract/orchestrator"
)

func TestProgressBarShowsRateETAAndWhyItIsPaused(t *testing.T) {
	st := orchestrator.Status{Total: 200, Done: 50, SamplesPerSecond: 2.5, ETASeconds: 60, Paused: []string{"output disk reserve: 1 GiB free"}, Server: orchestrator.ServerStatus{State: "ready"}}
	line := renderBar(st, 20)
	for _, want := range []string{"[#####---------------]", "25.0%", "50/200", "2.5 samples/s", "ETA 1m0s", "PAUSED: output disk reserve"} {
		if !strings.Contains(line, want) {
			t.Errorf("bar %q lacks %q", line, want)
		}
	}
}

func TestLogLinesPrintAboveTheBar(t *testing.T) {
	var out bytes.Buffer
	bar := &progressBar{w: &out}
	bar.update(orchestrator.Status{Total: 10, Done: 1, ETASeconds: -1})
	bar.Write([]byte("level=INFO msg=hello\n"))
	got := out.String()
	i, j := strings.LastIndex(got, "msg=hello"), strings.LastIndex(got, "1/10")
	if i < 0 || j < i {
		t.Errorf("the bar is not redrawn below the log line: %q", got)
	}
}
