package torchzip

import (
	"bytes"
	"fmt"
)

// Storage is one storage record's bytes, for WriteSmall.
type Storage struct {
	Key  string
	Data []byte
}

// WriteSmall builds a whole archive in memory: the pickle pkl, then each storage, then
// version and byteorder, under prefix (torch.save names it "archive" for a stream). It is
// for files of a few megabytes (a vocabulary mapping), not for samples.
func WriteSmall(prefix string, pkl []byte, storages []Storage) ([]byte, error) {
	var buf bytes.Buffer
	z := NewWriter(&buf, nil)
	if err := z.WriteRecord(prefix+"/data.pkl", pkl); err != nil {
		return nil, err
	}
	for _, s := range storages {
		if err := z.WriteRecord(prefix+"/data/"+s.Key, s.Data); err != nil {
			return nil, fmt.Errorf("torchzip: storage %s: %w", s.Key, err)
		}
	}
	for _, r := range []struct{ name, data string }{{"version", "3\n"}, {"byteorder", "little"}} {
		if err := z.WriteRecord(prefix+"/"+r.name, []byte(r.data)); err != nil {
			return nil, err
		}
	}
	if err := z.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// EncodeIntDict pickles a plain dict of int keys to int values, in the given order, as
// torch.save writes {int: int} (what speculators' token_freq.pt holds); it loads with
// weights_only=True.
func EncodeIntDict(keys, values []int64) []byte {
	b := []byte{0x80, 2, '}'} // PROTO 2, EMPTY_DICT
	for i := 0; i < len(keys); i += 1000 {
		// SETITEMS in batches of 1000, as pickle does, so no mark holds the whole dict.
		b = append(b, '(')
		for j := i; j < min(i+1000, len(keys)); j++ {
			b = pickleInt(b, keys[j])
			b = pickleInt(b, values[j])
		}
		b = append(b, 'u')
	}
	return append(b, '.')
}
