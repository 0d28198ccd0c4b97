package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/internal/atomicfile"
)

// A running job answers status --sample and --source-id over its status endpoint, from
// the index it holds open (a second process cannot open it then): the same answer as
// from the index once the run has ended.
func TestSampleStatusFromTheLiveRunEqualsTheIndexs(t *testing.T) {
	state := t.TempDir()
	ix, err := checkpoint.Open(filepath.Join(state, "index.db"), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	if err := ix.Init(checkpoint.Meta{Total: 4, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := ix.RecordAttempt(2, 1, "conv-b"); err != nil {
		t.Fatal(err)
	}
	if err := ix.CommitDone(checkpoint.Record{Sample: 2, State: checkpoint.StateDone, Attempt: 1, RID: "s000000002-a1", Bytes: 10, CRC32C: 0xab, Tokens: 3}); err != nil {
		t.Fatal(err)
	}
	if err := ix.RecordAttempt(3, 1, "conv-b"); err != nil { // the same conversation twice in the dataset
		t.Fatal(err)
	}
	srv, err := startStatusServer("127.0.0.1:0", newMetrics())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	l := checkpoint.Layout{Dir: "/out"}
	serveSamples(srv, ix, l)
	ri, _ := json.Marshal(runInfo{PID: os.Getpid(), StatusAddr: srv.addr})
	if err := atomicfile.WriteFile(runInfoPath(state), ri, 0o644); err != nil {
		t.Fatal(err)
	}
	live, err := querySamplesLive(context.Background(), state, SampleQuery{Sample: 2}, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 1 || live[0].SourceID != "conv-b" || live[0].State != "done" || live[0].File != l.Path(2) || live[0].CRC32C != "000000ab" || live[0].Source != "live" {
		t.Fatalf("live answer %+v", live)
	}
	byID, err := querySamplesLive(context.Background(), state, SampleQuery{Sample: -1, SourceID: "conv-b"}, os.Getpid())
	if err != nil || len(byID) != 2 || byID[0].Sample != 2 || byID[1].Sample != 3 || byID[1].State != "inflight" {
		t.Fatalf("by source id: %+v, %v", byID, err)
	}
	for _, q := range []SampleQuery{{Sample: 4}, {Sample: -1, SourceID: "conv-zz"}} {
		_, err := querySamplesLive(context.Background(), state, q, os.Getpid())
		if !errors.Is(err, ErrRefused) || strings.Count(err.Error(), "refused") != 1 {
			t.Fatalf("query %+v: %v, want one ErrRefused", q, err)
		}
	}
	fromIndex, err := lookupSamples(ix, l, SampleQuery{Sample: 2})
	if err != nil {
		t.Fatal(err)
	}
	fromIndex[0].Source = "live"
	a, _ := json.Marshal(fromIndex)
	b, _ := json.Marshal(live)
	if string(a) != string(b) {
		t.Fatalf("index %s\nlive  %s", a, b)
	}
}

// A run.json of an earlier run, or an address that is not our handler's, is not taken
// for the running job's answer: worth a retry (75), not "no such sample" (2).
func TestSampleStatusTrustsOnlyTheRunningJobsOwnEndpoint(t *testing.T) {
	state := t.TempDir()
	plain := &http.Server{Handler: http.NotFoundHandler()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = plain.Serve(ln) }()
	defer plain.Close()
	// Another job's status server, answering /sample from its own index.
	other, err := checkpoint.Open(filepath.Join(t.TempDir(), "index.db"), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Init(checkpoint.Meta{Total: 4, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	srv, err := startStatusServer("127.0.0.1:0", newMetrics())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	serveSamples(srv, other, checkpoint.Layout{Dir: "/other"})
	for _, tc := range []struct {
		name, addr string
		pid        int
	}{{"an earlier run's address, now another job's", srv.addr, os.Getpid() + 1}, {"a server without /sample", ln.Addr().String(), os.Getpid()}} {
		ri, _ := json.Marshal(runInfo{PID: tc.pid, StatusAddr: tc.addr})
		if err := atomicfile.WriteFile(runInfoPath(state), ri, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := querySamplesLive(context.Background(), state, SampleQuery{Sample: 1}, os.Getpid())
		if !errors.Is(err, ErrTemporary) || errors.Is(err, ErrRefused) {
			t.Fatalf("%s: %v, want ErrTemporary", tc.name, err)
		}
	}
}

// While import or verify --repair writes the index, a query is worth a retry (75) that
// names who holds it, not a failure (1).
func TestSampleStatusWhileAnotherCommandWritesTheIndexIsTemporary(t *testing.T) {
	state := t.TempDir()
	lock, err := AcquireLock(state, "import")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	ix, err := checkpoint.Open(filepath.Join(state, "index.db"), checkpoint.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	cfg := configs.Default()
	cfg.StateDir = state
	_, err = QuerySamples(context.Background(), &cfg, SampleQuery{Sample: 0})
	if !errors.Is(err, ErrTemporary) || !strings.Contains(err.Error(), "import") {
		t.Fatalf("query while import holds the index: %v, want ErrTemporary naming import", err)
	}
}
