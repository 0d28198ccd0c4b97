package sglang

import (
	"fmt"
	"io"
	"os"
)

// logKeep is how many old server logs are kept beside the current one.
const logKeep = 5

// shiftLogs moves path.1 to path.2 … dropping the oldest, to free path.1. A missing
// older log is the usual case, and a rotation that fails only keeps one more.
func shiftLogs(path string) {
	_ = os.Remove(fmt.Sprintf("%s.%d", path, logKeep))
	for i := logKeep - 1; i >= 1; i-- {
		_ = os.Rename(fmt.Sprintf("%s.%d", path, i), fmt.Sprintf("%s.%d", path, i+1))
	}
}

// rotateLog moves a non-empty log to path.1. Each launch starts a fresh log, so the one
// that explains a crash is never buried in the next server's.
func rotateLog(path string) error {
	info, err := os.Stat(path)
	if os.IsNotExist(err) || (err == nil && info.Size() == 0) {
		return nil
	}
	if err != nil {
		return err
	}
	shiftLogs(path)
	return os.Rename(path, path+".1")
}

// freshLog rotates the server log and opens a new one for a launch, under logMu: a
// TrimLog on the coordinator between the two would truncate the new server's log, or
// shift the log that explains the last crash out of reach.
func (m *Manager) freshLog() (*os.File, error) {
	m.logMu.Lock()
	defer m.logMu.Unlock()
	if err := rotateLog(m.LogPath()); err != nil {
		m.log().Warn("rotate server log", "log", m.LogPath(), "error", err)
	}
	f, err := os.OpenFile(m.LogPath(), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open server log: %w", err)
	}
	return f, nil
}

// TrimLog keeps a running server's log under max bytes: it copies the log to path.1 and
// truncates it in place (the server writes with O_APPEND, so it carries on at the new
// end). Lines written between the copy and the truncate are lost, as with logrotate's
// copytruncate; the alternative is an unbounded file on the state disk.
func (m *Manager) TrimLog(max int64) error {
	m.logMu.Lock()
	defer m.logMu.Unlock()
	path := m.LogPath()
	info, err := os.Stat(path)
	if err != nil || info.Size() <= max {
		return nil
	}
	src, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = src.Close() }()
	shiftLogs(path)
	dst, err := os.Create(path + ".1")
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		_ = dst.Close()
		return fmt.Errorf("copy server log %s: %w", path, err)
	}
	if err := dst.Close(); err != nil {
		return err
	}
	return os.Truncate(path, 0)
}
