package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
)

// WTensor is a tensor to write: its name, its shape (row-major) and its float32 values
// (len(Data) = the product of Shape).
type WTensor struct {
	Name  string
	Shape []int
	Data  []float32
}

// Storage dtypes Write can write.
const (
	DTypeF32  = "F32"
	DTypeBF16 = "BF16"
)

// BF16Bits is the bfloat16 encoding of x, rounded to nearest with ties to even, as PyTorch's
// x.to(torch.bfloat16); a NaN stays a (quiet) NaN.
func BF16Bits(x float32) uint16 {
	u := math.Float32bits(x)
	if u&0x7fffffff > 0x7f800000 {
		return uint16((u | 0x00400000) >> 16)
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// ElemBytes is the size of one element that Write stores as dtype, and an error naming dtype
// and the two Write can store for any other.
func ElemBytes(dtype string) (int, error) {
	switch dtype {
	case DTypeF32:
		return 4, nil
	case DTypeBF16:
		return 2, nil
	}
	return 0, fmt.Errorf("safetensors: dtype %q: want %s or %s", dtype, DTypeF32, DTypeBF16)
}

// Write writes tensors to path in the safetensors format, in the given order, stored as
// dtype (F32, or BF16 rounded to nearest even), with metadata as __metadata__. The header is
// JSON padded with spaces to a multiple of 8 bytes and the data follow with no gaps, as the
// safetensors library writes them. The file is written in place; weights.WriteHF makes a
// whole directory appear at once.
func Write(path string, tensors []WTensor, dtype string, metadata map[string]string) error {
	size, err := ElemBytes(dtype)
	if err != nil {
		return err
	}
	var h bytes.Buffer
	h.WriteByte('{')
	if len(metadata) > 0 {
		js, err := json.Marshal(metadata) // keys sorted: reproducible
		if err != nil {
			return fmt.Errorf("safetensors: %s: metadata: %w", path, err)
		}
		h.WriteString(`"__metadata__":`)
		h.Write(js)
	}
	seen := map[string]bool{}
	var off int64
	for i, t := range tensors {
		if t.Name == "" || t.Name == "__metadata__" || seen[t.Name] {
			return fmt.Errorf("safetensors: %s: tensor name %q is empty, reserved or repeated", path, t.Name)
		}
		seen[t.Name] = true
		if n, ok := shapeBytes(t.Shape, 1, len(t.Data)); !ok || n != len(t.Data) {
			return fmt.Errorf("safetensors: %s: tensor %q: %d values for shape %v", path, t.Name, len(t.Data), t.Shape)
		}
		if i > 0 || len(metadata) > 0 {
			h.WriteByte(',')
		}
		name, _ := json.Marshal(t.Name)
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		sh, _ := json.Marshal(shape)
		end := off + int64(len(t.Data)*size)
		fmt.Fprintf(&h, `%s:{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}`, name, dtype, sh, off, end)
		off = end
	}
	h.WriteByte('}')
	for h.Len()%8 != 0 {
		h.WriteByte(' ')
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(h.Len()))
	w.Write(lenBuf[:])
	w.Write(h.Bytes())
	buf := make([]byte, 0, 1<<16)
	for _, t := range tensors {
		for lo := 0; lo < len(t.Data); lo += 1 << 14 {
			buf = buf[:0]
			for _, x := range t.Data[lo:min(lo+1<<14, len(t.Data))] {
				if dtype == DTypeF32 {
					buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(x))
				} else {
					buf = binary.LittleEndian.AppendUint16(buf, BF16Bits(x))
				}
			}
			w.Write(buf)
		}
	}
	err = w.Flush() // a bufio.Writer keeps its first error
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("safetensors: write %s: %w", path, err)
	}
	return nil
}
