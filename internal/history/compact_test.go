package history

import (
	"reflect"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) int64 { return Millis(t0.Add(d)) }

// everyFiveSeconds is a run's records from start for span, done rising by one each.
func everyFiveSeconds(run int64, from, span time.Duration, done int) []Record {
	var recs []Record
	for d := from; d < from+span; d += 5 * time.Second {
		r := rec(at(d), done)
		r.Run = run
		r.DiskFree = 1 << 30
		recs = append(recs, r)
		done++
	}
	return recs
}

func TestCompactKeepsTheLastHourAndThinsOlderRecordsByTier(t *testing.T) {
	recs := everyFiveSeconds(1, 0, 3*time.Hour, 0)
	now := t0.Add(3 * time.Hour)
	out := Compact(recs, now, DefaultTiers)
	var lastHour, older int
	for _, r := range out {
		if now.Sub(r.Time()) <= time.Hour {
			lastHour++
		} else {
			older++
		}
	}
	if lastHour != 720 {
		t.Errorf("last hour: %d records, want all 720", lastHour)
	}
	if older < 119 || older > 121 {
		t.Errorf("two older hours: %d records, want one a minute (120)", older)
	}
	// Counters are cumulative: the thinned history ends where the full one does.
	if got, want := out[len(out)-1].Done, recs[len(recs)-1].Done; got != want {
		t.Errorf("last done %d, want %d", got, want)
	}
	if again := Compact(out, now, DefaultTiers); !reflect.DeepEqual(again, out) {
		t.Errorf("compacting twice changed the history: %d → %d records", len(out), len(again))
	}
}

func TestCompactionKeepsPausesRestartsAndTheLowestDiskFreeOfWhatItMerges(t *testing.T) {
	recs := everyFiveSeconds(1, 0, 10*time.Minute, 0)
	// One record 3 minutes in saw a pause, a restart and the disk at its lowest.
	recs[36].Paused = []string{"output disk reserve"}
	recs[36].DiskFree = 5 << 20
	for i := 36; i < len(recs); i++ {
		recs[i].Replicas[0].Restarts = 1
	}
	out := Compact(recs, t0.Add(30*24*time.Hour), DefaultTiers)
	if len(out) != 1 {
		t.Fatalf("%d records, want the 10 minutes in one hour-bucket", len(out))
	}
	r := out[0]
	if !reflect.DeepEqual(r.Paused, []string{"output disk reserve"}) || r.DiskFree != 5<<20 || r.Replicas[0].Restarts != 1 {
		t.Errorf("merged record %+v lost the pause, the low disk or the restart", r)
	}
}

func TestCompactionNeverMergesRecordsOfTwoRuns(t *testing.T) {
	recs := append(everyFiveSeconds(1, 0, 2*time.Minute, 0), everyFiveSeconds(2, 2*time.Minute, 2*time.Minute, 24)...)
	out := Compact(recs, t0.Add(48*time.Hour), DefaultTiers)
	if len(out) != 2 || out[0].Run != 1 || out[1].Run != 2 {
		t.Fatalf("got %d records (runs %v), want one per run", len(out), runs(out))
	}
	if evs := Events(out, 0, ""); countKind(evs, RunStart) != 2 {
		t.Errorf("events %+v: want both run starts", evs)
	}
}

func runs(recs []Record) []int64 {
	var out []int64
	for _, r := range recs {
		out = append(out, r.Run)
	}
	return out
}

func countKind(evs []Event, k EventKind) int {
	n := 0
	for _, e := range evs {
		if e.Kind == k {
			n++
		}
	}
	return n
}

func TestTheSamplerRecordsEveryIntervalAndAChangeWithinASecond(t *testing.T) {
	s := sampler{interval: 5 * time.Second}
	var got []Record
	offer := func(d time.Duration, paused ...string) {
		r := rec(at(d), 0)
		r.Paused = paused
		if out, ok := s.offer(r); ok {
			got = append(got, out)
		}
	}
	for d := time.Duration(0); d < 10*time.Second; d += 250 * time.Millisecond {
		offer(d)
	}
	if len(got) != 2 {
		t.Fatalf("quiet 10 s: %d records, want 2", len(got))
	}
	// A pause of a quarter second between two ticks still reaches a record, a second
	// after the last one.
	offer(10 * time.Second)
	offer(10*time.Second+250*time.Millisecond, "staging budget")
	offer(10*time.Second + 500*time.Millisecond)
	offer(10*time.Second + 750*time.Millisecond)
	offer(11 * time.Second)
	if len(got) != 4 || !reflect.DeepEqual(got[3].Paused, []string{"staging budget"}) || got[3].T != at(11*time.Second) {
		t.Fatalf("records %+v: want the pause recorded at 11 s", got)
	}
	// Its end is a change too, recorded a second later.
	offer(11*time.Second + 500*time.Millisecond)
	offer(12 * time.Second)
	if len(got) != 5 || got[4].Paused != nil || got[4].T != at(12*time.Second) {
		t.Fatalf("records %+v: want the pause's end recorded at 12 s", got)
	}
}

func TestAYoungRunIsRecordedEverySecondAndAnOldOneEveryInterval(t *testing.T) {
	s := sampler{interval: 5 * time.Second}
	run := at(0)
	n := 0
	for d := time.Duration(0); d < 20*time.Second; d += 250 * time.Millisecond {
		r := rec(at(d), 0)
		r.Run = run
		if _, ok := s.offer(r); ok {
			n++
		}
	}
	if n != 20 {
		t.Errorf("the first 20 s: %d records, want one a second", n)
	}
	n = 0
	for d := time.Hour; d < time.Hour+time.Minute; d += 250 * time.Millisecond {
		r := rec(at(d), 0)
		r.Run = run
		if _, ok := s.offer(r); ok {
			n++
		}
	}
	if n != 12 {
		t.Errorf("a minute an hour in: %d records, want one every 5 s", n)
	}
}

func TestAClockSteppedBackDoesNotSilenceTheHistory(t *testing.T) {
	s := sampler{interval: 5 * time.Second}
	s.offer(rec(at(time.Hour), 1))
	if _, ok := s.offer(rec(at(time.Hour-10*time.Minute), 2)); !ok {
		t.Fatal("a record 10 minutes before the last (the clock stepped back) was not written")
	}
	if _, ok := s.offer(rec(at(time.Hour-10*time.Minute+time.Second), 3)); ok {
		t.Fatal("after the step, records were written faster than the interval")
	}
}
