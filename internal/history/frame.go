package history

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
)

// magic starts every history file: a file without it is not ours to read or extend.
const magic = "extract-history v1\n"

// frameHeader is a frame's length and crc32c (Castagnoli) of its payload, little endian.
const frameHeader = 8

// maxResync bounds the search for the next good frame after damage: past it the rest
// counts as torn, so a hostile file cannot make a reader checksum for ever.
const maxResync = 64 << 10

// maxPayload bounds one record. A length above it is damage, not a record: reading
// never allocates what a corrupt length says.
const maxPayload = 64 << 10

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendFrame appends r's frame to b.
func appendFrame(b []byte, r Record) ([]byte, error) {
	p, err := json.Marshal(r)
	if err != nil {
		return b, fmt.Errorf("encode history record at %d: %w", r.T, err)
	}
	if len(p) > maxPayload {
		return b, fmt.Errorf("history record at %d is %d bytes, more than %d", r.T, len(p), maxPayload)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(p)))
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(p, castagnoli))
	return append(b, p...), nil
}

// Decoded is what a history file holds.
type Decoded struct {
	Records []Record
	// End is the offset just past the last good frame: where the next record goes.
	End int64
	// Skipped counts bytes of damaged frames between good ones, Torn the bytes after
	// the last good frame (a record cut short by a crash).
	Skipped, Torn int64
}

// ErrNotHistory means the file does not start with the history header.
type ErrNotHistory struct{ Path string }

func (e *ErrNotHistory) Error() string {
	return fmt.Sprintf("%s is not an extract history file (no %q header)", e.Path, magic[:len(magic)-1])
}

// decode reads a history file's bytes. A damaged frame is skipped by looking for the
// next offset where a whole frame checks out (within maxResync), so one bad sector
// costs its records, not the rest of the job's history. An empty input is an empty
// history.
func decode(path string, b []byte) (Decoded, error) {
	var d Decoded
	if len(b) == 0 {
		return d, nil
	}
	if !bytes.HasPrefix(b, []byte(magic)) {
		if len(b) < len(magic) && bytes.HasPrefix([]byte(magic), b) {
			d.Torn = int64(len(b)) // the header itself was cut short: nothing was recorded
			return d, nil
		}
		return d, &ErrNotHistory{Path: path}
	}
	off := len(magic)
	d.End = int64(off)
	bad := -1 // start of the damage being skipped
	for off < len(b) {
		r, n, ok := frameAt(b[off:])
		if !ok {
			if bad < 0 {
				bad = off
			}
			if off-bad >= maxResync {
				break
			}
			off++
			continue
		}
		if bad >= 0 {
			d.Skipped += int64(off - bad)
			bad = -1
		}
		d.Records = append(d.Records, r)
		off += n
		d.End = int64(off)
	}
	if bad >= 0 {
		d.Torn = int64(len(b) - bad)
	}
	return d, nil
}

// frameAt decodes the frame at the start of b: its record and length, or ok false when
// no whole, intact frame starts there.
func frameAt(b []byte) (r Record, n int, ok bool) {
	if len(b) < frameHeader {
		return r, 0, false
	}
	size := binary.LittleEndian.Uint32(b)
	if size == 0 || size > maxPayload || int(size) > len(b)-frameHeader {
		return r, 0, false
	}
	p := b[frameHeader : frameHeader+int(size)]
	// A record is a JSON object: anything else is not worth a checksum.
	if p[0] != '{' || p[len(p)-1] != '}' {
		return r, 0, false
	}
	if crc32.Checksum(p, castagnoli) != binary.LittleEndian.Uint32(b[4:]) {
		return r, 0, false
	}
	if json.Unmarshal(p, &r) != nil {
		return r, 0, false
	}
	return r, frameHeader + int(size), true
}
