// Package torchzip writes and reads torch's zip checkpoint container (what torch.save
// writes since torch 1.6 and torch.load(weights_only=True, mmap=True) reads), for
// dictionaries of dense tensors only.
//
// An archive is a zip of STORED records under one folder, <prefix>/:
//
//	<prefix>/data.pkl         pickle (protocol 2) of the object; each tensor is
//	                          torch._utils._rebuild_tensor_v2 of a persistent id
//	                          ('storage', torch.<Type>Storage, key, 'cpu', numel)
//	<prefix>/data/<key>       raw little-endian storage bytes, one record per storage
//	<prefix>/version          "3\n"
//	<prefix>/byteorder        "little"
//
// Every record's data starts at a multiple of 64 bytes: torch pads the local header's
// extra field (id "FB") so that mmap=True can hand out storages in place, and does the
// same. No ".format_version" record is written: from torch 2.6, its presence lets
// torch.load (config calculate_storage_offsets) compute storage offsets from torch's own
// record order and data descriptors instead of reading each local header, which would
// misplace storages of any other writer. torch reads records through the central directory and checks each record's
// CRC-32, so the writer computes it while streaming and patches the local header after
// (or takes it up front when the output is not seekable, e.g. inside gzip).
package torchzip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
)

// Alignment is torch's kFieldAlignment: where each record's data starts.
const Alignment = 64

const (
	sigLocal    = 0x04034b50
	sigCentral  = 0x02014b50
	sigEnd      = 0x06054b50
	sigEnd64    = 0x06064b50
	sigLocator  = 0x07064b50
	localLen    = 30
	centralLen  = 46
	endLen      = 22
	end64Len    = 56
	locatorLen  = 20
	max32       = math.MaxUint32
	max16       = math.MaxUint16
	zip64ID     = 0x0001
	versionZip  = 20
	versionZ64  = 45
	dosDate1980 = 0x21 // 1980-01-01, the zip epoch: the archive is the same whenever it is written
)

type entry struct {
	name   string
	offset int64 // of the local header
	size   int64
	crc    uint32
}

// Writer streams records into an archive. Only one record is open at a time.
type Writer struct {
	w   io.Writer
	at  io.WriterAt // nil: every record's CRC must be given to Create
	off int64
	// Force64 writes zip64 fields for every record, for tests of the >4 GiB path.
	Force64 bool
	entries []entry
	cur     *Record
	closed  bool
}

// NewWriter writes to w, whose current position is the archive's start at offset 0.
// at, when not nil, writes to the same file by absolute offset and lets records be
// written without knowing their CRC-32 in advance.
func NewWriter(w io.Writer, at io.WriterAt) *Writer { return &Writer{w: w, at: at} }

// Offset is the number of bytes written so far.
func (z *Writer) Offset() int64 { return z.off }

// ErrCRCMismatch means a record's data did not hash to the CRC-32 declared at Create:
// the source changed between the pass that computed it and the one that wrote it.
var ErrCRCMismatch = errors.New("the data changed since its CRC-32 was computed")

// Record is an open record: exactly its declared size must be written to it.
type Record struct {
	z        *Writer
	e        *entry
	crc      uint32 // CRC-32 (IEEE) of the data so far
	left     int64
	known    bool
	localCRC int64 // offset of the local header's CRC field
}

func (z *Writer) write(p []byte) error {
	n, err := z.w.Write(p)
	z.off += int64(n)
	return err
}

func (z *Writer) zip64(size, offset int64) bool {
	return z.Force64 || size >= max32 || offset >= max32
}

// Create starts a record of size bytes named name (the full path inside the archive).
// If crc is not nil it is the record's CRC-32 (IEEE), checked again at the end;
// otherwise the writer must have a WriterAt to patch it in.
func (z *Writer) Create(name string, size int64, crc *uint32) (*Record, error) {
	if z.closed {
		return nil, errors.New("torchzip: create after close")
	}
	if z.cur != nil {
		if err := z.cur.finish(); err != nil {
			return nil, err
		}
	}
	if crc == nil && z.at == nil {
		return nil, fmt.Errorf("torchzip: record %s: CRC-32 needed up front on an unseekable output", name)
	}
	if len(name) > max16 || size < 0 {
		return nil, fmt.Errorf("torchzip: record %s: bad name or size", name)
	}
	e := entry{name: name, offset: z.off, size: size}
	z64 := z.zip64(size, 0) // sizes only: the local header never holds the offset
	// torch's getPadding: the data starts after the header, the name, the padding
	// field's own 4 bytes and the zip64 field, rounded up to the alignment.
	start := z.off + localLen + int64(len(name)) + 4
	if z64 {
		start += 4 + 16
	}
	pad := (Alignment - start%Alignment) % Alignment
	var extra []byte
	if z64 {
		extra = binary.LittleEndian.AppendUint16(extra, zip64ID)
		extra = binary.LittleEndian.AppendUint16(extra, 16)
		extra = binary.LittleEndian.AppendUint64(extra, uint64(size))
		extra = binary.LittleEndian.AppendUint64(extra, uint64(size))
	}
	extra = append(extra, 'F', 'B')
	extra = binary.LittleEndian.AppendUint16(extra, uint16(pad))
	for range pad {
		extra = append(extra, 'Z')
	}
	h := make([]byte, localLen, localLen+len(name)+len(extra))
	binary.LittleEndian.PutUint32(h[0:], sigLocal)
	ver := uint16(versionZip)
	if z64 {
		ver = versionZ64
	}
	binary.LittleEndian.PutUint16(h[4:], ver)
	binary.LittleEndian.PutUint16(h[12:], dosDate1980)
	if crc != nil {
		binary.LittleEndian.PutUint32(h[14:], *crc)
		e.crc = *crc
	}
	sz := uint32(size)
	if z64 {
		sz = max32
	}
	binary.LittleEndian.PutUint32(h[18:], sz)
	binary.LittleEndian.PutUint32(h[22:], sz)
	binary.LittleEndian.PutUint16(h[26:], uint16(len(name)))
	binary.LittleEndian.PutUint16(h[28:], uint16(len(extra)))
	h = append(append(h, name...), extra...)
	if err := z.write(h); err != nil {
		return nil, err
	}
	z.entries = append(z.entries, e)
	z.cur = &Record{z: z, e: &z.entries[len(z.entries)-1], left: size, known: crc != nil, localCRC: e.offset + 14}
	return z.cur, nil
}

// Write writes record data; more than the declared size is an error.
func (r *Record) Write(p []byte) (int, error) {
	if int64(len(p)) > r.left {
		return 0, fmt.Errorf("torchzip: record %s: %d bytes past its declared size", r.e.name, int64(len(p))-r.left)
	}
	err := r.z.write(p)
	r.crc = crc32.Update(r.crc, crc32.IEEETable, p)
	r.left -= int64(len(p))
	return len(p), err
}

// WriteSummed is Write for a caller that hashes on another goroutine: sum is the
// record's CRC-32 (IEEE) with p folded in, which the record takes instead of hashing p.
func (r *Record) WriteSummed(p []byte, sum uint32) (int, error) {
	if int64(len(p)) > r.left {
		return 0, fmt.Errorf("torchzip: record %s: %d bytes past its declared size", r.e.name, int64(len(p))-r.left)
	}
	err := r.z.write(p)
	r.crc = sum
	r.left -= int64(len(p))
	return len(p), err
}

func (r *Record) finish() error {
	r.z.cur = nil
	if r.left != 0 {
		return fmt.Errorf("torchzip: record %s: %d bytes short of its declared size", r.e.name, r.left)
	}
	sum := r.crc
	if r.known {
		if sum != r.e.crc {
			return fmt.Errorf("torchzip: record %s: CRC-32 %08x, declared %08x: %w", r.e.name, sum, r.e.crc, ErrCRCMismatch)
		}
		return nil
	}
	r.e.crc = sum
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], sum)
	_, err := r.z.at.WriteAt(b[:], r.localCRC)
	return err
}

// WriteRecord writes a small record whole.
func (z *Writer) WriteRecord(name string, data []byte) error {
	sum := crc32.ChecksumIEEE(data)
	r, err := z.Create(name, int64(len(data)), &sum)
	if err != nil {
		return err
	}
	_, err = r.Write(data)
	return err
}

// Close finishes the last record and writes the central directory. It does not close
// the underlying writer.
func (z *Writer) Close() error {
	if z.closed {
		return nil
	}
	if z.cur != nil {
		if err := z.cur.finish(); err != nil {
			return err
		}
	}
	z.closed = true
	cdStart := z.off
	for _, e := range z.entries {
		var extra []byte
		usize, off := uint32(e.size), uint32(e.offset)
		if z.zip64(e.size, e.offset) {
			// Only the fields that overflow (or all, forced) go into the zip64 field, in order.
			var f []byte
			if z.Force64 || e.size >= max32 {
				usize = max32
				f = binary.LittleEndian.AppendUint64(f, uint64(e.size))
				f = binary.LittleEndian.AppendUint64(f, uint64(e.size))
			}
			if z.Force64 || e.offset >= max32 {
				off = max32
				f = binary.LittleEndian.AppendUint64(f, uint64(e.offset))
			}
			extra = binary.LittleEndian.AppendUint16(extra, zip64ID)
			extra = binary.LittleEndian.AppendUint16(extra, uint16(len(f)))
			extra = append(extra, f...)
		}
		h := make([]byte, centralLen, centralLen+len(e.name)+len(extra))
		binary.LittleEndian.PutUint32(h[0:], sigCentral)
		ver := uint16(versionZip)
		if len(extra) > 0 {
			ver = versionZ64
		}
		binary.LittleEndian.PutUint16(h[4:], ver)
		binary.LittleEndian.PutUint16(h[6:], ver)
		binary.LittleEndian.PutUint16(h[14:], dosDate1980)
		binary.LittleEndian.PutUint32(h[16:], e.crc)
		binary.LittleEndian.PutUint32(h[20:], usize)
		binary.LittleEndian.PutUint32(h[24:], usize)
		binary.LittleEndian.PutUint16(h[28:], uint16(len(e.name)))
		binary.LittleEndian.PutUint16(h[30:], uint16(len(extra)))
		binary.LittleEndian.PutUint32(h[42:], off)
		h = append(append(h, e.name...), extra...)
		if err := z.write(h); err != nil {
			return err
		}
	}
	cdSize := z.off - cdStart
	n := len(z.entries)
	if z.Force64 || cdStart >= max32 || cdSize >= max32 || n >= max16 {
		end64 := z.off
		b := make([]byte, end64Len+locatorLen)
		binary.LittleEndian.PutUint32(b[0:], sigEnd64)
		binary.LittleEndian.PutUint64(b[4:], end64Len-12)
		binary.LittleEndian.PutUint16(b[12:], versionZ64)
		binary.LittleEndian.PutUint16(b[14:], versionZ64)
		binary.LittleEndian.PutUint64(b[24:], uint64(n))
		binary.LittleEndian.PutUint64(b[32:], uint64(n))
		binary.LittleEndian.PutUint64(b[40:], uint64(cdSize))
		binary.LittleEndian.PutUint64(b[48:], uint64(cdStart))
		l := b[end64Len:]
		binary.LittleEndian.PutUint32(l[0:], sigLocator)
		binary.LittleEndian.PutUint64(l[8:], uint64(end64))
		binary.LittleEndian.PutUint32(l[16:], 1)
		if err := z.write(b); err != nil {
			return err
		}
	}
	b := make([]byte, endLen)
	binary.LittleEndian.PutUint32(b[0:], sigEnd)
	binary.LittleEndian.PutUint16(b[8:], uint16(min(n, max16)))
	binary.LittleEndian.PutUint16(b[10:], uint16(min(n, max16)))
	binary.LittleEndian.PutUint32(b[12:], uint32(min(cdSize, max32)))
	binary.LittleEndian.PutUint32(b[16:], uint32(min(cdStart, max32)))
	return z.write(b)
}
