package sglang

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A run killed between starting the server and recording its pid leaves a record that
// names only the server id: the process carrying that id is still found and stopped.
func TestAServerWhoseLaunchWasInterruptedIsFoundByItsIDAndStopped(t *testing.T) {
	dir := t.TempDir()
	child := exec.Command("sleep", "60")
	child.Env = append(os.Environ(), serverIDEnv+"=abc123")
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { child.Wait(); close(done) }()
	defer child.Process.Kill()
	boot, _ := bootID()
	b, _ := json.Marshal(record{ServerID: "abc123", BootID: boot, Port: 1, Launching: true})
	if err := os.WriteFile(filepath.Join(dir, "server.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	m := &Manager{StateDir: dir}
	if err := m.Stop(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the server of the interrupted launch is still running")
	}
	if _, err := os.Stat(filepath.Join(dir, "server.json")); !os.IsNotExist(err) {
		t.Errorf("record left behind: %v", err)
	}
}
