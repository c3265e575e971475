// Package datatest holds what the tests of data and of the commands that use it share: the
// test files that are fetched rather than committed.
package datatest

import (
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"os"
	"testing"
)

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
