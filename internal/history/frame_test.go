package history

import (
	"errors"
	"testing"
	"time"
)

func rec(t int64, done int) Record {
	return Record{T: t, Run: 1, State: "running", Total: 100, Done: done, Replicas: []Replica{{State: "ready", Done: done}}}
}

func TestAHistoryCutAtAnyByteKeepsEveryWholeRecordAndEndsAfterTheLastOne(t *testing.T) {
	full, err := encode([]Record{rec(1000, 1), rec(2000, 2), rec(3000, 3)})
	if err != nil {
		t.Fatal(err)
	}
	whole, _ := encode([]Record{rec(1000, 1), rec(2000, 2)})
	for cut := len(whole); cut < len(full); cut++ {
		d, err := decode("h", full[:cut])
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		if len(d.Records) != 2 || d.Records[1].Done != 2 {
			t.Fatalf("cut at %d: %d records, want the 2 whole ones", cut, len(d.Records))
		}
		if d.End != int64(len(whole)) || d.Torn != int64(cut-len(whole)) || d.Skipped != 0 {
			t.Fatalf("cut at %d: end %d torn %d skipped %d, want end %d torn %d", cut, d.End, d.Torn, d.Skipped, len(whole), cut-len(whole))
		}
	}
	d, _ := decode("h", full)
	if len(d.Records) != 3 || d.Torn != 0 || d.End != int64(len(full)) {
		t.Fatalf("the whole file: %d records, torn %d, end %d", len(d.Records), d.Torn, d.End)
	}
}

func TestADamagedRecordInTheMiddleCostsOnlyItself(t *testing.T) {
	one, _ := encode([]Record{rec(1000, 1)})
	full, _ := encode([]Record{rec(1000, 1), rec(2000, 2), rec(3000, 3)})
	two, _ := encode([]Record{rec(1000, 1), rec(2000, 2)})
	// Flip a byte inside the second record's JSON: its crc no longer matches.
	full[len(one)+frameHeader+3] ^= 0x40
	d, err := decode("h", full)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Records) != 2 || d.Records[0].Done != 1 || d.Records[1].Done != 3 {
		t.Fatalf("records %+v, want the first and the third", d.Records)
	}
	if d.Skipped != int64(len(two)-len(one)) || d.Torn != 0 || d.End != int64(len(full)) {
		t.Fatalf("skipped %d torn %d end %d, want skipped %d", d.Skipped, d.Torn, d.End, len(two)-len(one))
	}
}

func TestTheSearchPastDamageIsBoundedAndTheRestCountsAsTorn(t *testing.T) {
	b, _ := encode([]Record{rec(1000, 1)})
	good := len(b)
	// 2 MiB of frames that each claim a 64 KiB record whose checksum fails.
	for len(b) < good+2<<20 {
		b = append(b, 0, 0, 1, 0, 0, 0, 0, 0, '{', '}')
	}
	tail, _ := appendFrame(nil, rec(2000, 2))
	b = append(b, tail...)
	start := time.Now()
	d, err := decode("h", b)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Records) != 1 || d.End != int64(good) || d.Torn != int64(len(b)-good) {
		t.Errorf("records %d, end %d, torn %d; want the first record and the rest torn", len(d.Records), d.End, d.Torn)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("decoding took %v", took)
	}
}

func TestAForeignFileIsNotAHistoryAndAHugeLengthIsNotAllocated(t *testing.T) {
	_, err := decode("/x/history.log", []byte("PK\x03\x04 not ours at all"))
	var nh *ErrNotHistory
	if !errors.As(err, &nh) || nh.Path != "/x/history.log" {
		t.Fatalf("err = %v, want ErrNotHistory naming the file", err)
	}
	// A header cut short is an empty history, to be started again.
	if d, err := decode("h", []byte(magic[:5])); err != nil || len(d.Records) != 0 || d.End != 0 {
		t.Fatalf("short header: %+v %v", d, err)
	}
	b := append([]byte(magic), 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0)
	d, err := decode("h", b)
	if err != nil || len(d.Records) != 0 || d.Torn != 8 {
		t.Fatalf("huge length: %+v %v", d, err)
	}
}

// encode is a whole file holding recs.
func encode(recs []Record) ([]byte, error) {
	b := make([]byte, 0, len(magic)+len(recs)*256)
	b = append(b, magic...)
	var err error
	for _, r := range recs {
		if b, err = appendFrame(b, r); err != nil {
			return nil, err
		}
	}
	return b, nil
}
