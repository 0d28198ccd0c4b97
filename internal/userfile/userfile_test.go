package userfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A FIFO, a symlink to one, a directory and /dev/zero are refused at once, naming what
// they are; a symlink to a regular file is followed.
func TestOnlyARegularFileOpensAndAFIFONeverBlocks(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	reg := filepath.Join(dir, "data.jsonl")
	if err := os.WriteFile(reg, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	toFIFO, toReg := filepath.Join(dir, "to-fifo"), filepath.Join(dir, "to-reg")
	if err := os.Symlink(fifo, toFIFO); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(reg, toReg); err != nil {
		t.Fatal(err)
	}
	for path, kind := range map[string]string{fifo: "a FIFO (named pipe)", toFIFO: "a FIFO (named pipe)", dir: "a directory", "/dev/zero": "a character device"} {
		start := time.Now()
		f, err := OpenRegular(path)
		if err == nil {
			f.Close()
			t.Fatalf("%s opened", path)
		}
		if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), path+" is "+kind) {
			t.Errorf("%s: %v; want it named %s", path, err, kind)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("%s: refused after %v", path, took)
		}
	}
	f, err := OpenRegular(toReg)
	if err != nil {
		t.Fatalf("a symlink to a regular file: %v", err)
	}
	f.Close()
}
