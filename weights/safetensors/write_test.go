package safetensors

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// roundTripTensors are tensors of several shapes, a scalar's included, with values that are
// not bf16-exact.
func roundTripTensors() []WTensor {
	var ts []WTensor
	for i, shape := range [][]int{{3, 5}, {7}, {4, 4}, {}} {
		t := WTensor{Name: fmt.Sprintf("t%d.weight", i), Shape: shape}
		n, _ := shapeBytes(shape, 1, 1<<20)
		for j := range n {
			t.Data = append(t.Data, float32(math.Sin(float64(i*1000+j)))*1.2345)
		}
		ts = append(ts, t)
	}
	return ts
}

// TestWriteRoundTrip: what Write writes, Read reads back: F32 bit for bit, BF16 as each value
// rounded to nearest even (the top 16 bits after rounding), with the metadata and an
// 8-byte-aligned header.
func TestWriteRoundTrip(t *testing.T) {
	for _, dtype := range []string{DTypeF32, DTypeBF16} {
		t.Run(dtype, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.safetensors")
			ts := roundTripTensors()
			if err := Write(path, ts, dtype, map[string]string{"format": "pt"}); err != nil {
				t.Fatal(err)
			}
			raw, _ := os.ReadFile(path)
			if hl := int(raw[0]) | int(raw[1])<<8; hl%8 != 0 {
				t.Errorf("header length %d is not a multiple of 8", hl)
			}
			st, err := Read(path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Metadata["format"] != "pt" || len(st.Tensors) != len(ts) {
				t.Fatalf("metadata %v, %d tensors", st.Metadata, len(st.Tensors))
			}
			for _, w := range ts {
				got, shape, err := st.Float32(w.Name)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(shape, w.Shape) || st.Tensors[w.Name].DType != dtype {
					t.Errorf("%s: shape %v dtype %s, want %v %s", w.Name, shape, st.Tensors[w.Name].DType, w.Shape, dtype)
				}
				for i, x := range w.Data {
					want := x
					if dtype == DTypeBF16 {
						want = math.Float32frombits(uint32(BF16Bits(x)) << 16)
						if d := math.Abs(float64(want - x)); d > math.Abs(float64(x))/256 {
							t.Fatalf("bf16 of %v is %v: more than half an ulp away", x, want)
						}
					}
					if math.Float32bits(got[i]) != math.Float32bits(want) {
						t.Fatalf("%s[%d] = %v, want %v", w.Name, i, got[i], want)
					}
				}
			}
		})
	}
}

// TestBF16BitsMatchesPyTorch compares BF16Bits with PyTorch's x.to(torch.bfloat16) on the
// vector kernels/testdata/half/convert.safetensors (ties, overflow, subnormals, NaN).
func TestBF16BitsMatchesPyTorch(t *testing.T) {
	st, err := Read("../../kernels/testdata/half/convert.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	x, _, err := st.Float32("x")
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := st.Int32("bf16")
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i, xi := range x {
		got, w := BF16Bits(xi), uint16(want[i])
		isNaN := func(b uint16) bool { return b&0x7f80 == 0x7f80 && b&0x7f != 0 }
		if got != w && !(isNaN(got) && isNaN(w)) {
			if bad < 5 {
				t.Errorf("BF16Bits(%v = %#08x) = %#04x, PyTorch %#04x", xi, math.Float32bits(xi), got, w)
			}
			bad++
		}
	}
	if bad > 0 || len(x) < 10000 {
		t.Fatalf("%d of %d conversions differ", bad, len(x))
	}
}
