// Package datatest holds what the tests of data and of the commands that use it share: the
// test files that are fetched rather than committed, and the comparison of written outputs.
package datatest

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// SameFiles fails t unless directories a and b hold files of the same names with the same
// bytes (a token shard set written from two formats, say), and returns how many.
func SameFiles(t testing.TB, a, b string) int {
	t.Helper()
	names := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	na, nb := names(a), names(b)
	if !slices.Equal(na, nb) {
		t.Fatalf("%s holds %q, %s %q", a, na, b, nb)
	}
	for _, n := range na {
		x, err := os.ReadFile(filepath.Join(a, n))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(b, n))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between %s and %s (%d and %d bytes)", n, a, b, len(x), len(y))
		}
	}
	return len(na)
}

// Llama3TokenizerJSON returns LLaMA-3's tokenizer.json from path, the gzip file
// scripts/fetch_llama3_tokenizer.sh writes to data/testdata/tok/llama3.tokenizer.json.gz (Meta's
// tokenizer is not in the repository). Without the file t is skipped, saying how to fetch it,
// except under CI (CI set): .ci/run always fetches it, so there the test fails instead.
func Llama3TokenizerJSON(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		const why = "LLaMA-3's tokenizer.json is not here: run scripts/fetch_llama3_tokenizer.sh"
		if os.Getenv("CI") != "" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b
}
