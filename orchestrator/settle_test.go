package orchestrator

import (
	"errors"
	"strings"
	"testing"

	"github.com/extract-dev/extract/checkpoint"
)

// A run that ran to its end finishes (exit 0) only when every sample it owns is done or
// failed: a sample a failed MarkFailed dropped from the queues is neither, and the run
// is a temporary failure (exit 75), not finished with done < total.
func TestARunIsFinishedOnlyWhenDonePlusFailedIsWhatItOwns(t *testing.T) {
	for _, tc := range []struct {
		name         string
		done, failed int
		temporary    bool
		want         string // "" is finished
	}{
		{"all done", 10, 0, false, ""},
		{"one dropped by a failed index write", 9, 0, true, "1 of its 10 samples neither done nor failed"},
		{"one dropped, one failed", 8, 1, true, "1 of its 10 samples neither done nor failed"},
		{"some failed", 8, 2, false, "2 samples failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := settle(checkpoint.Counters{Done: tc.done, Failed: tc.failed}, 10, 3)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("settle = %v, want finished", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("settle = %v, want %q", err, tc.want)
			}
			if errors.Is(err, ErrTemporary) != tc.temporary {
				t.Fatalf("settle = %v: temporary %v, want %v", err, errors.Is(err, ErrTemporary), tc.temporary)
			}
		})
	}
}
