package ckpt

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"distflash/internal/fuzztest"
)

// The fuzz target for the file format this package reads from outside: checkpoint manifests
// with their shards (FuzzOpenCheckpoint; Hugging Face's formats are fuzzed in package weights
// and weights/safetensors). Its seed corpus in testdata/fuzz/ holds hand-made attacks and runs
// as ordinary tests; `go test -fuzz` explores from there. It asserts that whatever the bytes,
// the reader returns (no panic, no allocation beyond what the file justifies) and that every
// error names the file it is about.

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
		defer fuzztest.Watchdog(manifest, shard)()
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, ManifestFile), fixChecksum(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ShardFile(0)), shard, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Open(dir)
		if err != nil {
			fuzztest.MustName(t, err, dir)
			return
		}
		defer c.Close()
		for _, ti := range c.Manifest().Tensors {
			x, err := c.ReadTensor(ti.Name)
			if err != nil {
				fuzztest.MustName(t, err, dir)
				continue
			}
			if int64(len(x)) != ti.Len {
				t.Fatalf("tensor %q: %d values, the manifest says %d", ti.Name, len(x), ti.Len)
			}
		}
	})
}
