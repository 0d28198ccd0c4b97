package prepare

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
)

// sniff reads the first non-blank line (at most 64 MiB of it) and says whether it is a
// conversation line. A line that is not JSON is not a conversation: the tokens reader
// then names it.
func sniff(r io.Reader) bool {
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		line, err := readLine(br, 64<<20)
		if t := bytes.TrimSpace(line); len(t) > 0 {
			var keys map[string]json.RawMessage
			if json.Unmarshal(t, &keys) != nil {
				return false
			}
			_, ids := keys["input_ids"]
			_, text := keys["text"]
			_, c := keys["conversations"]
			_, m := keys["messages"]
			_, d := keys["data"]
			return !ids && !text && (c || m || d)
		}
		if err != nil {
			return false
		}
	}
}

func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var out []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(out)+len(chunk) <= max {
			out = append(out, chunk...)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return out, err
	}
}
