package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// newIndex opens a fresh index in a temp dir and initialises a job of total samples.
func newIndex(tb testing.TB, total int) *Index {
	tb.Helper()
	ix, err := Open(filepath.Join(tb.TempDir(), "index.db"), OpenOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ix.Close() })
	if err := ix.Init(Meta{DatasetFingerprint: "fp-1", DatasetPath: "/data/d.jsonl", ConfigFingerprint: "cfg-1", Total: total}); err != nil {
		tb.Fatal(err)
	}
	return ix
}

func mustCounters(tb testing.TB, ix *Index) Counters {
	tb.Helper()
	c, err := ix.Counters()
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func mustGet(tb testing.TB, ix *Index, sample int) Record {
	tb.Helper()
	r, ok, err := ix.Get(sample)
	if err != nil || !ok {
		tb.Fatalf("Get(%d) = %v, %v", sample, ok, err)
	}
	return r
}

func doneRecord(sample, attempt int) Record {
	return Record{Sample: sample, Attempt: attempt, RID: fmt.Sprintf("s%09d-a%d", sample, attempt), Bytes: 1000 + int64(sample), CRC32C: uint32(sample) * 7, Tokens: 10 + sample}
}

func TestIndexReopenKeepsMetaRecordsAndCounters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.db")
	ix, err := Open(path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ix.Meta(); ok || err != nil {
		t.Fatalf("Meta of a new index = %v, %v; want not initialised", ok, err)
	}
	created := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	want := Meta{DatasetFingerprint: "fp-1", DatasetPath: "/data/d.jsonl", ConfigFingerprint: "cfg-9", Total: 10, Created: created}
	if err := ix.Init(want); err != nil {
		t.Fatal(err)
	}
	if _, err := ix.BeginAttempts([]int{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := ix.CommitDone(doneRecord(1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := ix.MarkFailed(2, 1, "server 500"); err != nil {
		t.Fatal(err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}

	ix, err = Open(path, OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	m, ok, err := ix.Meta()
	want.SchemaVersion = SchemaVersion
	if err != nil || !ok || m != want {
		t.Fatalf("Meta = %+v, %v, %v; want %+v", m, ok, err, want)
	}
	r := mustGet(t, ix, 1)
	w := doneRecord(1, 1)
	if r.State != StateDone || r.Attempt != 1 || r.RID != w.RID || r.Bytes != w.Bytes || r.CRC32C != w.CRC32C || r.Tokens != w.Tokens || r.Updated.IsZero() {
		t.Fatalf("record 1 = %+v", r)
	}
	if r := mustGet(t, ix, 2); r.State != StateFailed || r.Error != "server 500" {
		t.Fatalf("record 2 = %+v", r)
	}
	if c := mustCounters(t, ix); c != (Counters{Done: 1, Failed: 1, BytesWritten: w.Bytes, Tokens: int64(w.Tokens)}) {
		t.Fatalf("counters = %+v", c)
	}
	p, err := ix.Load(10)
	if err != nil {
		t.Fatal(err)
	}
	wantStates := []State{StatePending, StateDone, StateFailed, StateInflight, StatePending}
	for i, s := range wantStates {
		if p.State[i] != s {
			t.Errorf("Load: sample %d is %s, want %s", i, p.State[i], s)
		}
	}
}

func TestOpenWritesSchemaVersionAndRefusesAnUnknownOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.db")
	ix, err := Open(path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = ix.Close()

	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		if got := b.Get(keySchemaVersion); string(got) != string(u64(SchemaVersion)) {
			return fmt.Errorf("schema_version = %x, want %x", got, u64(SchemaVersion))
		}
		return b.Put(keySchemaVersion, u64(SchemaVersion+1))
	})
	_ = db.Close()
	if err != nil {
		t.Fatal(err)
	}

	for _, ro := range []bool{false, true} {
		t.Run(fmt.Sprintf("readonly=%v", ro), func(t *testing.T) {
			ix, err := Open(path, OpenOptions{ReadOnly: ro})
			if err == nil {
				_ = ix.Close()
				t.Fatal("Open accepted schema_version 2")
			}
			if !strings.Contains(err.Error(), "schema_version 2") || !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name the version and the file", err)
			}
		})
	}
}

func TestOpenOfHeldIndexReturnsErrLockedWithinTimeout(t *testing.T) {
	// bbolt's flock belongs to the open file description, so a second Open in this
	// process contends exactly like another process would.
	for _, tc := range []struct {
		name         string
		holderRO, ro bool
		wantLocked   bool
	}{
		{"writer blocks writer", false, false, true},
		{"writer blocks reader", false, true, true},
		{"reader blocks writer", true, false, true},
		{"readers share", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "index.db")
			ix, err := Open(path, OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			_ = ix.Close()
			holder, err := Open(path, OpenOptions{ReadOnly: tc.holderRO})
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Close()

			start := time.Now()
			second, err := Open(path, OpenOptions{ReadOnly: tc.ro, Timeout: 200 * time.Millisecond})
			elapsed := time.Since(start)
			if !tc.wantLocked {
				if err != nil {
					t.Fatal(err)
				}
				_ = second.Close()
				return
			}
			if !errors.Is(err, ErrLocked) {
				if err == nil {
					_ = second.Close()
				}
				t.Fatalf("Open = %v, want ErrLocked", err)
			}
			if elapsed > 2*time.Second {
				t.Fatalf("Open took %s with a 200ms timeout", elapsed)
			}
		})
	}
}

func TestInitRefusesAnInitialisedIndex(t *testing.T) {
	ix := newIndex(t, 5)
	err := ix.Init(Meta{DatasetFingerprint: "other", Total: 5})
	if err == nil || !strings.Contains(err.Error(), "already initialised") {
		t.Fatalf("second Init = %v, want already initialised", err)
	}
}

func TestResetDropsRecordsZeroesCountersAndWritesMeta(t *testing.T) {
	ix := newIndex(t, 5)
	if _, err := ix.BeginAttempts([]int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if err := ix.CommitDone(doneRecord(0, 1)); err != nil {
		t.Fatal(err)
	}
	if err := ix.MarkFailed(1, 1, "boom"); err != nil {
		t.Fatal(err)
	}
	imported := doneRecord(2, 0)
	imported.Imported = true
	if err := ix.CommitDone(imported); err != nil {
		t.Fatal(err)
	}
	if c := mustCounters(t, ix); c.Imported != 1 {
		t.Fatalf("imported counter before Reset = %d, want 1", c.Imported)
	}
	if err := ix.Reset(Meta{DatasetFingerprint: "fp-2", Total: 7}); err != nil {
		t.Fatal(err)
	}
	if c := mustCounters(t, ix); c != (Counters{}) {
		t.Fatalf("counters after Reset = %+v", c)
	}
	if _, ok, _ := ix.Get(0); ok {
		t.Fatal("record 0 survived Reset")
	}
	if m, _, _ := ix.Meta(); m.DatasetFingerprint != "fp-2" || m.Total != 7 {
		t.Fatalf("meta after Reset = %+v", m)
	}
}

func TestCommitDoneTwiceCountsOnce(t *testing.T) {
	ix := newIndex(t, 5)
	r := doneRecord(3, 1)
	for range 2 {
		if err := ix.CommitDone(r); err != nil {
			t.Fatal(err)
		}
	}
	if c := mustCounters(t, ix); c != (Counters{Done: 1, BytesWritten: r.Bytes, Tokens: int64(r.Tokens)}) {
		t.Fatalf("counters = %+v", c)
	}
}

func TestCommitDoneFromThirtyTwoGoroutinesAllLand(t *testing.T) {
	const n = 32
	ix := newIndex(t, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() { errs <- ix.CommitDone(doneRecord(i, 1)) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var want Counters
	for i := range n {
		r := mustGet(t, ix, i)
		if r.State != StateDone {
			t.Fatalf("sample %d is %s", i, r.State)
		}
		want.Done++
		want.BytesWritten += r.Bytes
		want.Tokens += int64(r.Tokens)
	}
	if c := mustCounters(t, ix); c != want {
		t.Fatalf("counters = %+v, want %+v", c, want)
	}
}

func TestCommitDoneNeverLowersTheAttempt(t *testing.T) {
	ix := newIndex(t, 5)
	for range 3 {
		if _, err := ix.BeginAttempts([]int{2}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ix.CommitDone(doneRecord(2, 1)); err != nil {
		t.Fatal(err)
	}
	if r := mustGet(t, ix, 2); r.Attempt != 3 {
		t.Fatalf("attempt = %d, want 3", r.Attempt)
	}
}

func TestBeginAttemptsIncrementsAndRefusesDoneSamples(t *testing.T) {
	ix := newIndex(t, 5)
	for want := 1; want <= 2; want++ {
		got, err := ix.BeginAttempts([]int{0, 4})
		if err != nil {
			t.Fatal(err)
		}
		if got[0] != want || got[1] != want {
			t.Fatalf("attempts = %v, want [%d %d]", got, want, want)
		}
	}
	if r := mustGet(t, ix, 4); r.State != StateInflight {
		t.Fatalf("sample 4 is %s, want inflight", r.State)
	}
	if err := ix.CommitDone(doneRecord(3, 1)); err != nil {
		t.Fatal(err)
	}
	_, err := ix.BeginAttempts([]int{1, 3})
	if err == nil || !strings.Contains(err.Error(), "sample 3") {
		t.Fatalf("BeginAttempts with a done sample = %v, want an error naming sample 3", err)
	}
	if _, ok, _ := ix.Get(1); ok {
		t.Fatal("a refused batch still started sample 1")
	}
}

func TestBeginAttemptsRefusesBadBatches(t *testing.T) {
	ix := newIndex(t, 5)
	for _, tc := range []struct {
		name    string
		samples []int
		want    string
	}{
		{"negative", []int{-1}, "sample -1"},
		{"beyond total", []int{5}, "sample 5"},
		{"duplicate", []int{2, 2}, "listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ix.BeginAttempts(tc.samples); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("BeginAttempts(%v) = %v, want %q", tc.samples, err, tc.want)
			}
		})
	}
}

func TestBeginAttemptsOnFailedSampleDecrementsFailed(t *testing.T) {
	ix := newIndex(t, 5)
	if _, err := ix.BeginAttempts([]int{1}); err != nil {
		t.Fatal(err)
	}
	if err := ix.MarkFailed(1, 1, "timeout"); err != nil {
		t.Fatal(err)
	}
	if c := mustCounters(t, ix); c.Failed != 1 {
		t.Fatalf("failed = %d, want 1", c.Failed)
	}
	got, err := ix.BeginAttempts([]int{1})
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 2 {
		t.Fatalf("attempt = %d, want 2", got[0])
	}
	if c := mustCounters(t, ix); c.Failed != 0 {
		t.Fatalf("failed = %d after a retry began, want 0", c.Failed)
	}
}

func TestMarkFailedTwiceCountsOnceAndRefusesDone(t *testing.T) {
	ix := newIndex(t, 5)
	for range 2 {
		if err := ix.MarkFailed(0, 1, "bad"); err != nil {
			t.Fatal(err)
		}
	}
	if c := mustCounters(t, ix); c.Failed != 1 {
		t.Fatalf("failed = %d, want 1", c.Failed)
	}
	if err := ix.CommitDone(doneRecord(0, 1)); err != nil {
		t.Fatal(err)
	}
	if c := mustCounters(t, ix); c.Failed != 0 || c.Done != 1 {
		t.Fatalf("counters after failed→done = %+v", c)
	}
	if err := ix.MarkFailed(0, 1, "late"); err == nil || !strings.Contains(err.Error(), "sample 0") {
		t.Fatalf("MarkFailed of a done sample = %v, want an error naming it", err)
	}
}

func TestMarkPendingUndoesDoneAndKeepsAttempt(t *testing.T) {
	ix := newIndex(t, 5)
	if err := ix.CommitDone(doneRecord(2, 4)); err != nil {
		t.Fatal(err)
	}
	if err := ix.MarkPending(2, "file missing"); err != nil {
		t.Fatal(err)
	}
	if c := mustCounters(t, ix); c != (Counters{}) {
		t.Fatalf("counters = %+v, want zero", c)
	}
	r := mustGet(t, ix, 2)
	if r.State != StatePending || r.Attempt != 4 || r.Error != "file missing" {
		t.Fatalf("record = %+v", r)
	}
	got, err := ix.BeginAttempts([]int{2})
	if err != nil || got[0] != 5 {
		t.Fatalf("next attempt = %v, %v; want 5", got, err)
	}
	if err := ix.MarkPending(3, "never started"); err != nil {
		t.Fatalf("MarkPending of a sample with no record: %v", err)
	}
}

func TestRecordEncodingRoundTrips(t *testing.T) {
	long := strings.Repeat("é", maxErrorLen)
	for _, tc := range []struct {
		name      string
		r         Record
		wantError string
	}{
		{"empty pending", Record{Sample: 0}, ""},
		{"done", Record{Sample: 9, State: StateDone, Attempt: 3, RID: "s000000009-a3", Bytes: 1 << 40, CRC32C: 0xdeadbeef, Tokens: 131072, Updated: time.Unix(0, 1700000000123456789)}, ""},
		{"failed with a long error", Record{Sample: 1, State: StateFailed, Attempt: 2, Error: long}, long[:maxErrorLen]},
		{"done with a source id", Record{Sample: 5, State: StateDone, Attempt: 1, RID: "s000000005-a1", SourceID: "conv-ü-17"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeRecord(tc.r.Sample, encodeRecord(tc.r))
			if err != nil {
				t.Fatal(err)
			}
			want := tc.r
			want.Error = tc.wantError
			if !got.Updated.Equal(want.Updated) {
				t.Fatalf("updated = %v, want %v", got.Updated, want.Updated)
			}
			got.Updated, want.Updated = time.Time{}, time.Time{}
			if got != want {
				t.Fatalf("decoded %+v, want %+v", got, want)
			}
		})
	}
	if r, err := decodeRecord(5, append(encodeRecord(Record{Sample: 5, Error: "x"}), 0, 9, 'a')); err == nil {
		t.Fatalf("a source id that overruns its record decoded as %+v", r)
	}
	if _, err := decodeRecord(4, []byte{2, 0}); err == nil || !strings.Contains(err.Error(), "sample 4") {
		t.Fatalf("decode of a foreign record = %v, want an error naming sample 4", err)
	}
}

// A record without a source id is the layout before source ids, and an older build
// (which reads the rid and the error and stops) reads one with it.
func TestARecordsSourceIDIsAnOptionalTrailingField(t *testing.T) {
	r := Record{Sample: 7, State: StateDone, Attempt: 2, RID: "s000000007-a2", Error: "e"}
	old := encodeRecord(r)
	if len(old) != recordFixed+2+len(r.RID)+2+len(r.Error) {
		t.Fatalf("a record without a source id is %d bytes, want the old layout's %d", len(old), recordFixed+2+len(r.RID)+2+len(r.Error))
	}
	r.SourceID = "conv-7"
	withID := encodeRecord(r)
	if !bytes.Equal(withID[:len(old)], old) || len(withID) != len(old)+2+len(r.SourceID) {
		t.Fatalf("the source id is not a field after the old layout: %x", withID)
	}
}

// Once known, a sample's source id stays in its record through every state change.
func TestARecordKeepsItsSourceIDThroughItsStates(t *testing.T) {
	ix := newIndex(t, 4)
	steps := []struct {
		name string
		do   func() error
	}{
		{"attempt", func() error { return ix.RecordAttempt(1, 1, "conv-7") }},
		{"failed", func() error { return ix.MarkFailed(1, 1, "boom") }},
		{"retried without an id", func() error { return ix.RecordAttempt(1, 2, "") }},
		{"done without an id", func() error { return ix.CommitDone(doneRecord(1, 2)) }},
		{"pending again", func() error { return ix.MarkPending(1, "file lost") }},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := mustGet(t, ix, 1).SourceID; got != "conv-7" {
			t.Fatalf("after %s the source id is %q, want conv-7", st.name, got)
		}
	}
	if err := ix.RecordAttempt(2, 1, ""); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, ix, 2).SourceID; got != "" {
		t.Fatalf("sample 2 got source id %q", got)
	}
}

// fillRecords writes n records straight into the samples bucket: a quarter each
// pending, inflight, done and failed. Counters are not the point of the callers.
func fillRecords(tb testing.TB, ix *Index, n int) {
	tb.Helper()
	err := ix.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSamples)
		b.FillPercent = 1 // keys arrive in order
		for i := range n {
			r := doneRecord(i, 1+i%3)
			r.State = State(i % 4)
			if err := b.Put(sampleKey(i), encodeRecord(r)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

func TestLoadOfOneMillionRecordsTakesUnderOneSecond(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a million records")
	}
	const n = 1_000_000
	ix := newIndex(t, n)
	fillRecords(t, ix, n)
	start := time.Now()
	p, err := ix.Load(n)
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if p.State[999_999] != State(999_999%4) || p.Attempt[999_999] != uint32(1+999_999%3) {
		t.Fatalf("sample 999999 = %s/%d", p.State[999_999], p.Attempt[999_999])
	}
	t.Logf("Load of %d records: %s", n, elapsed)
	if elapsed > time.Second && !raceBuild {
		t.Fatalf("Load took %s, want under 1s", elapsed)
	}
}

func TestLoadRefusesRecordsBeyondTotal(t *testing.T) {
	ix := newIndex(t, 10)
	if err := ix.CommitDone(doneRecord(9, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := ix.Load(5); err == nil || !strings.Contains(err.Error(), "sample 9") {
		t.Fatalf("Load(5) = %v, want an error naming sample 9", err)
	}
}

func BenchmarkIndexLoad1M(b *testing.B) {
	const n = 1_000_000
	ix := newIndex(b, n)
	fillRecords(b, ix, n)
	b.ResetTimer()
	for b.Loop() {
		if _, err := ix.Load(n); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCommitDone commits from 8 goroutines per CPU, as the mover pool does, so
// that group commit shows: ns/op is per sample, not per fsync.
func BenchmarkCommitDone(b *testing.B) {
	ix := newIndex(b, 1<<30)
	var mu sync.Mutex
	next := 0
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			mu.Lock()
			s := next
			next++
			mu.Unlock()
			if err := ix.CommitDone(doneRecord(s, 1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
