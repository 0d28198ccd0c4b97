package checkpoint

import (
	"path/filepath"
	"testing"
)

func TestTheIndexRecordsItsShardPlanAndAnOldIndexReadsAsUnsharded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.db")
	ix, err := Open(path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ix.Init(Meta{DatasetFingerprint: "fp", Total: 100, ShardIndex: 2, ShardCount: 4}); err != nil {
		t.Fatal(err)
	}
	ix.Close()
	ix, err = Open(path, OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	m, ok, err := ix.Meta()
	ix.Close()
	if err != nil || !ok || m.ShardIndex != 2 || m.ShardCount != 4 || m.Total != 100 {
		t.Fatalf("meta = %+v, %v, %v; want shard 2 of 4 of 100 samples", m, ok, err)
	}

	old := copyFixture(t, "index-v1.db")
	ix, err = Open(old, OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	if m, _, err := ix.Meta(); err != nil || m.ShardCount != 0 || m.ShardIndex != 0 {
		t.Fatalf("v1 index meta = %+v, %v; want unsharded", m, err)
	}
}

func TestMetaRefusesAnIndexThatIsNoShard(t *testing.T) {
	ix := newIndex(t, 10)
	for _, m := range []Meta{{Total: 10, ShardIndex: 4, ShardCount: 4}, {Total: 10, ShardIndex: 1}, {Total: 10, ShardIndex: -1, ShardCount: 2}} {
		if err := ix.Reset(m); err == nil {
			t.Errorf("Reset(%+v) accepted", m)
		}
	}
}
