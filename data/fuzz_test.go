package data

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"distflash/internal/fuzztest"
)

// Fuzz targets for every file format this package reads from outside: Hugging Face
// tokenizer.json (FuzzHFTokenizer, with the byte-level pre-tokenizer and decoder),
// SentencePiece tokenizer.model and its protobuf decoder (FuzzSentencePiece), token shards
// (FuzzReadShard), the JSON lines of jsonl and C4 files (FuzzJSONText, in formats_test.go) and
// whole jsonl files,
// gzip- and zstd-compressed ones included (FuzzReadDocuments). Their seed corpora in
// testdata/fuzz/ hold hand-made attacks and run as ordinary tests; `go test -fuzz` explores
// from there.

// checkTokens fails t unless every id is in [0, tok.VocabSize()).
func checkTokens(t *testing.T, tok Tokenizer, ids []int32) {
	t.Helper()
	for _, id := range ids {
		if id < 0 || int(id) >= tok.VocabSize() {
			t.Fatalf("Encode gave id %d, vocabulary size %d", id, tok.VocabSize())
		}
	}
}

// fuzzTokenizer loads file (written as name) with load and, when it loads, encodes and
// decodes text and out-of-range ids: every id must be in the vocabulary, nothing may panic.
func fuzzTokenizer[T Tokenizer](t *testing.T, name string, load func(string) (T, error), file, text []byte) {
	defer fuzztest.Watchdog(file, text)()
	path := fuzztest.File(t, name, file)
	tok, err := load(path)
	if err != nil {
		fuzztest.MustName(t, err, path)
		return
	}
	ids := tok.Encode(text)
	checkTokens(t, tok, ids)
	tok.Decode(ids)
	tok.Decode([]int32{-1, 0, int32(tok.VocabSize()), 1 << 30})
}

func FuzzHFTokenizer(f *testing.F) {
	f.Fuzz(func(t *testing.T, file, text []byte) { fuzzTokenizer(t, "tokenizer.json", LoadHFTokenizer, file, text) })
}

func FuzzSentencePiece(f *testing.F) {
	f.Fuzz(func(t *testing.T, file, text []byte) {
		fuzzTokenizer(t, "tokenizer.model", LoadSentencePiece, file, text)
	})
}

func FuzzReadShard(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		defer fuzztest.Watchdog(b)()
		path := fuzztest.File(t, "data.tokens", b)
		h, toks, starts, err := ReadShardDocuments(path)
		if err != nil {
			fuzztest.MustName(t, err, path)
			return
		}
		if int64(len(toks)) != h.Tokens {
			t.Fatalf("%d tokens, the header says %d", len(toks), h.Tokens)
		}
		for _, id := range toks {
			if id < 0 || int(id) >= h.VocabSize {
				t.Fatalf("token %d outside the vocabulary of %d", id, h.VocabSize)
			}
		}
		if !h.HasDocStarts() {
			if starts != nil {
				t.Fatalf("version %d shard with a document table", h.Version)
			}
			return
		}
		if int64(len(starts)) != h.Documents || len(starts) > 0 && starts[0] != 0 {
			t.Fatalf("document table %v for %d documents", starts, h.Documents)
		}
		for i, s := range starts {
			if s > h.Tokens || i > 0 && s < starts[i-1] {
				t.Fatalf("document table %v for %d tokens", starts, h.Tokens)
			}
		}
		// With a boundary, the documents are read as LoadTokens reads them, or refused
		// naming the shard.
		if _, err := markDocuments(slices.Clone(toks), 0, starts, []int32{0}, int32(h.VocabSize-1), path); err != nil {
			fuzztest.MustName(t, err, path)
		}
	})
}

// fuzzMaxBytes is the data.max_bytes FuzzReadDocuments reads with: what a stream may give,
// however much it decompresses to.
const fuzzMaxBytes = 1 << 16

func FuzzReadDocuments(f *testing.F) {
	defer func(n int) { MaxLineBytes = n }(MaxLineBytes)
	MaxLineBytes = 1 << 20 // the bomb seeds hold 8 MiB lines
	f.Fuzz(func(t *testing.T, b []byte) {
		defer fuzztest.Watchdog(b)()
		path := fuzztest.File(t, "data.jsonl", b)
		docs, err := ReadDocuments(Source{Path: path, Format: "jsonl", MaxBytes: fuzzMaxBytes}, 0)
		if err != nil {
			fuzztest.MustName(t, err, path)
			return
		}
		n := len(docs) - 1
		for _, d := range docs {
			n += len(d)
		}
		if n > fuzzMaxBytes {
			t.Fatalf("%d bytes of documents with max_bytes %d", n, fuzzMaxBytes)
		}
	})
}

// TestReadDocumentsBomb checks that a small compressed file that expands to one endless line
// stops at MaxLineBytes with an error naming the file, the line and the compression.
func TestReadDocumentsBomb(t *testing.T) {
	defer func(n int) { MaxLineBytes = n }(MaxLineBytes)
	MaxLineBytes = 1 << 20
	line := append([]byte(`{"text":"`), bytes.Repeat([]byte("a"), 8<<20)...)
	for _, tt := range []struct{ kind, content string }{
		{"gzip", string(gzipData(t, line))},
		{"zstd", string(zstdData(t, line))},
		{"file", string(line)},
	} {
		path := fuzztest.File(t, "bomb.jsonl", []byte(tt.content))
		_, err := ReadDocuments(Source{Path: path, Format: "jsonl"}, 0)
		if err == nil {
			t.Fatalf("%s: an 8 MiB line was read with MaxLineBytes 1 MiB", tt.kind)
		}
		for _, want := range []string{path + ":1:", "line longer than 1048576 bytes", tt.kind} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error lacks %q: %v", tt.kind, want, err)
			}
		}
	}
}

// TestReadDocumentsZstdWindow: a zstd frame whose header asks for a 1 GiB window is refused,
// naming the file and the limit, before the decoder allocates it.
func TestReadDocumentsZstdWindow(t *testing.T) {
	frame := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 20 << 3, 0x09, 0x00, 0x00, '\n'}
	path := fuzztest.File(t, "big-window.jsonl", frame)
	_, err := ReadDocuments(Source{Path: path, Format: "jsonl"}, 0)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "window larger than 134217728 bytes") {
		t.Fatalf("1 GiB window: %v", err)
	}
	frame[5] = 17 << 3 // 128 MiB: read (an empty stream: one newline)
	path = fuzztest.File(t, "window.jsonl", frame)
	if _, err := ReadDocuments(Source{Path: path, Format: "jsonl"}, 0); err == nil || !strings.Contains(err.Error(), "no text") {
		t.Fatalf("128 MiB window: %v, want the error of an empty file", err)
	}
}
