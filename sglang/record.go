package sglang

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/extract-dev/extract/internal/atomicfile"
)

// record is server.json: enough to find the server again and prove it is ours.
type record struct {
	PID         int       `json:"pid"`
	PGID        int       `json:"pgid"`
	StartTime   uint64    `json:"start_time"`
	BootID      string    `json:"boot_id"`
	ServerID    string    `json:"server_id"`
	Port        int       `json:"port"`
	Fingerprint string    `json:"fingerprint"`
	Argv        []string  `json:"argv"`
	StartedAt   time.Time `json:"started_at"`
	// Launching marks a record written before the process starts: a run killed between
	// the start and the full record leaves a server findable by ServerID alone.
	Launching bool `json:"launching,omitempty"`
}

func (m *Manager) recordPath() string { return RecordPath(m.StateDir, m.Replica) }

// RecordPath is replica r's server record in stateDir: server.json for replica 0,
// server-<r>.json for the others.
func RecordPath(stateDir string, r int) string {
	if r == 0 {
		return filepath.Join(stateDir, "server.json")
	}
	return filepath.Join(stateDir, fmt.Sprintf("server-%d.json", r))
}

type procOwner int

const (
	procGone procOwner = iota
	procOurs
	procForeign
)

// identify decides whether the recorded pid is still the process we started: same boot,
// same start time, same command line. Anything else is pid reuse and must not be signalled.
func (m *Manager) identify(rec *record) procOwner {
	st, err := readStat(rec.PID)
	if err != nil || st.dead() {
		return procGone
	}
	boot, err := bootID()
	if err != nil || boot != rec.BootID || st.startTime != rec.StartTime {
		return procForeign
	}
	cmd, err := readCmdline(rec.PID)
	if err != nil || !slices.Equal(cmd, rec.Argv) {
		return procForeign
	}
	return procOurs
}

// currentRecord describes the server this Manager launched or adopted, for when its
// record on disk is lost; nil when there is none.
func (m *Manager) currentRecord() *record {
	m.mu.Lock()
	cur := m.cur
	m.mu.Unlock()
	if cur == nil {
		return nil
	}
	boot, err := bootID()
	if err != nil {
		return nil
	}
	return &record{PID: cur.PID, PGID: cur.PGID, ServerID: cur.ServerID, StartTime: cur.StartTime, BootID: boot, Port: cur.Port, Fingerprint: cur.Fingerprint, Argv: cur.Argv}
}

func (m *Manager) readRecord() (*record, error) {
	b, err := os.ReadFile(m.recordPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read server record: %w", err)
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err == nil && rec.Launching && rec.ServerID != "" {
		return &rec, nil
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.PID <= 0 || rec.PGID <= 0 {
		// Written by rename, so this is not a torn write but a foreign edit: it proves
		// nothing about any process, and the port check guards the launch.
		m.log().Warn("server record is unreadable; ignoring it", "record", m.recordPath(), "error", err)
		return nil, nil
	}
	return &rec, nil
}

// writeRecord replaces server.json atomically and durably: tmp, fsync, rename, fsync dir.
func (m *Manager) writeRecord(rec *record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(m.recordPath(), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("server record: %w", err)
	}
	return nil
}

func (m *Manager) removeRecord() error {
	if err := os.Remove(m.recordPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove server record: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// Exited stays: it still closes when the server that was current is gone.
	m.cur = nil
	return nil
}
