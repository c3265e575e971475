package data

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress"
)

// pqDoc is one row of a test file: its text, or a null.
type pqDoc struct {
	text string
	null bool
}

// pqDocs returns n rows with what a reader must keep byte for byte: non-ASCII text,
// quotes, backslashes, newlines, NUL-free control characters; some empty strings (skipped
// as empty documents) and some nulls (skipped and counted); one with invalid UTF-8.
func pqDocs(n int) []pqDoc {
	docs := make([]pqDoc, n)
	for i := range docs {
		switch {
		case i%17 == 5:
			docs[i] = pqDoc{null: true}
		case i%23 == 7:
			docs[i] = pqDoc{text: ""}
		case i == 11:
			docs[i] = pqDoc{text: "Latin-1 caf\xe9 in a UTF-8 file"}
		default:
			docs[i] = pqDoc{text: fmt.Sprintf("Document %d: «naïve» café, 日本語, \"quoted\" \\ back\tslash\n%s", i, strings.Repeat("word ", i%40))}
		}
	}
	return docs
}

// Rows of the test files: a string column with an int64 column beside it, a binary
// column, a string column dictionary-encoded, and a struct column holding the text.
type (
	pqStringRow struct {
		ID   int64   `parquet:"id"`
		Text *string `parquet:"text,optional"`
	}
	pqBinaryRow struct {
		Text []byte `parquet:"text,optional"`
		ID   int64  `parquet:"id"`
	}
	pqDictRow struct {
		Text *string `parquet:"text,optional,dict"`
	}
	pqMeta struct {
		Lang string  `parquet:"lang"`
		Body *string `parquet:"body,optional"`
	}
	pqNestedRow struct {
		ID   int64  `parquet:"id"`
		Meta pqMeta `parquet:"meta"`
	}
)

// pqLayout says how writeParquet writes a file.
type pqLayout struct {
	column    string         // string, binary, dict or nested (text in meta.body)
	codec     compress.Codec // nil: uncompressed
	rowGroup  int            // rows per row group
	pageBytes int            // page buffer size (0: the library's default)
	pageV1    bool           // data pages v1 (pyarrow's default) instead of v2
}

// writeParquet writes docs to path as layout says.
func writeParquet(t testing.TB, path string, docs []pqDoc, layout pqLayout) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	codec := layout.codec
	if codec == nil {
		codec = &parquet.Uncompressed
	}
	opts := []parquet.WriterOption{parquet.Compression(codec)}
	if layout.pageBytes > 0 {
		opts = append(opts, parquet.PageBufferSize(layout.pageBytes))
	}
	if layout.pageV1 {
		opts = append(opts, parquet.DataPageVersion(1))
	}
	str := func(d pqDoc) *string {
		if d.null {
			return nil
		}
		return &d.text
	}
	switch layout.column {
	case "string":
		writeRows(t, f, docs, layout.rowGroup, opts, func(i int, d pqDoc) pqStringRow { return pqStringRow{ID: int64(i), Text: str(d)} })
	case "binary":
		writeRows(t, f, docs, layout.rowGroup, opts, func(i int, d pqDoc) pqBinaryRow {
			if d.null {
				return pqBinaryRow{ID: int64(i)}
			}
			return pqBinaryRow{ID: int64(i), Text: append([]byte{}, d.text...)}
		})
	case "dict":
		writeRows(t, f, docs, layout.rowGroup, opts, func(i int, d pqDoc) pqDictRow { return pqDictRow{Text: str(d)} })
	case "nested":
		writeRows(t, f, docs, layout.rowGroup, opts, func(i int, d pqDoc) pqNestedRow {
			return pqNestedRow{ID: int64(i), Meta: pqMeta{Lang: "en", Body: str(d)}}
		})
	default:
		t.Fatalf("unknown column kind %q", layout.column)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// writeRows writes docs as rows made by row, a row group each rowGroup rows.
func writeRows[T any](t testing.TB, f *os.File, docs []pqDoc, rowGroup int, opts []parquet.WriterOption, row func(int, pqDoc) T) {
	t.Helper()
	w := parquet.NewGenericWriter[T](f, opts...)
	for i, d := range docs {
		if _, err := w.Write([]T{row(i, d)}); err != nil {
			t.Fatal(err)
		}
		if rowGroup > 0 && (i+1)%rowGroup == 0 {
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// jsonlOf returns the non-null docs as JSON lines with the text at key (a dotted path),
// as the Parquet file holds them. encoding/json writes invalid UTF-8 as U+FFFD, which is
// what the Parquet reader makes of it too.
func jsonlOf(t testing.TB, docs []pqDoc, key string) []byte {
	t.Helper()
	var buf bytes.Buffer
	for i, d := range docs {
		if d.null {
			continue
		}
		var v any = d.text
		names := strings.Split(key, ".")
		for j := len(names) - 1; j >= 0; j-- {
			v = map[string]any{names[j]: v, "id": i}
		}
		line, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

// pqPair writes docs split over three files, as jsonl and as Parquet laid out as layout
// says, and returns the two directories.
func pqPair(t testing.TB, docs []pqDoc, layout pqLayout, key string) (jsonlDir, parquetDir string) {
	t.Helper()
	jsonlDir, parquetDir = t.TempDir(), t.TempDir()
	parts := [][]pqDoc{docs[:len(docs)/3], docs[len(docs)/3 : len(docs)/2], docs[len(docs)/2:]}
	for i, p := range parts {
		name := fmt.Sprintf("part-%d", i)
		if err := os.WriteFile(filepath.Join(jsonlDir, name+".jsonl"), jsonlOf(t, p, key), 0o644); err != nil {
			t.Fatal(err)
		}
		writeParquet(t, filepath.Join(parquetDir, name+".parquet"), p, layout)
	}
	return jsonlDir, parquetDir
}

// pqCases are the layouts read: every codec the Hub uses and none, string, binary,
// dictionary-encoded and nested columns, several row groups of several pages, pages v1
// and v2.
var pqCases = []struct {
	name   string
	layout pqLayout
	key    string
}{
	{"uncompressed string", pqLayout{column: "string", rowGroup: 40, pageBytes: 1 << 10}, ""},
	{"snappy string", pqLayout{column: "string", codec: &parquet.Snappy, rowGroup: 50, pageBytes: 2 << 10}, "text"},
	{"zstd string v1 pages", pqLayout{column: "string", codec: &parquet.Zstd, rowGroup: 64, pageBytes: 1 << 10, pageV1: true}, ""},
	{"gzip string", pqLayout{column: "string", codec: &parquet.Gzip, rowGroup: 1000}, ""},
	{"snappy binary", pqLayout{column: "binary", codec: &parquet.Snappy, rowGroup: 30, pageBytes: 1 << 10}, ""},
	{"zstd dictionary", pqLayout{column: "dict", codec: &parquet.Zstd, rowGroup: 70}, ""},
	{"snappy nested meta.body", pqLayout{column: "nested", codec: &parquet.Snappy, rowGroup: 45, pageBytes: 1 << 10}, "meta.body"},
	{"gzip nested meta.body v1 pages", pqLayout{column: "nested", codec: &parquet.Gzip, rowGroup: 100, pageV1: true}, "meta.body"},
}

// TestParquetMatchesJSONL reads the same documents written as jsonl and as Parquet, in
// every layout of pqCases, and checks that LoadTokens (whole, and cut by MaxBytes),
// ReadDocuments and WriteShards give the same result for both: byte-identical shards.
func TestParquetMatchesJSONL(t *testing.T) {
	docs := pqDocs(300)
	nulls := 0
	for _, d := range docs {
		if d.null {
			nulls++
		}
	}
	for _, tt := range pqCases {
		t.Run(tt.name, func(t *testing.T) {
			jsonlDir, parquetDir := pqPair(t, docs, tt.layout, cmp.Or(tt.key, "text"))
			var jlog, plog bytes.Buffer
			jsrc := Source{Path: jsonlDir, Format: "jsonl", TextKey: tt.key, Seed: 7, Log: &jlog}
			psrc := Source{Path: parquetDir, Format: "parquet", TextKey: tt.key, Seed: 7, Log: &plog}

			for _, maxBytes := range []int64{0, 5000} {
				jsrc.MaxBytes, psrc.MaxBytes = maxBytes, maxBytes
				want, err := LoadTokens(jsrc, ByteTokenizer{})
				if err != nil {
					t.Fatal(err)
				}
				got, err := LoadTokens(psrc, ByteTokenizer{})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("MaxBytes %d: LoadTokens of Parquet gives %d tokens, of jsonl %d, and they differ", maxBytes, len(got), len(want))
				}
				if maxBytes > 0 && len(got) != int(maxBytes) {
					t.Errorf("MaxBytes %d: %d tokens", maxBytes, len(got))
				}
			}
			if !strings.Contains(plog.String(), fmt.Sprintf("data: %d null texts skipped in %s", nulls, parquetDir)) {
				t.Errorf("log does not count the %d nulls:\n%s", nulls, plog.String())
			}
			if !strings.Contains(plog.String(), "row group 0 (of ") || !strings.Contains(plog.String(), "row 11: invalid UTF-8") {
				t.Errorf("log does not warn of the invalid UTF-8 in row 11 of row group 0:\n%s", plog.String())
			}

			jsrc.MaxBytes, psrc.MaxBytes = 0, 0
			wantDocs, err := ReadDocuments(jsrc, 0)
			if err != nil {
				t.Fatal(err)
			}
			gotDocs, err := ReadDocuments(psrc, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(wantDocs) != len(docs)-nulls-countEmpty(docs) {
				t.Fatalf("jsonl gives %d documents, want %d", len(wantDocs), len(docs)-nulls-countEmpty(docs))
			}
			if !slices.EqualFunc(gotDocs, wantDocs, bytes.Equal) {
				t.Fatalf("ReadDocuments: Parquet gives %d documents, jsonl %d, and they differ", len(gotDocs), len(wantDocs))
			}
			if first, err := ReadDocuments(psrc, 5); err != nil || !slices.EqualFunc(first, wantDocs[:5], bytes.Equal) {
				t.Fatalf("ReadDocuments(5) = %q, %v; want %q", first, err, wantDocs[:5])
			}

			out := map[string]string{}
			for _, src := range []Source{jsrc, psrc} {
				dir := filepath.Join(t.TempDir(), "shards")
				if _, err := WriteShards(context.Background(), src, ByteTokenizer{}, ShardOptions{Out: dir, ShardTokens: 4000}); err != nil {
					t.Fatal(err)
				}
				out[src.Format] = dir
			}
			compareDirs(t, out["parquet"], out["jsonl"])
		})
	}
}

// countEmpty counts the docs with empty text.
func countEmpty(docs []pqDoc) int {
	n := 0
	for _, d := range docs {
		if !d.null && d.text == "" {
			n++
		}
	}
	return n
}

// compareDirs fails unless directories got and want hold the same files, byte for byte.
func compareDirs(t *testing.T, got, want string) {
	t.Helper()
	list := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	g, w := list(got), list(want)
	if !slices.Equal(g, w) || len(w) < 3 {
		t.Fatalf("files %q, want %q (and several shards)", g, w)
	}
	for _, name := range w {
		a, err := os.ReadFile(filepath.Join(got, name))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(want, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs (%d bytes, want %d)", name, len(a), len(b))
		}
	}
}
