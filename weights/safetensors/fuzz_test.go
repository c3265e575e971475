package safetensors

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"distflash/internal/fuzztest"
)

// The fuzz target of the format: FuzzReadSafetensors, on Read and the header-only readers
// (ReadNames, ReadTensor). Its seed corpus in testdata/fuzz/ holds hand-made attacks and runs
// as ordinary tests; `go test -fuzz` explores from there. It asserts that whatever the bytes,
// the readers return (no panic, no allocation beyond what the file justifies), agree, and that
// every error names the file.

func FuzzReadSafetensors(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		defer fuzztest.Watchdog(b)()
		path := fuzztest.File(t, "model.safetensors", b)
		st, err := Read(path)
		if err != nil {
			fuzztest.MustName(t, err, path)
			return
		}
		for _, name := range st.Names() {
			tt := st.Tensors[name]
			n := 1
			for _, d := range tt.Shape {
				if d < 0 {
					t.Fatalf("tensor %q: negative dimension in %v accepted", name, tt.Shape)
				}
				n *= d
			}
			if len(tt.Data) != n*dtypeSize[tt.DType] {
				t.Fatalf("tensor %q: %d bytes for %v %s", name, len(tt.Data), tt.Shape, tt.DType)
			}
			if v, _, err := st.Float32(name); err != nil || len(v) != n {
				t.Fatalf("tensor %q: Float32 gives %d values, %v; want %d", name, len(v), err, n)
			}
			st.Int32(name)
			raw, err := ReadTensor(path, name)
			if err != nil || !bytes.Equal(raw.Data, tt.Data) {
				t.Fatalf("tensor %q: ReadTensor disagrees with Read: %v", name, err)
			}
		}
		names, err := ReadNames(path)
		if err != nil || len(names) != len(st.Tensors) {
			t.Fatalf("ReadNames: %d names, %v; Read found %d tensors", len(names), err, len(st.Tensors))
		}
	})
}

// TestAttacks: the hand-made attacks of FuzzReadSafetensors' seeds are refused with
// an error that names the file and says what is wrong.
func TestAttacks(t *testing.T) {
	file := func(header string, data int) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
		return append(append(b, header...), make([]byte, data)...)
	}
	for _, tt := range []struct{ name, header, want string }{
		{"overlapping", `{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}}`, "overlap"},
		{"same bytes", `{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, "overlap"},
		{"negative shape", `{"a":{"dtype":"F32","shape":[-1,-4],"data_offsets":[0,16]}}`, "negative dimension"},
		{"overflowing shape", `{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}`, "do not hold"},
		{"offsets past end", `{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16000000]}}`, "do not hold"},
		{"offsets at int64 max", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[9223372036854775804,9223372036854775807]}}`, "do not hold"},
	} {
		path := fuzztest.File(t, "m.safetensors", file(tt.header, 16))
		_, err := Read(path)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error naming the file and %q", tt.name, err, tt.want)
		}
	}
	// ReadTensor (weights' tie_word_embeddings check) reads offsets itself: past the end of the file,
	// even where 8+header+end overflows int64, is an error, not a huge allocation.
	path := fuzztest.File(t, "m.safetensors", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,9223372036854775807]}}`, 16))
	if _, err := ReadTensor(path, "a"); err == nil || !strings.Contains(err.Error(), "outside the file") {
		t.Errorf("ReadTensor with an end offset of 2^63-1: %v", err)
	}
}
