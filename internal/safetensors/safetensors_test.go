package safetensors

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

func encode(t *testing.T) ([]byte, []Tensor) {
	t.Helper()
	hdr, tensors, err := EncodeHeader([]Spec{
		{Name: "input_ids", DType: I64, Shape: []int64{3}},
		{Name: "hidden_state", DType: BF16, Shape: []int64{3, 4}},
	}, map[string]string{"rid": "s000000001-a1"})
	if err != nil {
		t.Fatal(err)
	}
	return hdr, tensors
}

func TestEncodedHeaderReadsBackWithItsLayout(t *testing.T) {
	hdr, tensors := encode(t)
	if (len(hdr)-8)%8 != 0 {
		t.Errorf("JSON header of %d bytes is not padded to 8", len(hdr)-8)
	}
	file := append(hdr, make([]byte, 3*8+3*4*2)...)
	h, err := ReadHeader(bytes.NewReader(file), int64(len(file)))
	if err != nil {
		t.Fatal(err)
	}
	if h.DataStart != int64(len(hdr)) || h.Metadata["rid"] != "s000000001-a1" || h.Tensors[len(h.Tensors)-1].End != 48 {
		t.Errorf("header = %+v", h)
	}
	got, ok := h.Tensor("hidden_state")
	if !ok || got.Begin != tensors[1].Begin || got.End != tensors[1].End || got.Elements() != 12 {
		t.Errorf("hidden_state = %+v, want %+v", got, tensors[1])
	}
}

func TestReadHeaderRefusesWhatIsNotAWholeFile(t *testing.T) {
	hdr, _ := encode(t)
	whole := append(hdr, make([]byte, 48)...)
	garbage := make([]byte, 16)
	binary.LittleEndian.PutUint64(garbage, 1<<40)
	gap := []byte(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}`)
	gapFile := append(binary.LittleEndian.AppendUint64(nil, uint64(len(gap))), gap...)
	gapFile = append(gapFile, 0, 0, 0, 0)
	tests := []struct {
		name string
		file []byte
		want string
	}{
		{"truncated", whole[:len(whole)-1], "truncated"},
		{"trailing bytes", append(whole, 0), "trailing"},
		{"length garbage", garbage, "out of range"},
		{"gap between tensors", gapFile, "gap or overlap"},
		{"not JSON", append(binary.LittleEndian.AppendUint64(nil, 8), []byte("notjson!")...), "not JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadHeader(bytes.NewReader(tt.file), int64(len(tt.file)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one saying %q", err, tt.want)
			}
		})
	}
}
