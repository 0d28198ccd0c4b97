package sglang

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// TestAWindowOfRequestsReusesItsConnections sends rounds of `window` concurrent
// requests to a real loopback server that answers each round all at once (so the whole
// window goes idle together, as a batch's answers do) and counts the TCP connections
// the server accepted. With MaxConns at the window every round reuses the first round's
// connections; with the pool's default (GOMAXPROCS+1 idle per host) all but a few are
// closed and dialled again each round.
func TestAWindowOfRequestsReusesItsConnections(t *testing.T) {
	const window, rounds = 64, 10
	var dialled atomic.Int32
	arrived := make(chan struct{}, window)
	var gate atomic.Pointer[chan struct{}]
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release := *gate.Load()
		var req struct {
			RID string `json:"rid"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("request body: %v", err)
		}
		arrived <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"text": "", "meta_info": map[string]any{"id": req.RID, "prompt_tokens": 1}})
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialled.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	opt := fastRetries(t)
	opt.MaxConns = window
	c := NewClient(srv.URL, opt)

	for round := range rounds {
		release := make(chan struct{})
		gate.Store(&release)
		var wg sync.WaitGroup
		for i := range window {
			wg.Go(func() {
				rid := fmt.Sprintf("s%09d-a1", round*window+i)
				if _, err := c.Generate(context.Background(), GenerateRequest{RID: rid, InputIDs: []int64{1}}); err != nil {
					t.Errorf("rid %s: %v", rid, err)
				}
			})
		}
		for range window {
			<-arrived
		}
		close(release)
		wg.Wait()
	}
	// A connection can come back to the pool a moment after its answer was read, so a
	// round may dial a few anew; without the fix each round dials ~window-GOMAXPROCS.
	if n := dialled.Load(); n > 2*window {
		t.Errorf("%d TCP connections for %d requests in windows of %d, want about %d", n, rounds*window, window, window)
	}
	t.Logf("%d TCP connections for %d requests in windows of %d", dialled.Load(), rounds*window, window)
}
