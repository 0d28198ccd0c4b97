package orchestrator

import (
	"reflect"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/history"
)

func TestAHistoryRecordKeepsThePauseReasonsStablePrefixAndCountsQuarantinedDumps(t *testing.T) {
	at := time.Date(2026, 3, 1, 3, 0, 0, 0, time.UTC)
	st := Status{State: "running", PID: 7, Total: 100, Done: 40, Failed: 1, Inflight: 6, BytesWritten: 1 << 20,
		SamplesPerSecond: 1.23456, UpdatedAt: at,
		Paused:   []string{"output disk reserve: 1.2 GiB free on /out, 2 GiB kept in reserve, 64 MiB in flight", "something new and unforeseen"},
		Rejected: map[string]int64{"stale_attempt": 3, "unknown_sample": 1, "malformed": 2},
		Servers:  []ServerStatus{{Replica: 0, State: "ready", Inflight: 4, Done: 30}, {Replica: 1, State: "restarting", Inflight: 2, Done: 10, Restarts: 1}},
	}
	b := budgets{diskFree: 5 << 30, diskReserve: 2 << 30, shmUsed: 1 << 30, shmBudget: 4 << 30}
	r := historyRecord(st, b, at.Add(-time.Hour), 12345)
	want := history.Record{T: at.UnixMilli(), Run: at.Add(-time.Hour).UnixMilli(), PID: 7, State: "running", Total: 100, Done: 40, Failed: 1,
		Bytes: 1 << 20, Tokens: 12345, Inflight: 6, Rate: 1.235, Rejected: 6, Quarantined: 3,
		Paused:       []string{"output disk reserve", "something new and unforeseen"},
		Replicas:     []history.Replica{{State: "ready", Inflight: 4, Done: 30}, {State: "restarting", Inflight: 2, Done: 10, Restarts: 1}},
		StagingBytes: 1 << 30, StagingBudget: 4 << 30, DiskFree: 5 << 30, DiskReserve: 2 << 30}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("record\n%+v\nwant\n%+v", r, want)
	}
}
