package history

import "time"

// Tier thins records older than Age to one per Step.
type Tier struct {
	Age, Step time.Duration
}

// DefaultTiers keep the last hour as recorded, the last day at one record a minute, the
// last week at one per ten minutes and anything older at one an hour: a 10-day job is
// about 3,100 records, some 880 KB with two replicas (the 10-day test measures it).
var DefaultTiers = []Tier{
	{Age: time.Hour, Step: time.Minute},
	{Age: 24 * time.Hour, Step: 10 * time.Minute},
	{Age: 7 * 24 * time.Hour, Step: time.Hour},
}

// stepAt is the spacing records of that age are thinned to; 0 keeps them all.
func stepAt(tiers []Tier, age time.Duration) time.Duration {
	var step time.Duration
	for _, t := range tiers {
		if age >= t.Age {
			step = t.Step
		}
	}
	return step
}

// Compact thins recs (in time order) as of now: records that fall into one step of
// their tier, within one run, become one. The merged record is the bucket's last (the
// counters only grow within a run, so they stay exact), with the pause reasons of all
// of them, the least disk free and the most staging used: a pause, a restart (its
// count) and a low point of the disk survive any amount of compaction. Compact is
// idempotent, and compacting later never brings a record back.
func Compact(recs []Record, now time.Time, tiers []Tier) []Record {
	out, _ := compact(recs, now, tiers)
	return out
}

// compact is Compact, also saying for each record kept which input it is, or -1 when
// it merged others into it and so differs from every input.
func compact(recs []Record, now time.Time, tiers []Tier) ([]Record, []int) {
	out := make([]Record, 0, len(recs))
	from := make([]int, 0, len(recs))
	type key struct {
		run, bucket int64
		step        time.Duration
	}
	var last key
	for i, r := range recs {
		step := stepAt(tiers, now.Sub(r.Time()))
		if step <= 0 {
			out, from = append(out, r), append(from, i)
			last = key{}
			continue
		}
		k := key{run: r.Run, bucket: r.T / step.Milliseconds(), step: step}
		if len(out) > 0 && k == last {
			merged, same := fold(out[len(out)-1], r)
			out[len(out)-1] = merged
			from[len(from)-1] = i
			if !same {
				from[len(from)-1] = -1
			}
			continue
		}
		out, from = append(out, r), append(from, i)
		last = k
	}
	return out, from
}

// fold merges a record into the next one of the same run: b, with what a must not
// lose. same says the result is b as it was.
func fold(a, b Record) (Record, bool) {
	out := b
	out.Paused = union(a.Paused, b.Paused)
	if a.DiskFree > 0 && (b.DiskFree == 0 || a.DiskFree < b.DiskFree) {
		out.DiskFree = a.DiskFree
	}
	out.StagingBytes = max(a.StagingBytes, b.StagingBytes)
	same := len(out.Paused) == len(b.Paused) && out.DiskFree == b.DiskFree && out.StagingBytes == b.StagingBytes
	return out, same
}

// sampler decides which of the run's frequent snapshots become records: one per
// interval (sooner while the run is young), and at once (but at most one a second)
// when something changed. Pause
// reasons seen between two records are carried into the next one.
type sampler struct {
	interval time.Duration
	last     Record
	have     bool
	paused   []string // reasons seen since the last record
}

// minGap bounds records written for a change: a flapping pause costs at most one a
// second.
const minGap = time.Second

// spacing is the interval between routine records at r: a sixtieth of the run's age,
// between a second and the interval, so that a short job still draws a line and a
// long one costs no more than the interval says.
func (s *sampler) spacing(r Record) time.Duration {
	age := time.Duration(r.T-r.Run) * time.Millisecond
	return min(max(age/60, minGap), s.interval)
}

// offer takes a snapshot and returns the record to write, if one is due.
func (s *sampler) offer(r Record) (Record, bool) {
	s.paused = union(s.paused, r.Paused)
	if s.have {
		gap := time.Duration(r.T-s.last.T) * time.Millisecond
		withPauses := r
		withPauses.Paused = s.paused
		// A clock stepped back (NTP) must not silence the history until it catches up.
		due := gap < 0 || gap >= s.spacing(r) || (gap >= minGap && changed(s.last, withPauses))
		if !due {
			return Record{}, false
		}
	}
	r.Paused = s.paused
	s.paused = nil
	s.last, s.have = r, true
	return r, true
}
