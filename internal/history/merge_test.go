package history

import (
	"reflect"
	"testing"
	"time"
)

func TestEventsMarkRunStartsRestartsPausesFailuresAndQuarantines(t *testing.T) {
	recs := everyFiveSeconds(1, 0, time.Minute, 0) // 12 records
	for i := range recs {
		recs[i].Replicas = []Replica{{State: "ready"}, {State: "ready"}}
	}
	for i := 4; i < len(recs); i++ {
		recs[i].Replicas[1].Restarts = 1
		recs[i].Failed = 2
	}
	recs[6].Paused = []string{"staging budget"}
	recs[7].Paused = []string{"output disk reserve"}
	recs[9].Quarantined = 1
	recs[10].Quarantined = 1
	recs[11].Quarantined = 1
	second := everyFiveSeconds(2, 2*time.Minute, 10*time.Second, 12)
	second[1].Quarantined = 1 // a new run counts from 0 again
	evs := Events(append(recs, second...), 2, "1")
	want := []struct {
		kind    EventKind
		t       int64
		replica int
		count   int
	}{
		{RunStart, recs[0].T, -1, 0},
		{Restart, recs[4].T, 3, 1},
		{Failure, recs[4].T, -1, 2},
		{Pause, recs[5].T, -1, 0},
		{Quarantine, recs[9].T, -1, 1},
		{RunStart, second[0].T, -1, 0},
		{Quarantine, second[1].T, -1, 1},
	}
	if len(evs) != len(want) {
		t.Fatalf("events %+v, want %d", evs, len(want))
	}
	for i, w := range want {
		e := evs[i]
		if e.Kind != w.kind || e.T != w.t || e.Replica != w.replica || e.Count != w.count {
			t.Errorf("event %d = %+v, want %+v", i, e, w)
		}
	}
	if p := evs[3]; p.End != recs[7].T || p.Text != "shard 1: paused: output disk reserve; staging budget" {
		t.Errorf("pause %+v: want it to end at the second paused record with both reasons", p)
	}
}

func TestMergedShardsAddUpAndAFinishedShardKeepsItsCountButNotItsRate(t *testing.T) {
	a := everyFiveSeconds(1, 0, 30*time.Second, 0) // done 0..5, finishes
	for i := range a {
		a[i].Rate, a[i].DiskFree = 0.2, 8<<30
	}
	a[len(a)-1].State = "complete"
	b := everyFiveSeconds(1, 10*time.Second, 60*time.Second, 100) // done 100..111
	for i := range b {
		b[i].Rate, b[i].DiskFree = 0.2, 4<<30
		b[i].Paused = []string{"staging budget"}
	}
	s := Merge([]Shard{{Name: "0", Records: a}, {Name: "1", Records: b}})
	if !reflect.DeepEqual(s.Replicas, []string{"shard 0 replica 0", "shard 1 replica 0"}) {
		t.Fatalf("replicas %v", s.Replicas)
	}
	find := func(d time.Duration) Record {
		for _, r := range s.Records {
			if r.T == at(d) {
				return r
			}
		}
		t.Fatalf("no merged record at %v", d)
		return Record{}
	}
	r := find(5 * time.Second) // only shard 0 has started
	if r.Done != 1 || r.Total != 100 || r.Rate != 0.2 {
		t.Errorf("at 5 s: %+v", r)
	}
	r = find(15 * time.Second)
	if r.Done != 3+101 || r.Total != 200 || r.Rate != 0.4 || r.DiskFree != 4<<30 || !reflect.DeepEqual(r.Paused, []string{"shard 1: staging budget"}) {
		t.Errorf("at 15 s: %+v", r)
	}
	if r.Replicas[0].Done != 3 || r.Replicas[1].Done != 101 {
		t.Errorf("at 15 s, replicas %+v", r.Replicas)
	}
	r = find(60 * time.Second) // shard 0 complete since 25 s
	if r.Done != 5+110 || r.Rate != 0.2 || r.State != "running" {
		t.Errorf("at 60 s: %+v", r)
	}
	if n := countKind(s.Events, RunStart); n != 2 {
		t.Errorf("%d run starts, want one per shard", n)
	}
}
