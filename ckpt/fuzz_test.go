package ckpt

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Fuzz targets for every file format this package reads from outside: safetensors files
// (FuzzReadSafetensors), Hugging Face config.json (FuzzReadHFConfig) and
// model.safetensors.index.json (FuzzOpenHFIndex), and checkpoint manifests with their shards
// (FuzzOpenCheckpoint). Their seed corpora in testdata/fuzz/ hold hand-made attacks and run
// as ordinary tests; `go test -fuzz` explores from there. Each target asserts that whatever
// the bytes, the reader returns (no panic, no allocation beyond what the file justifies) and
// that every error names the file it is about.

// fuzzFile writes b to name in a fresh directory and returns its path.
func fuzzFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// mustName fails t unless err names path.
func mustName(t *testing.T, err error, path string) {
	t.Helper()
	if !strings.Contains(err.Error(), path) {
		t.Fatalf("error does not name %s: %v", path, err)
	}
}

func FuzzReadSafetensors(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		defer watchdog(b)()
		path := fuzzFile(t, "model.safetensors", b)
		st, err := ReadSafetensors(path)
		if err != nil {
			mustName(t, err, path)
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
			raw, err := rawTensor(path, name)
			if err != nil || !bytes.Equal(raw.Data, tt.Data) {
				t.Fatalf("tensor %q: rawTensor disagrees with ReadSafetensors: %v", name, err)
			}
		}
		names, err := safetensorsNames(path)
		if err != nil || len(names) != len(st.Tensors) {
			t.Fatalf("safetensorsNames: %d names, %v; ReadSafetensors found %d tensors", len(names), err, len(st.Tensors))
		}
	})
}

func FuzzReadHFConfig(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		defer watchdog(b)()
		path := fuzzFile(t, HFConfigFile, b)
		c, err := ReadHFConfig(path)
		if err != nil {
			mustName(t, err, path)
			return
		}
		if c.HiddenSize <= 0 || c.NumHiddenLayers <= 0 || c.VocabSize <= 0 || c.HeadDim*c.NumAttentionHeads != c.HiddenSize ||
			c.NumKeyValueHeads <= 0 || c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
			t.Fatalf("accepted an inconsistent config: %+v", c)
		}
		if err := CheckHFArchitecture(path); err != nil {
			mustName(t, err, path)
		}
	})
}

// fuzzHFDir is a Hugging Face directory with a valid config.json and one shard,
// part-1.safetensors, holding tensor "a"; a sibling directory holds outside.safetensors,
// which an index must not be able to reach.
func fuzzHFDir(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "model")
	for _, d := range []string{dir, filepath.Join(root, "other")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := `{"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":16}`
	if err := os.WriteFile(filepath.Join(dir, HFConfigFile), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	a := []WTensor{{Name: "a", Shape: []int{2}, Data: []float32{1, 2}}}
	if err := WriteSafetensors(filepath.Join(dir, "part-1.safetensors"), a, "F32", nil); err != nil {
		t.Fatal(err)
	}
	b := []WTensor{{Name: "b", Shape: []int{1}, Data: []float32{3}}}
	if err := WriteSafetensors(filepath.Join(root, "other", "outside.safetensors"), b, "F32", nil); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "other", "outside.safetensors"), filepath.Join(dir, "link.safetensors")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func FuzzOpenHFIndex(f *testing.F) {
	f.Fuzz(func(t *testing.T, index []byte) {
		defer watchdog(index)()
		dir := fuzzHFDir(t)
		path := filepath.Join(dir, HFIndexFile)
		if err := os.WriteFile(path, index, 0o644); err != nil {
			t.Fatal(err)
		}
		h, err := OpenHF(dir)
		if err != nil {
			if !strings.Contains(err.Error(), dir) {
				t.Fatalf("error does not name %s: %v", dir, err)
			}
			return
		}
		for name, file := range h.Files {
			if filepath.Dir(file) != dir || filepath.Base(file) != "part-1.safetensors" {
				t.Fatalf("tensor %q is read from %s, outside %s's own shard", name, file, dir)
			}
		}
	})
}

// fixChecksum returns manifest with its checksum field set to the hash readManifest expects,
// so that the fuzzer explores what lies behind the checksum; bytes without the field come
// back as they are.
func fixChecksum(manifest []byte) []byte {
	i := bytes.Index(manifest, []byte(checksumKey))
	end := i + len(checksumKey) + 2*sha256.Size
	if i < 0 || end >= len(manifest) {
		return manifest
	}
	b := bytes.Clone(manifest)
	copy(b[i+len(checksumKey):], zeroSum)
	sum := sha256.Sum256(b)
	hex.Encode(b[i+len(checksumKey):], sum[:])
	return b
}

func FuzzOpenCheckpoint(f *testing.F) {
	f.Fuzz(func(t *testing.T, manifest, shard []byte) {
		defer watchdog(manifest, shard)()
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, ManifestFile), fixChecksum(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ShardFile(0)), shard, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Open(dir)
		if err != nil {
			mustName(t, err, dir)
			return
		}
		defer c.Close()
		for _, ti := range c.Manifest().Tensors {
			x, err := c.ReadTensor(ti.Name)
			if err != nil {
				mustName(t, err, dir)
				continue
			}
			if int64(len(x)) != ti.Len {
				t.Fatalf("tensor %q: %d values, the manifest says %d", ti.Name, len(x), ti.Len)
			}
		}
	})
}

// TestSafetensorsAttacks: the hand-made attacks of FuzzReadSafetensors' seeds are refused with
// an error that names the file and says what is wrong.
func TestSafetensorsAttacks(t *testing.T) {
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
		path := fuzzFile(t, "m.safetensors", file(tt.header, 16))
		_, err := ReadSafetensors(path)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error naming the file and %q", tt.name, err, tt.want)
		}
	}
	// rawTensor (tie_word_embeddings' check) reads offsets itself: past the end of the file,
	// even where 8+header+end overflows int64, is an error, not a huge allocation.
	path := fuzzFile(t, "m.safetensors", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,9223372036854775807]}}`, 16))
	if _, err := rawTensor(path, "a"); err == nil || !strings.Contains(err.Error(), "outside the file") {
		t.Errorf("rawTensor with an end offset of 2^63-1: %v", err)
	}
}

// fuzzHangLimit is how long one input may take under go test -fuzz before the worker is
// crashed on purpose, so that the fuzzer saves the input that hangs as a crasher (it saves
// none for an input that merely never returns).
const fuzzHangLimit = 20 * time.Second

// watchdog arms fuzzHangLimit for input b when fuzzing (never when the seeds run as tests, on
// a machine of any speed); call the returned function when the input is done.
func watchdog(b ...[]byte) func() {
	if f := flag.Lookup("test.fuzz"); f == nil || f.Value.String() == "" {
		return func() {}
	}
	t := time.AfterFunc(fuzzHangLimit, func() { panic(fmt.Sprintf("input ran past %v: %q", fuzzHangLimit, b)) })
	return func() { t.Stop() }
}
