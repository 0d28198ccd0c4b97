package prepare

import (
	"strings"
	"testing"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/sglang/tokenizer"
)

func TestOneWorkerPerCoreStopsAtWhatOnePoolForks(t *testing.T) {
	for cpus, want := range map[int]int{2: 2, 480: 480, 768: 480} {
		if got := workersPerCore(cpus); got != want {
			t.Errorf("%d cores: %d workers, want %d", cpus, got, want)
		}
	}
}

// The config refuses exactly the worker counts the tokenizer pool would.
func TestTheConfigsWorkerBoundIsThePoolsOwn(t *testing.T) {
	for n, refused := range map[int]bool{tokenizer.MaxWorkers: false, tokenizer.MaxWorkers + 1: true} {
		c := configs.Default()
		c.Prepare.Workers = n
		err := c.Validate()
		if got := err != nil && strings.Contains(err.Error(), "prepare.workers"); got != refused {
			t.Errorf("prepare.workers %d: refused %v, want %v (%v)", n, got, refused, err)
		}
	}
}
