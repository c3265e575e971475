package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
)

// Reading a file's header, and one tensor, without reading the whole file: what OpenHF needs
// of every shard and the tie_word_embeddings check of two tensors.

// ReadNames reads only the header of the safetensors file at path and returns its tensor
// names, sorted.
func ReadNames(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer f.Close()
	m, _, _, err := readHeader(f, path)
	if err != nil {
		return nil, err
	}
	delete(m, "__metadata__")
	return slices.Sorted(maps.Keys(m)), nil
}

// ReadTensor reads tensor name of the safetensors file at path: its header and that tensor's
// bytes only. Its offsets are checked against the file; its shape is not checked against them.
func ReadTensor(path, name string) (Tensor, error) {
	f, err := os.Open(path)
	if err != nil {
		return Tensor{}, fmt.Errorf("safetensors: %w", err)
	}
	defer f.Close()
	m, dataOff, dataSize, err := readHeader(f, path)
	if err != nil {
		return Tensor{}, err
	}
	var t struct {
		DType   string   `json:"dtype"`
		Shape   []int    `json:"shape"`
		Offsets [2]int64 `json:"data_offsets"`
	}
	if err := json.Unmarshal(m[name], &t); err != nil {
		return Tensor{}, fmt.Errorf("safetensors: %s: tensor %q: %w", path, name, err)
	}
	b, e := t.Offsets[0], t.Offsets[1]
	if b < 0 || e < b || e > dataSize {
		return Tensor{}, fmt.Errorf("safetensors: %s: tensor %q: offsets [%d, %d) outside the file", path, name, b, e)
	}
	data := make([]byte, e-b)
	if _, err := f.ReadAt(data, dataOff+b); err != nil {
		return Tensor{}, fmt.Errorf("safetensors: read %s: %w", path, err)
	}
	return Tensor{DType: t.DType, Shape: t.Shape, Data: data}, nil
}

// readHeader reads the header of the safetensors file f (at path): its entries, and where
// the data bytes after it begin and how many there are.
func readHeader(f *os.File, path string) (m map[string]json.RawMessage, dataOff, dataSize int64, err error) {
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return nil, 0, 0, fmt.Errorf("safetensors: %s: too short for a safetensors header: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("safetensors: %w", err)
	}
	hl := binary.LittleEndian.Uint64(lenBuf[:])
	if hl > uint64(fi.Size()-8) {
		return nil, 0, 0, fmt.Errorf("safetensors: %s: header length %d exceeds the file (%d bytes): truncated or not safetensors", path, hl, fi.Size())
	}
	header := make([]byte, hl)
	if _, err := io.ReadFull(f, header); err != nil {
		return nil, 0, 0, fmt.Errorf("safetensors: read %s: %w", path, err)
	}
	if err := json.Unmarshal(header, &m); err != nil {
		return nil, 0, 0, fmt.Errorf("safetensors: %s: header: %w", path, err)
	}
	return m, 8 + int64(hl), fi.Size() - 8 - int64(hl), nil
}
