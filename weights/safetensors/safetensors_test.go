package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeST writes a safetensors file by hand: header length, JSON header, data.
func writeST(t *testing.T, header map[string]any, data []byte) string {
	t.Helper()
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	buf := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	buf = append(append(buf, h...), data...)
	path := filepath.Join(t.TempDir(), "x.safetensors")
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReadDTypes(t *testing.T) {
	var data []byte
	data = binary.LittleEndian.AppendUint32(data, math.Float32bits(1.5))
	data = binary.LittleEndian.AppendUint32(data, math.Float32bits(-2))
	data = binary.LittleEndian.AppendUint16(data, 0x3c00) // f16 1.0
	data = binary.LittleEndian.AppendUint16(data, 0xc000) // f16 -2.0
	data = binary.LittleEndian.AppendUint16(data, 0x0001) // f16 smallest subnormal 2^-24
	data = binary.LittleEndian.AppendUint16(data, 0x3fc0) // bf16 1.5
	minus7 := int64(-7)
	data = binary.LittleEndian.AppendUint64(data, uint64(minus7))
	path := writeST(t, map[string]any{
		"__metadata__": map[string]string{"k": "v"},
		"a":            map[string]any{"dtype": "F32", "shape": []int{2}, "data_offsets": []int{0, 8}},
		"h":            map[string]any{"dtype": "F16", "shape": []int{3}, "data_offsets": []int{8, 14}},
		"b":            map[string]any{"dtype": "BF16", "shape": []int{1}, "data_offsets": []int{14, 16}},
		"i":            map[string]any{"dtype": "I64", "shape": []int{1}, "data_offsets": []int{16, 24}},
	}, data)
	st, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Metadata["k"] != "v" || len(st.Names()) != 4 {
		t.Fatalf("metadata %v names %v", st.Metadata, st.Names())
	}
	for name, want := range map[string][]float32{"a": {1.5, -2}, "h": {1, -2, float32(math.Pow(2, -24))}, "b": {1.5}, "i": {-7}} {
		got, _, err := st.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		for j := range want {
			if got[j] != want[j] {
				t.Errorf("%s[%d] = %v, want %v", name, j, got[j], want[j])
			}
		}
	}
	if ids, _, err := st.Int32("i"); err != nil || ids[0] != -7 {
		t.Errorf("Int32: %v %v", ids, err)
	}
	if _, _, err := st.Int32("a"); err == nil {
		t.Error("Int32 of an F32 tensor must fail")
	}
}

func TestReadDamage(t *testing.T) {
	good := map[string]any{"a": map[string]any{"dtype": "F32", "shape": []int{2}, "data_offsets": []int{0, 8}}}
	for _, c := range []struct {
		name   string
		header map[string]any
		data   []byte
		cut    int // bytes removed from the end of the file
		want   string
	}{
		{"truncated data", good, make([]byte, 8), 4, "do not hold"},
		{"shape mismatch", map[string]any{"a": map[string]any{"dtype": "F32", "shape": []int{3}, "data_offsets": []int{0, 8}}}, make([]byte, 8), 0, "do not hold"},
		{"unknown dtype", map[string]any{"a": map[string]any{"dtype": "Q4", "shape": []int{2}, "data_offsets": []int{0, 8}}}, make([]byte, 8), 0, "dtype \"Q4\""},
		{"header cut", good, make([]byte, 8), 30, "header"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := writeST(t, c.header, c.data)
			raw, _ := os.ReadFile(path)
			os.WriteFile(path, raw[:len(raw)-c.cut], 0o644)
			_, err := Read(path)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("error %v, want one naming the file and %q", err, c.want)
			}
		})
	}
}
