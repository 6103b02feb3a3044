package tinygguf

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func TestWriteIsDeterministicGGUF(t *testing.T) {
	write := func(seed uint64) []byte {
		var b bytes.Buffer
		if err := Write(&b, Config{Seed: seed}); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	a, again, other := write(1), write(1), write(2)
	if !bytes.Equal(a, again) {
		t.Error("the same seed wrote different models")
	}
	if bytes.Equal(a, other) {
		t.Error("another seed wrote the same model")
	}
	if string(a[:4]) != "GGUF" || binary.LittleEndian.Uint32(a[4:]) != 3 {
		t.Fatalf("header %q, want GGUF version 3", a[:8])
	}
	// 1 embedding + 9 tensors per layer (2) + output norm + output.
	if n := binary.LittleEndian.Uint64(a[8:]); n != 21 {
		t.Errorf("%d tensors, want 21", n)
	}
	if len(a)%alignment != 0 || len(a) > 4<<20 {
		t.Errorf("size %d: want aligned and tiny", len(a))
	}
	tokens, _, merges := vocab()
	if len(tokens) != 256+len(merges)+3 || !printable(byteToken(' ')+"a") || printable(byteToken(0)) {
		t.Errorf("vocabulary of %d tokens, %d merges", len(tokens), len(merges))
	}
}
