// Package safetensors reads and writes the safetensors format of Hugging Face: the weights of
// Hugging Face model directories (package weights) and the PyTorch reference's test vectors.
// Read parses a whole file; ReadNames and ReadTensor read its header, and one tensor, only;
// Write stores float32 tensors as F32 or BF16.
package safetensors

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
)

// Tensor is one tensor of a safetensors file.
type Tensor struct {
	DType string // "F32", "F16", "BF16", "F64", "I32", "I64"
	Shape []int
	Data  []byte // little-endian raw values
}

// File is a parsed safetensors file.
type File struct {
	Path     string
	Metadata map[string]string // __metadata__
	Tensors  map[string]Tensor
}

var dtypeSize = map[string]int{"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4}

// Read parses a whole safetensors file: an 8-byte little-endian header length, a
// JSON header mapping names to dtype, shape and data offsets, then the raw data. Every
// tensor's extent is checked against its shape and the file size.
func Read(path string) (*File, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: read %s: %w", path, err)
	}
	if len(raw) < 8 {
		return nil, fmt.Errorf("safetensors: %s: %d bytes is too short for a safetensors header", path, len(raw))
	}
	hl := binary.LittleEndian.Uint64(raw)
	if hl > uint64(len(raw)-8) {
		return nil, fmt.Errorf("safetensors: %s: header length %d exceeds the file (%d bytes): truncated or not safetensors", path, hl, len(raw))
	}
	var header map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+hl], &header); err != nil {
		return nil, fmt.Errorf("safetensors: %s: header: %w", path, err)
	}
	data := raw[8+hl:]
	st := &File{Path: path, Metadata: map[string]string{}, Tensors: map[string]Tensor{}}
	type span struct {
		name string
		b, e int
	}
	var spans []span
	for name, msg := range header {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &st.Metadata); err != nil {
				return nil, fmt.Errorf("safetensors: %s: __metadata__: %w", path, err)
			}
			continue
		}
		var h struct {
			DType   string `json:"dtype"`
			Shape   []int  `json:"shape"`
			Offsets [2]int `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &h); err != nil {
			return nil, fmt.Errorf("safetensors: %s: tensor %q: %w", path, name, err)
		}
		size, ok := dtypeSize[h.DType]
		if !ok {
			return nil, fmt.Errorf("safetensors: %s: tensor %q has dtype %q; supported: F64 F32 F16 BF16 I64 I32", path, name, h.DType)
		}
		if slices.ContainsFunc(h.Shape, func(d int) bool { return d < 0 }) {
			return nil, fmt.Errorf("safetensors: %s: tensor %q: shape %v has a negative dimension", path, name, h.Shape)
		}
		n, fits := shapeBytes(h.Shape, size, len(data))
		b, e := h.Offsets[0], h.Offsets[1]
		if !fits || b < 0 || e < b || e > len(data) || e-b != n {
			return nil, fmt.Errorf("safetensors: %s: tensor %q: offsets [%d, %d) do not hold %v %s in %d data bytes", path, name, b, e, h.Shape, h.DType, len(data))
		}
		st.Tensors[name] = Tensor{DType: h.DType, Shape: h.Shape, Data: data[b:e]}
		spans = append(spans, span{name, b, e})
	}
	// As the safetensors format requires, no two tensors share bytes: one tensor's write
	// through its data must never change another.
	slices.SortFunc(spans, func(x, y span) int { return cmp.Or(cmp.Compare(x.b, y.b), cmp.Compare(x.e, y.e)) })
	for i := 1; i < len(spans); i++ {
		if p, q := spans[i-1], spans[i]; q.b < p.e {
			return nil, fmt.Errorf("safetensors: %s: tensors %q [%d, %d) and %q [%d, %d) overlap", path, p.name, p.b, p.e, q.name, q.b, q.e)
		}
	}
	return st, nil
}

// shapeBytes is the number of bytes of a tensor of shape with elemSize-byte elements, and
// false when that is more than limit (overflowing or not), or when a dimension is negative
// and none is zero.
func shapeBytes(shape []int, elemSize, limit int) (int, bool) {
	if slices.Contains(shape, 0) {
		return 0, true
	}
	n := elemSize
	for _, d := range shape {
		if n > limit/d {
			return 0, false
		}
		n *= d
	}
	return n, n <= limit
}

// Names returns the tensor names in sorted order.
func (s *File) Names() []string {
	names := make([]string, 0, len(s.Tensors))
	for n := range s.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Float32 returns tensor name converted to float32, with its shape.
func (s *File) Float32(name string) ([]float32, []int, error) {
	t, ok := s.Tensors[name]
	if !ok {
		return nil, nil, fmt.Errorf("safetensors: %s: no tensor %q", s.Path, name)
	}
	n := len(t.Data) / dtypeSize[t.DType]
	out := make([]float32, n)
	d := t.Data
	for i := range out {
		switch t.DType {
		case "F32":
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:]))
		case "F64":
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(d[8*i:])))
		case "BF16":
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(d[2*i:])) << 16)
		case "F16":
			out[i] = halfToFloat(binary.LittleEndian.Uint16(d[2*i:]))
		case "I32":
			out[i] = float32(int32(binary.LittleEndian.Uint32(d[4*i:])))
		case "I64":
			out[i] = float32(int64(binary.LittleEndian.Uint64(d[8*i:])))
		}
	}
	return out, t.Shape, nil
}

// Int32 returns integer tensor name (I32 or I64) as int32, with its shape.
func (s *File) Int32(name string) ([]int32, []int, error) {
	t, ok := s.Tensors[name]
	if !ok {
		return nil, nil, fmt.Errorf("safetensors: %s: no tensor %q", s.Path, name)
	}
	var out []int32
	switch t.DType {
	case "I32":
		out = make([]int32, len(t.Data)/4)
		for i := range out {
			out[i] = int32(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
	case "I64":
		out = make([]int32, len(t.Data)/8)
		for i := range out {
			v := int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
			if v != int64(int32(v)) {
				return nil, nil, fmt.Errorf("safetensors: %s: tensor %q value %d does not fit int32", s.Path, name, v)
			}
			out[i] = int32(v)
		}
	default:
		return nil, nil, fmt.Errorf("safetensors: %s: tensor %q is %s, want an integer dtype", s.Path, name, t.DType)
	}
	return out, t.Shape, nil
}

// halfToFloat converts an IEEE 754 binary16 value.
func halfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: mant · 2^-24
		v := float32(mant) / (1 << 24)
		if sign != 0 {
			v = -v
		}
		return v
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}
