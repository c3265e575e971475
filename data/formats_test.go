package data

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// gzipData returns b gzip-compressed.
func gzipData(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// zstdData returns b zstd-compressed.
func zstdData(t testing.TB, b []byte) []byte {
	t.Helper()
	zw, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer zw.Close()
	return zw.EncodeAll(b, nil)
}

// c4Lines returns docs as C4 writes them: one JSON object per line with text, timestamp
// and url, each line ending in a newline.
func c4Lines(t testing.TB, docs ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	for i, d := range docs {
		line, err := json.Marshal(struct {
			Text      string `json:"text"`
			Timestamp string `json:"timestamp"`
			URL       string `json:"url"`
		}{d, fmt.Sprintf("2019-04-%02dT12:00:00Z", i%28+1), fmt.Sprintf("https://example.com/%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

// writeFiles writes name -> content under a new temporary directory and returns it.
func writeFiles(t testing.TB, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// formatDocs are documents with what JSON must escape: quotes, backslashes, newlines, tabs,
// HTML (which encoding/json writes as \u003c), and multi-byte UTF-8.
var formatDocs = []string{
	"Beginners BBQ Class Taking Place in Missoula!\nDo you want to get better at making delicious BBQ?",
	`He said "hello" and C:\path\to\file`,
	"tabs\tand\r\nCRLF lines\n\nand a blank one",
	"<script>alert('x & y')</script>",
	"Ünïcödé, 日本語, emoji 😀 and a lone é",
	"last document, no final newline",
}

func TestLoadTokensFormatsAgree(t *testing.T) {
	// Each document in a file of its own, so every format has as many files, sorted in the
	// same order, and the seed shuffles them alike.
	text, jsonl, c4, c4gz, c4zst, mixed := map[string][]byte{}, map[string][]byte{}, map[string][]byte{}, map[string][]byte{}, map[string][]byte{}, map[string][]byte{}
	for i, d := range formatDocs {
		line := c4Lines(t, d)
		text[fmt.Sprintf("f%d.go", i)] = []byte(d)
		jsonl[fmt.Sprintf("f%d.jsonl", i)] = line
		c4[fmt.Sprintf("c4-%d.json", i)] = line
		c4gz[fmt.Sprintf("c4-%d.json.gz", i)] = gzipData(t, line)
		c4zst[fmt.Sprintf("c4-%d.json.zst", i)] = zstdData(t, line)
		// Compression told by content, not name: gzip and zstd under every c4 name.
		mixed[fmt.Sprintf("c4-%d%s", i, []string{".json", ".json.gz", ".json.zst"}[i%3])] = [][]byte{gzipData(t, line), zstdData(t, line), line}[i%3]
	}
	sources := []struct {
		name   string
		format string
		files  map[string][]byte
	}{
		{"jsonl", "jsonl", jsonl},
		{"c4 json", "c4", c4},
		{"c4 json.gz", "c4", c4gz},
		{"c4 json.zst", "c4", c4zst},
		{"c4 misnamed", "c4", mixed},
	}
	for _, tok := range []Tokenizer{ByteTokenizer{}, upperTokenizer{}} {
		for _, seed := range []uint64{0, 5} {
			want, err := LoadTokens(Source{Path: writeFiles(t, text), Seed: seed}, tok)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range sources {
				t.Run(fmt.Sprintf("%s/seed%d/%s", tok.Name(), seed, s.name), func(t *testing.T) {
					src := Source{Path: writeFiles(t, s.files), Format: s.format, Seed: seed}
					got, err := LoadTokens(src, tok)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got, want) {
						t.Fatalf("%d tokens differ from the %d of the same documents as text", len(got), len(want))
					}
					// The shards of this source read back as the same stream.
					out := filepath.Join(t.TempDir(), "shards")
					if _, err := WriteShards(context.Background(), src, tok, ShardOptions{Out: out, ShardTokens: 150}); err != nil {
						t.Fatal(err)
					}
					got, err = LoadTokens(Source{Path: out, Format: "tokens", Seed: seed + 1}, tok)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got, want) {
						t.Fatalf("tokens from shards (%d) differ from the same documents as text (%d)", len(got), len(want))
					}
				})
			}
		}
	}
}

func TestLoadTokensJSONLines(t *testing.T) {
	// One file, several documents: blank lines, CRLF endings, an empty text and no final
	// newline.
	var buf bytes.Buffer
	buf.WriteString("\n")
	for i, line := range bytes.SplitAfter(c4Lines(t, formatDocs[:3]...), []byte("\n")) {
		buf.Write(bytes.TrimSuffix(line, []byte("\n")))
		if i == 1 {
			buf.WriteString("\r\n   \n" + `{"text": ""}` + "\n")
		} else if len(line) > 0 {
			buf.WriteString("\n")
		}
	}
	buf.WriteString(`{"text": "tail"}`)
	want := strings.Join(append(slices.Clone(formatDocs[:3]), "tail"), "\n")
	for _, tt := range []struct {
		name    string
		content []byte
	}{
		{"plain", buf.Bytes()},
		{"gzip", gzipData(t, buf.Bytes())},
		{"zstd", zstdData(t, buf.Bytes())},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeFiles(t, map[string][]byte{"docs.jsonl": tt.content})
			got := loadString(t, Source{Path: filepath.Join(dir, "docs.jsonl"), Format: "jsonl"})
			if got != want {
				t.Errorf("got %q\nwant %q", got, want)
			}
		})
	}
}

// A multi-stream gzip file (concatenated members, as some tools write) reads as one.
func TestLoadTokensGzipMultistream(t *testing.T) {
	content := append(gzipData(t, c4Lines(t, "one")), gzipData(t, c4Lines(t, "two"))...)
	dir := writeFiles(t, map[string][]byte{"c4-a.json.gz": content})
	if got := loadString(t, Source{Path: dir, Format: "c4"}); got != "one\ntwo" {
		t.Errorf("got %q, want %q", got, "one\ntwo")
	}
}

func TestLoadTokensJSONMaxBytes(t *testing.T) {
	var docs []string
	for i := range 12 {
		d := fmt.Sprintf("doc %02d ", i)
		docs = append(docs, d+strings.Repeat(string(rune('a'+i)), 99-len(d))+".")
	}
	dir := writeFiles(t, map[string][]byte{
		"c4-a.json.gz":  gzipData(t, c4Lines(t, docs[:5]...)),
		"c4-b.json.zst": zstdData(t, c4Lines(t, docs[5:]...)),
	})
	full := loadString(t, Source{Path: dir, Format: "c4", Seed: 2})
	if want := 12*100 + 11; len(full) != want {
		t.Fatalf("unlimited read has %d bytes, want %d", len(full), want)
	}
	for _, tt := range []struct {
		maxBytes int64
		wantLen  int
		wantDocs int
	}{{1, 1, 1}, {100, 100, 1}, {101, 100, 1}, {102, 102, 2}, {650, 650, 7}, {1211, 1211, 12}, {5000, 1211, 12}} {
		var log bytes.Buffer
		got := loadString(t, Source{Path: dir, Format: "c4", MaxBytes: tt.maxBytes, Seed: 2, Log: &log})
		cut := tt.wantLen < len(full)
		if l := log.String(); cut != (l != "") || cut && !strings.Contains(l, fmt.Sprintf("data: read %d bytes of text in %s, from ", tt.wantLen, dir)) ||
			cut && !strings.Contains(l, fmt.Sprintf("(data.max_bytes = %d; set 0 for all)", tt.maxBytes)) {
			t.Errorf("MaxBytes %d: log %q", tt.maxBytes, l)
		}
		if len(got) != tt.wantLen || !strings.HasPrefix(full, got) {
			t.Errorf("MaxBytes %d: read %d bytes (prefix of the full read: %v), want %d", tt.maxBytes, len(got), strings.HasPrefix(full, got), tt.wantLen)
		}
		if n := len(docOrder(t, got, docs, true)); n != tt.wantDocs {
			t.Errorf("MaxBytes %d: read %d documents, want %d", tt.maxBytes, n, tt.wantDocs)
		}
	}
}

func TestLoadTokensDefaultInclude(t *testing.T) {
	line := c4Lines(t, "doc")
	dir := writeFiles(t, map[string][]byte{
		"a.go":                                  []byte("go"),
		"b.txt":                                 []byte("txt"),
		"c.md":                                  []byte("md"),
		"d.txt.gz":                              gzipData(t, []byte("not by default")),
		"a.jsonl":                               c4Lines(t, "jsonl"),
		"b.jsonl.gz":                            gzipData(t, c4Lines(t, "jsonl.gz")),
		"c.jsonl.zst":                           zstdData(t, c4Lines(t, "jsonl.zst")),
		"c4-validation.00000-of-00008.json.gz":  gzipData(t, c4Lines(t, "c4 gz")),
		"c4-validation.00001-of-00008.json":     c4Lines(t, "c4 json"),
		"c4-validation.00002-of-00008.json.zst": zstdData(t, c4Lines(t, "c4 zst")),
		"c4-validation.00003-of-00008.json.gz.part": line[:len(line)/2], // an unfinished download
		"other.json":                          line,
		"sub/c4-train.00000-of-01024.json.gz": gzipData(t, c4Lines(t, "c4 sub")),
		"shard-000000.tokens.tmp":             []byte("unfinished shard"),
	})
	for _, tt := range []struct {
		format string
		want   []string
	}{
		{"text", []string{"go", "txt", "md"}},
		{"jsonl", []string{"jsonl", "jsonl.gz", "jsonl.zst"}},
		{"c4", []string{"c4 gz", "c4 json", "c4 zst", "c4 sub"}},
	} {
		t.Run(tt.format, func(t *testing.T) {
			docs, err := ReadDocuments(Source{Path: dir, Format: tt.format}, 0)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range docs {
				got = append(got, string(d))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("read %q, want %q", got, tt.want)
			}
		})
	}
	if got := DefaultInclude("tokens"); !slices.Equal(got, []string{"*.tokens"}) {
		t.Errorf("DefaultInclude(tokens) = %q", got)
	}
}

func TestReadDocuments(t *testing.T) {
	var docs []string
	for i := range 10 {
		docs = append(docs, fmt.Sprintf("document %d", i))
	}
	dir := writeFiles(t, map[string][]byte{
		"c4-validation.00000-of-00002.json.gz": gzipData(t, c4Lines(t, docs[:4]...)),
		"c4-validation.00001-of-00002.json.gz": gzipData(t, append(c4Lines(t, docs[4:6]...), c4Lines(t, "", docs[6], docs[7], docs[8], docs[9])...)),
	})
	for _, tt := range []struct {
		max  int
		seed uint64
		want []string
	}{
		{3, 1, docs[:3]},
		{3, 99, docs[:3]}, // the seed does not change which documents eval sees
		{6, 1, docs[:6]},
		{7, 1, docs[:7]}, // the empty document is skipped, not counted
		{0, 1, docs},
		{-1, 1, docs},
		{100, 1, docs},
	} {
		got, err := ReadDocuments(Source{Path: dir, Format: "c4", Seed: tt.seed}, tt.max)
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, d := range got {
			s = append(s, string(d))
		}
		if !slices.Equal(s, tt.want) {
			t.Errorf("max %d seed %d: got %q, want %q", tt.max, tt.seed, s, tt.want)
		}
	}
	// Documents do not share storage: a long read keeps every one intact.
	got, _ := ReadDocuments(Source{Path: dir, Format: "c4"}, 0)
	got[0][0] = 'X'
	if string(got[1]) != docs[1] {
		t.Errorf("documents share storage")
	}
	// MaxBytes cuts as in LoadTokens: 10 + 1 + 10 + 1 + 3.
	got, err := ReadDocuments(Source{Path: dir, Format: "c4", MaxBytes: 25}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || string(got[2]) != "doc" {
		t.Errorf("MaxBytes 25: got %q, want the first two documents and %q", got, "doc")
	}
	if _, err := ReadDocuments(Source{Path: dir, Format: "tokens"}, 3); err == nil || !strings.Contains(err.Error(), `"tokens"`) {
		t.Errorf("ReadDocuments of format tokens: error %v, want one that names the format", err)
	}
}

func TestLoadTokensFormatErrors(t *testing.T) {
	good := c4Lines(t, "fine")
	gz := gzipData(t, bytes.Repeat(good, 200))
	badCRC := bytes.Clone(gz)
	badCRC[len(badCRC)-6] ^= 0xff // the CRC-32 in the trailer
	zs := zstdData(t, bytes.Repeat(good, 200))
	corruptZstd := bytes.Clone(zs)
	for i := 12; i < len(corruptZstd)-4; i++ {
		corruptZstd[i] ^= 0x5a
	}
	tests := []struct {
		name    string
		content []byte
		want    []string // substrings of the error, besides the file name
	}{
		{"invalid JSON", []byte(`{"text": "a"}` + "\n" + `{"text": "b"}` + "\n" + `{"text": "c"` + "\n"), []string{":3: ", "not valid JSON"}},
		{"trailing garbage", []byte(`{"text": "a"} x` + "\n"), []string{":1: ", "not valid JSON"}},
		{"no text", []byte(`{"text": "a"}` + "\n" + `{"url": "b"}` + "\n"), []string{":2: ", `no "text" field`}},
		{"text is a number", []byte(`{"text": 12}`), []string{":1: ", `"text" is a number, want a string`}},
		{"text is null", []byte("\n\n" + `{"text": null}`), []string{":3: ", `"text" is null`}},
		{"text is an object", []byte(`{"text": {"a": 1}}`), []string{":1: ", `"text" is an object`}},
		{"array line", []byte(`["text", "a"]`), []string{":1: ", "an array, not a JSON object"}},
		{"string line", []byte(`"text"`), []string{":1: ", "a string, not a JSON object"}},
		{"plain text line", []byte("just some words\n"), []string{":1: ", "not valid JSON", "invalid character"}},
		{"gzip truncated", gz[:len(gz)/2], []string{"gzip", "unexpected EOF"}},
		{"gzip bad checksum", badCRC, []string{"gzip", "checksum"}},
		{"gzip header only", gzipMagic, []string{"gzip"}},
		{"zstd truncated", zs[:len(zs)/2], []string{"zstd"}},
		{"zstd corrupt", corruptZstd, []string{"zstd"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeFiles(t, map[string][]byte{"c4-x.json.gz": tt.content})
			path := filepath.Join(dir, "c4-x.json.gz")
			toks, err := LoadTokens(Source{Path: dir, Format: "c4"}, ByteTokenizer{})
			if err == nil {
				t.Fatalf("no error; read %d tokens", len(toks))
			}
			for _, s := range append([]string{"data: ", path}, tt.want...) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if _, err := ReadDocuments(Source{Path: dir, Format: "jsonl", Include: []string{"*"}}, 0); err == nil {
				t.Errorf("ReadDocuments: no error")
			}
		})
	}
}

// jsonTextOracle is what encoding/json makes of a line: the string value of its "text" key,
// decoding the line as an object (last duplicate wins).
func jsonTextOracle(line []byte) (string, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(line, &m) != nil || m == nil {
		return "", false
	}
	var s string
	if raw, ok := m["text"]; !ok || !bytes.HasPrefix(raw, []byte(`"`)) || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

var jsonTextCases = []struct {
	line string
	want string // "" when an error is wanted
	err  string // substring of the error
}{
	{`{"text":"hello"}`, "hello", ""},
	{` {"text" : "spaced" , "url":"x"} ` + "\t", "spaced", ""},
	{`{"text": "a\"b\\c\/d\n\t\u00e9\ud83d\ude00 \u003cb\u003e"}`, "a\"b\\c/d\n\té😀 <b>", ""},
	{`{"url":"x","text":"first","text":"second"}`, "second", ""},
	{`{"meta":{"text":"nested"},"list":[1,-2.5e+3,true,false,null,{"text":1}],"text":"top"}`, "top", ""},
	{`{"te\u0078t":"escaped key"}`, "escaped key", ""},
	{"{\"text\":\"bad \xff utf8\"}", "bad \uFFFD utf8", ""},
	{`{"text":"lone \ud800 surrogate"}`, "lone \uFFFD surrogate", ""},
	{`{"text":"\ud83d\u0041"}`, "\uFFFDA", ""},
	{`{"text":"\udc00x\ud83d"}`, "\uFFFDx\uFFFD", ""},
	{"{\"text\":\"a\xffb\\nc\xc3\"}", "a\uFFFDb\nc\uFFFD", ""},
	{`{"text":"x","n":0.5,"e":1E9,"z":-0}`, "x", ""},
	{`{}`, "", `no "text" field`},
	{`{"Text":"x"}`, "", `no "text" field`},
	{`{"meta":{"text":"nested"}}`, "", `no "text" field`},
	{`{"text":1}`, "", `"text" is a number`},
	{`{"text":true}`, "", `"text" is a boolean`},
	{`{"text":null}`, "", `"text" is null`},
	{`{"text":["a"]}`, "", `"text" is an array`},
	{`["text"]`, "", "an array, not a JSON object"},
	{`null`, "", "null, not a JSON object"},
	{`{"text":"x"`, "", "not valid JSON"},
	{`{"text":"x",}`, "", "not valid JSON"},
	{`{"text":"x"}}`, "", "not valid JSON"},
	{`{"text":"x" "url":"y"}`, "", "not valid JSON"},
	{"{\"text\":\"raw\ttab\"}", "", "not valid JSON"},
	{`{"text":"\x"}`, "", "not valid JSON"},
	{`{"text":"\u12"}`, "", "not valid JSON"},
	{`{"text":"x","n":01}`, "", "not valid JSON"},
	{`{"text":"x","n":1.}`, "", "not valid JSON"},
	{`{"text":"x","n":-}`, "", "not valid JSON"},
	{`{"text":"x","n":1e}`, "", "not valid JSON"},
	{`{"text":"x","b":tru}`, "", "not valid JSON"},
	{`{"text":"x","a":[1,]}`, "", "not valid JSON"},
	{`{text:"x"}`, "", "not valid JSON"},
	{`{"text":'x'}`, "", "not valid JSON"},
}

func TestJSONText(t *testing.T) {
	for _, tt := range jsonTextCases {
		got, err := jsonText([]byte(tt.line), testKey)
		switch {
		case tt.err == "" && err != nil:
			t.Errorf("%s: %v", tt.line, err)
		case tt.err == "" && string(got) != tt.want:
			t.Errorf("%s: got %q, want %q", tt.line, got, tt.want)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%s: error %v, want one mentioning %q", tt.line, err, tt.err)
		}
		if want, ok := jsonTextOracle([]byte(tt.line)); ok != (err == nil) || ok && want != string(got) {
			t.Errorf("%s: encoding/json gives %q (ok %v), jsonText %q (error %v)", tt.line, want, ok, got, err)
		}
	}
}

// TestJSONTextKey reads other keys than "text" (data.text_key), nested ones through a
// dotted path, and checks the errors name the key.
func TestJSONTextKey(t *testing.T) {
	for _, tt := range []struct {
		key, line, want, err string
	}{
		{"content", `{"text": "no", "content": "The Stack"}`, "The Stack", ""},
		{"content", `{"con\u0074ent": "escaped key"}`, "escaped key", ""},
		{"content", `{"content": "first", "content": "last"}`, "last", ""},
		{"a<b", `{"a<b": "html in the key"}`, "html in the key", ""},
		{"a<b", `{"a\u003cb": "escaped html in the key"}`, "escaped html in the key", ""},
		{"meta.body", `{"text": "no", "meta": {"lang": "en", "body": "nested \"body\""}}`, `nested "body"`, ""},
		{"meta.body", `{"meta": {"body": "first"}, "meta": {"body": "last"}}`, "last", ""},
		{"a.b.c", `{"a": {"b": {"c": "deep", "x": [1, {"c": "no"}]}}}`, "deep", ""},
		{"meta.body", `{"body": "no", "meta": {"text": "no"}}`, "", `the object has no "meta.body" field: "meta" has no "body"`},
		{"meta.body", `{"meta": "flat"}`, "", `"meta" is a string, want an object holding "body"`},
		{"meta.body", `{"meta": {"body": 3}}`, "", `"meta.body" is a number, want a string`},
		{"meta.body", `{"text": "x"}`, "", `the object has no "meta.body" field (data.text_key = "meta.body": each line is {"meta": {"body": "...", ...}, ...})`},
		{"content", `{"text": "x"}`, "", `the object has no "content" field (data.text_key = "content": each line is {"content": "...", ...})`},
		{"content", `[1]`, "", `an array, not a JSON object (data.text_key = "content"`},
		{"content", `{"content": "x"`, "", "not valid JSON"},
		{"meta.body", `{"meta": {"body": "x"}`, "", "not valid JSON"},
	} {
		got, err := jsonText([]byte(tt.line), mustTextKey(tt.key))
		switch {
		case tt.err == "" && err != nil:
			t.Errorf("%s in %s: %v", tt.key, tt.line, err)
		case tt.err == "" && string(got) != tt.want:
			t.Errorf("%s in %s: got %q, want %q", tt.key, tt.line, got, tt.want)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%s in %s: error %v, want one saying %q", tt.key, tt.line, err, tt.err)
		}
	}
	for _, key := range []string{"a..b", ".text", "text.", "."} {
		if _, err := newTextKey(key); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("data.text_key = %q", key)) {
			t.Errorf("newTextKey(%q): error %v, want one naming the key", key, err)
		}
	}
	if k, err := newTextKey(""); err != nil || k.path != "text" {
		t.Errorf(`newTextKey("") = %+v, %v; want "text"`, k, err)
	}
}

// FuzzJSONText checks the scanner against encoding/json: it accepts exactly the lines that
// encoding/json decodes as an object with a string "text", and returns the same text. go test
// runs the seeds; go test -fuzz FuzzJSONText ./data explores.
func FuzzJSONText(f *testing.F) {
	for _, tt := range jsonTextCases {
		f.Add([]byte(tt.line))
	}
	f.Add(c4Lines(f, formatDocs...))
	f.Fuzz(func(t *testing.T, line []byte) {
		got, err := jsonText(line, testKey)
		want, ok := jsonTextOracle(line)
		if ok != (err == nil) || ok && want != string(got) {
			t.Errorf("%q: encoding/json gives %q (ok %v), jsonText %q (error %v)", line, want, ok, got, err)
		}
	})
}

// BenchmarkReadC4 measures reading C4-like lines (2 KB documents) from an uncompressed
// and a gzip-compressed file; SetBytes counts the JSON.
func BenchmarkReadC4(b *testing.B) {
	var docs []string
	for i := range 2000 {
		docs = append(docs, strings.Repeat(fmt.Sprintf("Sentence %d of a \"web\" page, café.\n", i), 50))
	}
	lines := c4Lines(b, docs...)
	for _, tt := range []struct {
		name    string
		content []byte
	}{{"json", lines}, {"json.gz", gzipData(b, lines)}} {
		b.Run(tt.name, func(b *testing.B) {
			dir := writeFiles(b, map[string][]byte{"c4-a." + tt.name: tt.content})
			b.SetBytes(int64(len(lines)))
			for b.Loop() {
				if _, err := LoadTokens(Source{Path: dir, Format: "c4"}, ByteTokenizer{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkJSONText compares the scanner with encoding/json on C4-like lines (2 KB of text
// with newlines and quotes to unescape); SetBytes counts the JSON.
func BenchmarkJSONText(b *testing.B) {
	var docs []string
	for i := range 200 {
		docs = append(docs, strings.Repeat(fmt.Sprintf("Sentence %d of a \"web\" page, café.\n", i), 50))
	}
	lines := bytes.Split(bytes.TrimSpace(c4Lines(b, docs...)), []byte("\n"))
	size := 0
	for _, l := range lines {
		size += len(l)
	}
	b.Run("scanner", func(b *testing.B) {
		b.SetBytes(int64(size))
		for b.Loop() {
			for _, l := range lines {
				if _, err := jsonText(l, testKey); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(size))
		for b.Loop() {
			for _, l := range lines {
				var obj struct {
					Text *string `json:"text"`
				}
				if err := json.Unmarshal(l, &obj); err != nil || obj.Text == nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// randomBytes returns n bytes of a fixed pseudo-random sequence without NUL bytes: like
// compressed or encrypted data, about 42% of them are in invalid UTF-8 sequences.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x>>24) | 1
	}
	return b
}

// TestNotText reads files that are not text, or not the text the format reads: each is an
// error naming the file, what was found and what to set or do instead.
func TestNotText(t *testing.T) {
	const long = 70000 // past the 64 KiB sample
	text := []byte("Plain text, as a user means it.\n")
	latin1 := bytes.Repeat([]byte("caf\xe9 cr\xe8me br\xfbl\xe9e\n"), 3) // Windows-1252: 4 of 18 bytes invalid
	tests := []struct {
		name    string
		format  string
		content []byte
		want    []string
	}{
		{"gzip as text", "text", gzipData(t, c4Lines(t, "doc")), []string{"is gzip-compressed", `data.format = "text" reads files as they are`, `data.format = "jsonl"`, `"c4"`, "compressed plain text is not read"}},
		{"zstd as text", "text", zstdData(t, c4Lines(t, "doc")), []string{"is zstd-compressed", `data.format = "jsonl"`}},
		{"gzip of one byte as text", "text", gzipMagic, []string{"is gzip-compressed"}},
		{"xz", "text", append(bytes.Clone(xzMagic), randomBytes(100)...), []string{"an xz-compressed file", `data.format = "text" does not read`, "; unpack it"}},
		{"xz as jsonl", "jsonl", append(bytes.Clone(xzMagic), randomBytes(100)...), []string{"an xz-compressed file", `data.format = "jsonl" does not read`, "recompress it with gzip or zstd"}},
		{"bzip2", "c4", append([]byte("BZh91AY&SY"), randomBytes(100)...), []string{"a bzip2-compressed file"}},
		{"empty bzip2", "text", []byte("BZh9\x17rE8P\x90\x00\x00\x00\x00"), []string{"a bzip2-compressed file"}},
		{"zip", "text", append([]byte("PK\x03\x04"), randomBytes(100)...), []string{"a zip archive"}},
		{"token shard as text", "text", []byte(shardMagic + "\x02\x00\x00\x00"), []string{"is a token shard", `set data.format = "tokens"`}},
		{"token shard as jsonl", "jsonl", []byte(shardMagic + "\x02\x00\x00\x00"), []string{"is a token shard", `set data.format = "tokens"`}},
		{"NUL", "text", []byte("hello\x00world"), []string{"NUL byte at offset 5", "not text", `data.format = "text" reads UTF-8 text`, "data.include"}},
		{"NUL after the sample", "text", append(bytes.Repeat([]byte("a"), long), 0), []string{fmt.Sprintf("NUL byte at offset %d", long)}},
		{"UTF-16", "text", []byte("\xff\xfeh\x00i\x00"), []string{"NUL byte at offset 3", "UTF-16 byte-order mark", "iconv"}},
		{"random bytes", "text", randomBytes(long), []string{"% of the first 64 KiB is not UTF-8", "first invalid byte at offset", "more than 30% is refused", `data.format = "text" reads UTF-8 text`}},
		{"short random bytes", "text", randomBytes(1000), []string{"% of its 1000 bytes is not UTF-8"}},
		{"31% invalid", "text", append(bytes.Repeat([]byte{0xff}, 31), bytes.Repeat([]byte("a"), 69)...), []string{"31% of its 100 bytes is not UTF-8", "first invalid byte at offset 0"}},
		{"random bytes as jsonl", "jsonl", randomBytes(long), []string{"% of the first 64 KiB is not UTF-8", `data.format = "jsonl" reads JSON lines of UTF-8 text`}},
		{"gzip of random bytes as c4", "c4", gzipData(t, randomBytes(long)), []string{"% of the first 64 KiB is not UTF-8", `data.format = "c4"`}},
		{"NUL in jsonl", "jsonl", []byte(`{"text": "a"}` + "\x00\n"), []string{"NUL byte at offset 13", `data.format = "jsonl"`}},
		{"zstd of a binary file as jsonl", "jsonl", zstdData(t, []byte("\x7fELF\x02\x01\x01\x00\x00")), []string{"NUL byte at offset 7"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeFiles(t, map[string][]byte{"f": tt.content})
			path := filepath.Join(dir, "f")
			var log bytes.Buffer
			toks, err := LoadTokens(Source{Path: path, Format: tt.format, Log: &log}, ByteTokenizer{})
			if err == nil {
				t.Fatalf("no error; read %d tokens", len(toks))
			}
			for _, s := range append([]string{"data: ", path}, tt.want...) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if _, err2 := ReadDocuments(Source{Path: path, Format: tt.format}, 0); err2 == nil || err2.Error() != err.Error() {
				t.Errorf("ReadDocuments: error %v, want LoadTokens's", err2)
			}
			if _, err2 := WriteShards(context.Background(), Source{Path: path, Format: tt.format}, ByteTokenizer{}, ShardOptions{Out: filepath.Join(dir, "shards")}); err2 == nil || err2.Error() != err.Error() {
				t.Errorf("WriteShards: error %v, want LoadTokens's", err2)
			}
			if m, _ := filepath.Glob(filepath.Join(dir, "shards", "*")); len(m) > 0 {
				t.Errorf("WriteShards left %q", m)
			}
		})
	}
	// Text, Windows-1252 text and text that starts as bzip2 does are read.
	dir := writeFiles(t, map[string][]byte{"a.txt": text, "b.txt": latin1, "c.txt": []byte("BZh9 is not a bzip2 header here.\n")})
	if _, err := LoadTokens(Source{Path: dir}, ByteTokenizer{}); err != nil {
		t.Errorf("text, Latin-1 and BZh9: %v", err)
	}
}

// TestSomeInvalidUTF8 reads text with invalid UTF-8 below the refusal threshold: it is read
// (text as it is, jsonl's strings with U+FFFD) and each file is warned about on Source.Log.
func TestSomeInvalidUTF8(t *testing.T) {
	latin1 := bytes.Repeat([]byte("caf\xe9 cr\xe8me br\xfbl\xe9e\n"), 3)
	thirty := append(bytes.Repeat([]byte{0xff}, 30), bytes.Repeat([]byte("a"), 70)...)
	// Two-byte runes from offset 1 put the 64 KiB sample's end inside a rune, which is not
	// invalid: only the byte after the valid text is.
	lateBad := append(append([]byte("a"), bytes.Repeat([]byte("é"), 40000)...), 0xff)
	tests := []struct {
		name    string
		format  string
		content []byte
		read    string // the document read
		want    []string
	}{
		{"Windows-1252", "text", latin1, string(latin1), []string{"22.2% of its 54 bytes is not UTF-8", "first at offset 3", "read as it is", "up to 30% is", "Latin-1"}},
		{"30% invalid", "text", thirty, string(thirty), []string{"30.0% of its 100 bytes is not UTF-8", "first at offset 0"}},
		{"after the sample", "text", lateBad, string(lateBad), []string{"invalid UTF-8 at offset 80001", "read as it is"}},
		{"in a JSON string", "jsonl", []byte("{\"text\": \"caf\xe9\"}\n"), "caf\uFFFD", []string{"5.9% of its 17 bytes is not UTF-8", "first at offset 13", "U+FFFD"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeFiles(t, map[string][]byte{"f": tt.content})
			path := filepath.Join(dir, "f")
			var log bytes.Buffer
			docs, err := ReadDocuments(Source{Path: path, Format: tt.format, Log: &log}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(docs) != 1 || string(docs[0]) != tt.read {
				t.Errorf("read %q, want %q", docs, tt.read)
			}
			for _, s := range append([]string{"data: warning: " + path + ": "}, tt.want...) {
				if !strings.Contains(log.String(), s) {
					t.Errorf("log %q does not mention %q", log.String(), s)
				}
			}
		})
	}
	// Many such files: the first maxWarnings are named, the rest counted.
	files := map[string][]byte{"ok.txt": []byte("fine\n")}
	for i := range 5 {
		files[fmt.Sprintf("latin%d.txt", i)] = latin1
	}
	dir := writeFiles(t, files)
	var log bytes.Buffer
	if _, err := LoadTokens(Source{Path: dir, Log: &log}, ByteTokenizer{}); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(log.String(), "is not UTF-8"); n != maxWarnings {
		t.Errorf("%d files warned about, want %d:\n%s", n, maxWarnings, log.String())
	}
	if !strings.Contains(log.String(), "data: warning: 2 more like it in "+dir+"\n") {
		t.Errorf("log does not count the 2 files left out:\n%s", log.String())
	}
	if strings.Contains(log.String(), "ok.txt") {
		t.Errorf("log names a valid file:\n%s", log.String())
	}
}

// BenchmarkCheckText checks 8 MiB of Go source as a text file is checked (NUL bytes and
// UTF-8 over all of it).
func BenchmarkCheckText(b *testing.B) {
	root, err := ExpandPath("$GOROOT/src")
	if err != nil {
		b.Skip(err)
	}
	docs, err := ReadDocuments(Source{Path: root, Include: []string{"*.go"}, MaxBytes: 8 << 20}, 0)
	if err != nil {
		b.Fatal(err)
	}
	text := bytes.Join(docs, []byte{'\n'})
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if w, err := checkText("x", "text", text, false); w != "" || err != nil {
			b.Fatal(w, err)
		}
	}
}

// TestDecompressionBombStops: a small gzip or zstd file that expands to endless blank lines
// (which no line-length limit stops) is refused once it expands past MaxExpansion times its
// size, naming the file; an ordinary compressed file of the same size is read.
func TestDecompressionBombStops(t *testing.T) {
	defer func(e, f int64) { MaxExpansion, MaxExpansionFloor = e, f }(MaxExpansion, MaxExpansionFloor)
	MaxExpansion, MaxExpansionFloor = 100, 1<<20
	dir := t.TempDir()
	blank := bytes.Repeat([]byte("\n"), 8<<20) // 8 MiB of blank lines: compresses over 1000×
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(blank)
	zw.Close()
	enc, _ := zstd.NewWriter(nil)
	zs := enc.EncodeAll(blank, nil)
	enc.Close()
	for name, b := range map[string][]byte{"bomb.jsonl.gz": gz.Bytes(), "bomb.jsonl.zst": zs} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := ReadDocuments(Source{Path: path, Format: "jsonl"}, 10)
		if err == nil || !strings.Contains(err.Error(), "decompression bomb") || !strings.Contains(err.Error(), name) {
			t.Errorf("%s (%d bytes): %v, want a decompression bomb refused by name", name, len(b), err)
		}
	}
	var ok bytes.Buffer
	zw = gzip.NewWriter(&ok)
	for i := range 20000 {
		fmt.Fprintf(zw, "{\"text\": \"document %d of an ordinary corpus\"}\n", i)
	}
	zw.Close()
	path := filepath.Join(dir, "ok.jsonl.gz")
	if err := os.WriteFile(path, ok.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if docs, err := ReadDocuments(Source{Path: path, Format: "jsonl"}, 30000); err != nil || len(docs) != 20000 {
		t.Errorf("an ordinary gzip file: %d documents, %v", len(docs), err)
	}
}

// testKey is the default text key, "text".
var testKey = mustTextKey("text")

// mustTextKey returns newTextKey(key) and panics on an error.
func mustTextKey(key string) *textKey {
	k, err := newTextKey(key)
	if err != nil {
		panic(err)
	}
	return k
}
