package torchzip

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
)

// File is one record of an archive opened for random access.
type File struct {
	Name string
	// Offset is where the record's data starts in the archive; Size its length.
	Offset, Size int64
	CRC32        uint32
}

// Archive is the central directory of a torch zip: every record by full name, and the
// folder they all sit in.
type Archive struct {
	Prefix string
	Files  map[string]File
	// Order is the record names in the order their data lies in the archive.
	Order []string
}

// Open reads the central directory of the archive r of size bytes. It accepts only what
// torch.load accepts: stored records, all in one top-level folder.
func Open(r io.ReaderAt, size int64) (*Archive, error) {
	tail := min(size, endLen+max16)
	if tail < endLen {
		return nil, errors.New("not a zip archive: too short")
	}
	buf := make([]byte, tail)
	if _, err := r.ReadAt(buf, size-tail); err != nil {
		return nil, fmt.Errorf("read zip end: %w", err)
	}
	at := -1
	for i := len(buf) - endLen; i >= 0; i-- {
		if binary.LittleEndian.Uint32(buf[i:]) == sigEnd {
			at = i
			break
		}
	}
	if at < 0 {
		return nil, errors.New("not a zip archive: no end of central directory")
	}
	end := buf[at:]
	n := int64(binary.LittleEndian.Uint16(end[10:]))
	cdSize := int64(binary.LittleEndian.Uint32(end[12:]))
	cdStart := int64(binary.LittleEndian.Uint32(end[16:]))
	endOff := size - tail + int64(at)
	if endOff >= locatorLen && (n == max16 || cdSize == max32 || cdStart == max32) {
		var l [locatorLen]byte
		if _, err := r.ReadAt(l[:], endOff-locatorLen); err != nil || binary.LittleEndian.Uint32(l[:]) != sigLocator {
			return nil, errors.New("zip64 end locator missing")
		}
		off := int64(binary.LittleEndian.Uint64(l[8:]))
		var e [end64Len]byte
		if off < 0 || off > size-end64Len {
			return nil, errors.New("zip64 end record out of range")
		}
		if _, err := r.ReadAt(e[:], off); err != nil || binary.LittleEndian.Uint32(e[:]) != sigEnd64 {
			return nil, errors.New("zip64 end record missing")
		}
		n = int64(binary.LittleEndian.Uint64(e[32:]))
		cdSize = int64(binary.LittleEndian.Uint64(e[40:]))
		cdStart = int64(binary.LittleEndian.Uint64(e[48:]))
	}
	if cdStart < 0 || cdSize < 0 || cdStart > size || cdSize > size-cdStart || n > cdSize/centralLen {
		return nil, errors.New("central directory out of range")
	}
	cd := make([]byte, cdSize)
	if _, err := r.ReadAt(cd, cdStart); err != nil {
		return nil, fmt.Errorf("read central directory: %w", err)
	}
	a := &Archive{Files: map[string]File{}}
	for i := int64(0); i < n; i++ {
		if len(cd) < centralLen || binary.LittleEndian.Uint32(cd) != sigCentral {
			return nil, fmt.Errorf("central directory entry %d is damaged", i)
		}
		method := binary.LittleEndian.Uint16(cd[10:])
		f := File{CRC32: binary.LittleEndian.Uint32(cd[16:])}
		csize := int64(binary.LittleEndian.Uint32(cd[20:]))
		f.Size = int64(binary.LittleEndian.Uint32(cd[24:]))
		nl, el, cl := int(binary.LittleEndian.Uint16(cd[28:])), int(binary.LittleEndian.Uint16(cd[30:])), int(binary.LittleEndian.Uint16(cd[32:]))
		local := int64(binary.LittleEndian.Uint32(cd[42:]))
		if len(cd) < centralLen+nl+el+cl {
			return nil, fmt.Errorf("central directory entry %d overruns", i)
		}
		f.Name = string(cd[centralLen : centralLen+nl])
		extra := cd[centralLen+nl : centralLen+nl+el]
		for len(extra) >= 4 {
			id, l := binary.LittleEndian.Uint16(extra), int(binary.LittleEndian.Uint16(extra[2:]))
			if len(extra) < 4+l {
				break
			}
			if id == zip64ID {
				v := extra[4 : 4+l]
				next := func() int64 {
					if len(v) < 8 {
						return -1
					}
					x := int64(binary.LittleEndian.Uint64(v))
					v = v[8:]
					return x
				}
				if f.Size == max32 {
					f.Size = next()
				}
				if csize == max32 {
					csize = next()
				}
				if local == max32 {
					local = next()
				}
			}
			extra = extra[4+l:]
		}
		cd = cd[centralLen+nl+el+cl:]
		if method != 0 || csize != f.Size {
			return nil, fmt.Errorf("record %s is compressed (method %d): torch writes stored records", f.Name, method)
		}
		var lh [localLen]byte
		if local < 0 || local > size-localLen {
			return nil, fmt.Errorf("record %s: local header out of range", f.Name)
		}
		if _, err := r.ReadAt(lh[:], local); err != nil || binary.LittleEndian.Uint32(lh[:]) != sigLocal {
			return nil, fmt.Errorf("record %s: local header missing", f.Name)
		}
		f.Offset = local + localLen + int64(binary.LittleEndian.Uint16(lh[26:])) + int64(binary.LittleEndian.Uint16(lh[28:]))
		if f.Size < 0 || f.Offset > size || f.Size > size-f.Offset {
			return nil, fmt.Errorf("record %s: %d bytes at %d run past the archive's %d", f.Name, f.Size, f.Offset, size)
		}
		if err := a.add(f); err != nil {
			return nil, err
		}
	}
	if len(a.Files) == 0 {
		return nil, errors.New("empty zip archive")
	}
	return a, nil
}

func (a *Archive) add(f File) error {
	dir, _, ok := strings.Cut(f.Name, "/")
	if !ok || dir == "" {
		return fmt.Errorf("record %s is not in the archive's folder", f.Name)
	}
	if a.Prefix == "" {
		a.Prefix = dir
	} else if dir != a.Prefix {
		return fmt.Errorf("record %s is outside the archive's folder %s/", f.Name, a.Prefix)
	}
	if _, dup := a.Files[f.Name]; dup {
		return fmt.Errorf("record %s appears twice", f.Name)
	}
	a.Files[f.Name] = f
	a.Order = append(a.Order, f.Name)
	return nil
}

// Get returns the record at path (relative to the archive's folder).
func (a *Archive) Get(path string) (File, bool) {
	f, ok := a.Files[a.Prefix+"/"+path]
	return f, ok
}

// ReadSmall reads a whole record of at most limit bytes.
func ReadSmall(r io.ReaderAt, f File, limit int64) ([]byte, error) {
	if f.Size > limit {
		return nil, fmt.Errorf("record %s is %d bytes, more than %d", f.Name, f.Size, limit)
	}
	b := make([]byte, f.Size)
	if _, err := r.ReadAt(b, f.Offset); err != nil {
		return nil, fmt.Errorf("read record %s: %w", f.Name, err)
	}
	if crc32.ChecksumIEEE(b) != f.CRC32 {
		return nil, fmt.Errorf("record %s: CRC-32 mismatch", f.Name)
	}
	return b, nil
}

// Walk reads an archive front to back without seeking (a gzip stream), calling fn for
// each record with a reader of exactly its data; what fn leaves unread is skipped. Each
// record's CRC-32 is checked. It stops at the central directory.
func Walk(r io.Reader, fn func(name string, size int64, data io.Reader) error) error {
	br := bufio.NewReaderSize(r, 1<<16)
	var off int64
	for {
		var h [localLen]byte
		if _, err := io.ReadFull(br, h[:4]); err != nil {
			return fmt.Errorf("read record header at %d: %w", off, err)
		}
		switch binary.LittleEndian.Uint32(h[:]) {
		case sigLocal:
		case sigCentral, sigEnd:
			return nil
		default:
			return fmt.Errorf("no record header at %d", off)
		}
		if _, err := io.ReadFull(br, h[4:]); err != nil {
			return fmt.Errorf("read record header at %d: %w", off, err)
		}
		if flags := binary.LittleEndian.Uint16(h[6:]); flags&8 != 0 || binary.LittleEndian.Uint16(h[8:]) != 0 {
			return fmt.Errorf("record at %d is compressed or sized after its data", off)
		}
		want := binary.LittleEndian.Uint32(h[14:])
		size := int64(binary.LittleEndian.Uint32(h[22:]))
		nl, el := int(binary.LittleEndian.Uint16(h[26:])), int(binary.LittleEndian.Uint16(h[28:]))
		ne := make([]byte, nl+el)
		if _, err := io.ReadFull(br, ne); err != nil {
			return fmt.Errorf("read record header at %d: %w", off, err)
		}
		name := string(ne[:nl])
		if size == max32 {
			size = -1
			for extra := ne[nl:]; len(extra) >= 4; {
				id, l := binary.LittleEndian.Uint16(extra), int(binary.LittleEndian.Uint16(extra[2:]))
				if len(extra) < 4+l {
					break
				}
				if id == zip64ID && l >= 8 {
					size = int64(binary.LittleEndian.Uint64(extra[4:]))
				}
				extra = extra[4+l:]
			}
			if size < 0 {
				return fmt.Errorf("record %s: zip64 size missing", name)
			}
		}
		crc := crc32.NewIEEE()
		lr := &io.LimitedReader{R: io.TeeReader(br, crc), N: size}
		if err := fn(name, size, lr); err != nil {
			return err
		}
		if _, err := io.Copy(io.Discard, lr); err != nil {
			return fmt.Errorf("record %s: %w", name, err)
		}
		if lr.N != 0 {
			return fmt.Errorf("record %s: %w", name, io.ErrUnexpectedEOF)
		}
		if crc.Sum32() != want {
			return fmt.Errorf("record %s: CRC-32 %08x, header says %08x", name, crc.Sum32(), want)
		}
		off += localLen + int64(nl+el) + size
	}
}
