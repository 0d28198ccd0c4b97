package sglang

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRotateLogKeepsTheLastFiveLaunches(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.log")
	for i := 0; i < 8; i++ {
		if err := rotateLog(path); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(path, []byte(strings.Repeat("x", i+1)), 0o644)
	}
	for i := 1; i <= logKeep; i++ {
		b, err := os.ReadFile(path + "." + string(rune('0'+i)))
		if err != nil || len(b) != 8-i {
			t.Errorf("server.log.%d: %d bytes, %v; want %d", i, len(b), err, 8-i)
		}
	}
	if _, err := os.Stat(path + ".6"); !os.IsNotExist(err) {
		t.Errorf("server.log.6 kept: %v", err)
	}
}

func TestTrimLogTruncatesInPlaceForAnAppendingWriter(t *testing.T) {
	dir := t.TempDir()
	m := &Manager{StateDir: dir}
	os.MkdirAll(filepath.Dir(m.LogPath()), 0o755)
	w, err := os.OpenFile(m.LogPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.WriteString(strings.Repeat("a", 100))
	if err := m.TrimLog(50); err != nil {
		t.Fatal(err)
	}
	w.WriteString("after")
	if b, _ := os.ReadFile(m.LogPath()); string(b) != "after" {
		t.Errorf("log after trim = %q, want the writer to carry on at the start", b)
	}
	if b, _ := os.ReadFile(m.LogPath() + ".1"); len(b) != 100 {
		t.Errorf("trimmed copy has %d bytes, want 100", len(b))
	}
}

// TestTrimLogNeverTruncatesTheLogOfAServerLaunchedMeanwhile runs the coordinator's
// TrimLog against launches (a restart's worker) as fast as they go: a trim that judged
// the old, large log must not truncate the new server's first lines.
func TestTrimLogNeverTruncatesTheLogOfAServerLaunchedMeanwhile(t *testing.T) {
	m := &Manager{StateDir: t.TempDir()}
	os.MkdirAll(filepath.Dir(m.LogPath()), 0o755)
	const limit = 1 << 10
	stop := make(chan struct{})
	trimmed := make(chan error)
	go func() {
		for {
			select {
			case <-stop:
				trimmed <- nil
				return
			default:
			}
			if err := m.TrimLog(limit); err != nil && !os.IsNotExist(err) {
				trimmed <- err
				return
			}
		}
	}()
	big := strings.Repeat("old server output\n", 2*limit/18)
	for i := range 3000 {
		header := "=== launch " + strings.Repeat("#", i%7) + "\n"
		f, err := m.freshLog()
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(header)
		f.Close()
		// The header is under the limit: no correct trim touches it now.
		if b, _ := os.ReadFile(m.LogPath()); string(b) != header {
			close(stop)
			<-trimmed
			t.Fatalf("launch %d: the new server's log holds %q, want its header %q", i, b, header)
		}
		// The server writes past the limit; the next launch rotates it.
		os.WriteFile(m.LogPath(), []byte(header+big), 0o644)
	}
	close(stop)
	if err := <-trimmed; err != nil {
		t.Fatal(err)
	}
}
