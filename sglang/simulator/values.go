package simulator

import (
	"encoding/binary"
	"math"
)

// bf16OfInt8 maps a hash byte, read as int8, to the bf16 bits of int8/64. Every such
// value has at most 7 significant bits, so truncating float32 to bf16 is exact and tests
// can compare bytes rather than tolerances.
var bf16OfInt8 = func() (t [256]uint16) {
	for b := range t {
		f := float32(int8(b)) / 64
		t[b] = uint16(math.Float32bits(f) >> 16)
	}
	return t
}()

// mix is SplitMix64's finalizer: cheap, and every input bit reaches every output bit.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

const golden = 0x9e3779b97f4a7c15

func rowSeed(token int64, pos, layer int) uint64 {
	return mix(uint64(token)*0xd6e8feb86659fd93 ^ uint64(pos)*golden ^ (uint64(layer)+1)*0xa0761d6478bd642f)
}

// Tokenize is the simulator's tokenizer: one token per byte, id = byte+3, so ids 0..2
// stay free as SGLang's special tokens would.
func Tokenize(text string) []int64 {
	ids := make([]int64, len(text))
	for i := 0; i < len(text); i++ {
		ids[i] = int64(text[i]) + 3
	}
	return ids
}

// Value is the bf16 bit pattern the simulator writes for channel ch of layer at position
// pos holding token. One 64-bit hash feeds eight consecutive channels, one byte each.
func Value(token int64, pos, layer, ch int) uint16 {
	h := mix(rowSeed(token, pos, layer) + uint64(ch/8)*golden)
	return bf16OfInt8[byte(h>>(8*(ch%8)))]
}

// FillRow writes the hidden little-endian bf16 values of one row into dst[:2*hidden];
// byte for byte what Value predicts.
func FillRow(dst []byte, token int64, pos, layer, hidden int) {
	dst = dst[:2*hidden]
	seed := rowSeed(token, pos, layer)
	ch := 0
	for blk := uint64(0); ch < hidden; blk++ {
		h := mix(seed + blk*golden)
		if hidden-ch >= 8 {
			d := dst[2*ch : 2*ch+16]
			binary.LittleEndian.PutUint64(d[0:8], uint64(bf16OfInt8[byte(h)])|
				uint64(bf16OfInt8[byte(h>>8)])<<16|
				uint64(bf16OfInt8[byte(h>>16)])<<32|
				uint64(bf16OfInt8[byte(h>>24)])<<48)
			binary.LittleEndian.PutUint64(d[8:16], uint64(bf16OfInt8[byte(h>>32)])|
				uint64(bf16OfInt8[byte(h>>40)])<<16|
				uint64(bf16OfInt8[byte(h>>48)])<<32|
				uint64(bf16OfInt8[byte(h>>56)])<<48)
			ch += 8
			continue
		}
		for j := 0; ch < hidden; j++ {
			binary.LittleEndian.PutUint16(dst[2*ch:], bf16OfInt8[byte(h>>(8*j))])
			ch++
		}
	}
}
