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

	"distflash/data/datatest"
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
				st, err := WriteShards(context.Background(), src, ByteTokenizer{}, ShardOptions{Out: dir, ShardTokens: 4000})
				if err != nil {
					t.Fatal(err)
				}
				// Progress counts the files' bytes, the columns not read too.
				if st.InputBytes != st.InputTotal || st.FilesRead != 3 {
					t.Errorf("%s: WriteShards read %d of %d bytes of input, %d of 3 files", src.Format, st.InputBytes, st.InputTotal, st.FilesRead)
				}
				out[src.Format] = dir
			}
			if n := datatest.SameFiles(t, out["parquet"], out["jsonl"]); n < 3 {
				t.Errorf("%d files written, want several shards and shards.json", n)
			}
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

// pqFixture is the directory of the files scripts/make_parquet_fixture.py writes with
// pyarrow.
const pqFixture = "testdata/parquet"

// TestParquetPyarrowFixture reads the files pyarrow wrote (every codec the Hub uses;
// string, large_string, binary and struct columns; dictionary and plain encodings; pages
// v1 and v2; nulls and an empty string in several row groups) and checks that each gives
// the documents of docs.jsonl, the same files as JSON lines.
func TestParquetPyarrowFixture(t *testing.T) {
	ref := Source{Path: filepath.Join(pqFixture, "docs.jsonl"), Format: "jsonl"}
	want, err := ReadDocuments(ref, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantTokens, err := LoadTokens(ref, ByteTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 53 || !bytes.Contains(want[0], []byte("«naïve» café, 日本語, emoji 🙂")) {
		t.Fatalf("docs.jsonl gives %d documents, want 53 (60 rows, 6 null, 1 empty); the first %q", len(want), want[0])
	}
	for _, tt := range []struct{ file, key string }{
		{"docs-snappy.parquet", ""},
		{"docs-zstd.parquet", "text"},
		{"docs-gzip.parquet", ""},
		{"docs-large-string.parquet", ""},
		{"docs-binary.parquet", ""},
		{"docs-nested.parquet", "meta.body"},
	} {
		t.Run(tt.file, func(t *testing.T) {
			var log bytes.Buffer
			path := filepath.Join(pqFixture, tt.file)
			src := Source{Path: path, Format: "parquet", TextKey: tt.key, Log: &log}
			got, err := ReadDocuments(src, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, want, bytes.Equal) {
				t.Fatalf("%d documents, want the %d of docs.jsonl:\ngot  %q\nwant %q", len(got), len(want), got, want)
			}
			if line := "data: 6 null texts skipped in " + path; !strings.Contains(log.String(), line) {
				t.Errorf("log %q does not say %q", log.String(), line)
			}
			tokens, err := LoadTokens(src, ByteTokenizer{})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(tokens, wantTokens) {
				t.Errorf("LoadTokens gives %d tokens, of docs.jsonl %d, and they differ", len(tokens), len(wantTokens))
			}
		})
	}
}

// flipped returns a copy of b with the byte at i inverted.
func flipped(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0xff
	return c
}

// pqTextChunk returns the byte range of the text column's chunk in row group 0 of the
// Parquet file b.
func pqTextChunk(t *testing.T, b []byte, column string) (start, end int) {
	t.Helper()
	f, err := parquet.OpenFile(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range f.Metadata().RowGroups[0].Columns {
		if strings.Join(c.MetaData.PathInSchema, ".") == column {
			start = int(c.MetaData.DataPageOffset)
			if d := int(c.MetaData.DictionaryPageOffset); d > 0 && d < start {
				start = d
			}
			return start, start + int(c.MetaData.TotalCompressedSize)
		}
	}
	t.Fatalf("no column %q", column)
	return 0, 0
}

// TestParquetBadFiles checks that each kind of bad file is refused with an error that
// names the file and what is wrong, by LoadTokens, ReadDocuments and WriteShards, and that
// WriteShards leaves no output.
func TestParquetBadFiles(t *testing.T) {
	good := filepath.Join(t.TempDir(), "good.parquet")
	writeParquet(t, good, pqDocs(200), pqLayout{column: "string", codec: &parquet.Snappy, rowGroup: 50, pageBytes: 1 << 10})
	goodBytes, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	fixture := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(pqFixture, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	pageStart, pageEnd := pqTextChunk(t, goodBytes, "text")
	footer := len(goodBytes) - 8 - int(uint32(goodBytes[len(goodBytes)-8])|uint32(goodBytes[len(goodBytes)-7])<<8)
	randomText := make([]byte, 200<<10)
	for i := range randomText {
		randomText[i] = byte(i*7919 + i/3)
	}
	binDocs := []pqDoc{}
	for i := 0; i < len(randomText); i += 4 << 10 {
		binDocs = append(binDocs, pqDoc{text: string(randomText[i : i+4<<10])})
	}
	binFile := filepath.Join(t.TempDir(), "bin.parquet")
	writeParquet(t, binFile, binDocs, pqLayout{column: "binary"})
	binBytes, err := os.ReadFile(binFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		content []byte
		format  string
		key     string
		want    []string
	}{
		{"jsonl named .parquet", []byte(`{"text": "a"}` + "\n"), "", "", []string{"is not a Parquet file", "does not start with the PAR1 magic", `like JSON lines: set data.format = "jsonl"`}},
		{"gzip named .parquet", gzipData(t, []byte(`{"text": "a"}`)), "", "", []string{"is not a Parquet file", `compressed JSON lines are data.format = "jsonl"`}},
		{"text named .parquet", []byte("just some text\n"), "", "", []string{"is not a Parquet file", `"just some text\n"`}},
		{"empty", nil, "", "", []string{"is empty, not a Parquet file"}},
		{"encrypted", append([]byte("PARE"), goodBytes[4:]...), "", "", []string{"encrypted Parquet file"}},
		{"truncated half", goodBytes[:len(goodBytes)/2], "", "", []string{"is truncated", "does not end with the PAR1 magic"}},
		{"truncated to the magic", goodBytes[:6], "", "", []string{"is truncated", "too short to hold a Parquet footer"}},
		{"footer longer than the file", append(bytes.Clone(goodBytes[:40]), goodBytes[len(goodBytes)-8:]...), "", "", []string{"truncated or corrupt: its footer says it is"}},
		{"corrupt footer", flipped(flipped(goodBytes, footer+3), footer+10), "", "", []string{"corrupt Parquet footer"}},
		{"corrupt page", flipped(goodBytes, (pageStart+pageEnd)/2), "", "", []string{`row group 0 (of 4), column "text": corrupt page`, "checksum mismatch"}},
		{"missing column", goodBytes, "", "body", []string{`no column "body"`, "the file's columns are id (INT64", "text (BYTE_ARRAY STRING)"}},
		{"missing nested column", goodBytes, "", "text.body", []string{`no column "text.body"`, "the file's columns are id (INT64"}},
		{"int64 column", goodBytes, "", "id", []string{`column "id" is INT64`, "not text"}},
		{"pyarrow int64 column", fixture("docs-nested.parquet"), "", "id", []string{`column "id" is INT64`}},
		{"pyarrow struct column", fixture("docs-nested.parquet"), "", "meta", []string{`column "meta" is a struct`, "meta.body (BYTE_ARRAY STRING)"}},
		{"pyarrow list column", fixture("docs-nested.parquet"), "", "tags", []string{`column "tags" is a list`, "tags.list.element (BYTE_ARRAY STRING repeated)"}},
		{"pyarrow list leaf", fixture("docs-nested.parquet"), "", "tags.list.element", []string{`column "tags.list.element" is repeated (a list)`, "one text per row"}},
		{"pyarrow missing column", fixture("docs-nested.parquet"), "", "text", []string{`no column "text"`, "id (INT64", "meta.lang (BYTE_ARRAY STRING), meta.body (BYTE_ARRAY STRING), tags.list.element"}},
		{"binary data", binBytes, "", "", []string{`column "text"`, "is not UTF-8", "binary data, not text"}},
		{"empty key name", goodBytes, "", "meta..body", []string{`data.text_key = "meta..body"`, "empty name"}},
		{"parquet read as jsonl", goodBytes, "jsonl", "", []string{`is a Parquet file`, `set data.format = "parquet"`}},
		{"parquet read as c4", goodBytes, "c4", "", []string{`is a Parquet file`, `set data.format = "parquet"`}},
		{"parquet read as text", goodBytes, "text", "", []string{`is a Parquet file`, `set data.format = "parquet"`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			format := cmp.Or(tt.format, "parquet")
			path := filepath.Join(t.TempDir(), "bad.parquet")
			if err := os.WriteFile(path, tt.content, 0o644); err != nil {
				t.Fatal(err)
			}
			src := Source{Path: path, Format: format, TextKey: tt.key}
			check := func(what string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s: no error", what)
				}
				wantPath := path
				if tt.name == "empty key name" {
					wantPath = "" // refused before any file is opened
				}
				for _, w := range append(tt.want, wantPath) {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: error %q does not say %q", what, err, w)
					}
				}
			}
			_, err := LoadTokens(src, ByteTokenizer{})
			check("LoadTokens", err)
			_, err = ReadDocuments(src, 0)
			check("ReadDocuments", err)
			out := filepath.Join(t.TempDir(), "shards")
			_, err = WriteShards(context.Background(), src, ByteTokenizer{}, ShardOptions{Out: out})
			check("WriteShards", err)
			ents, _ := os.ReadDir(filepath.Dir(out))
			if len(ents) != 0 {
				t.Errorf("WriteShards left %v beside its output", ents)
			}
		})
	}
}

// TestParquetFlippedBytes inverts each byte of pyarrow's files in turn (they carry no page
// checksums, so a flipped page byte reaches the decoders) and reads the result: every
// read must end, with the documents or with an error naming the file, never a panic, and
// an error in a page must name the row group and column. The library panics on some of
// these (an index out of range in a corrupt dictionary page, say); the reader turns that
// into an error.
func TestParquetFlippedBytes(t *testing.T) {
	for _, name := range []string{"docs-snappy.parquet", "docs-gzip.parquet", "docs-zstd.parquet"} {
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(pqFixture, name))
			if err != nil {
				t.Fatal(err)
			}
			start, end := pqTextChunk(t, b, "text")
			path := filepath.Join(t.TempDir(), name)
			errs, pageErrs, recovered := 0, 0, 0
			step := 1
			if testing.Short() {
				step = 7
			}
			for i := 0; i < len(b); i += step {
				if err := os.WriteFile(path, flipped(b, i), 0o644); err != nil {
					t.Fatal(err)
				}
				_, err := ReadDocuments(Source{Path: path, Format: "parquet"}, 0)
				if err == nil {
					continue
				}
				errs++
				if !strings.Contains(err.Error(), path) {
					t.Fatalf("byte %d flipped: error %q does not name the file", i, err)
				}
				if strings.Contains(err.Error(), "the Parquet reader failed on it") {
					if recovered++; recovered == 1 {
						t.Logf("byte %d flipped: %v", i, err)
					}
				}
				if i >= start && i < end && strings.Contains(err.Error(), "corrupt page") {
					pageErrs++
					if !strings.Contains(err.Error(), `row group 0 (of 4), column "text"`) {
						t.Fatalf("byte %d flipped, in row group 0's text chunk: error %q does not name them", i, err)
					}
				}
			}
			t.Logf("%d of %d flips refused, %d of them in row group 0's text column chunk (bytes %d to %d), %d panics recovered", errs, len(b)/step, pageErrs, start, end, recovered)
			if errs == 0 || pageErrs == 0 {
				t.Errorf("no flipped byte was refused (%d) or none in the text column chunk (%d)", errs, pageErrs)
			}
		})
	}
}
