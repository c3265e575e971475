package data

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeTree creates files (slash-separated relative path -> content) under a new temporary
// directory and returns it.
func writeTree(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// docOrder parses stream as documents from docs joined by DocSeparator and returns them in
// stream order; it fails the test if stream is not such a join (a doc need not be whole
// only at the end, when cut is set).
func docOrder(t *testing.T, stream string, docs []string, cut bool) []string {
	t.Helper()
	var order []string
	for pos := 0; pos < len(stream); {
		if len(order) > 0 {
			if stream[pos] != DocSeparator {
				t.Fatalf("no separator at byte %d of %q", pos, stream)
			}
			pos++
		}
		found := false
		for _, d := range docs {
			rest := stream[pos:]
			if strings.HasPrefix(rest, d) || (cut && len(rest) < len(d) && strings.HasPrefix(d, rest)) {
				order = append(order, d)
				pos += min(len(d), len(rest))
				found = true
				break
			}
		}
		if !found {
			t.Fatalf("unexpected text at byte %d of %q", pos, stream)
		}
	}
	return order
}

func loadString(t *testing.T, src Source) string {
	t.Helper()
	toks, err := LoadTokens(src, ByteTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	return string(ByteTokenizer{}.Decode(toks))
}

func TestLoadTokensSelection(t *testing.T) {
	const (
		x     = "package x // x\n"
		z     = "package z // z\n"
		noeol = "package noeol" // no final newline: the separator keeps it off the next file
		notes = "notes on things\n"
	)
	dir := writeTree(t, map[string]string{
		"a/x.go":              x,
		"a/notes.txt":         notes,
		"b/c/z.go":            z,
		"noeol.go":            noeol,
		"empty.go":            "",
		"testdata/skip.go":    "package skip1\n",
		"a/testdata/skip.go":  "package skip2\n",
		".git/hidden.go":      "package skip3\n",
		"_old/underscore.go":  "package skip4\n",
		"b/c/readme.md":       "# readme\n",
		"b/c/z.go.orig":       "package skip5\n",
		"b/c/deep/er/deep.go": "package deep\n",
	})
	deep := "package deep\n"
	readme := "# readme\n"
	tests := []struct {
		name    string
		path    string
		include []string
		want    []string
	}{
		{"default include", dir, nil, []string{x, z, noeol, deep, notes, readme}},
		{"go only", dir, []string{"*.go"}, []string{x, z, noeol, deep}},
		{"txt only", dir, []string{"*.txt"}, []string{notes}},
		{"two patterns", dir, []string{"*.go", "*.txt"}, []string{x, z, noeol, deep, notes}},
		{"name pattern", dir, []string{"[xz].go"}, []string{x, z}},
		{"file named directly", filepath.Join(dir, "a", "notes.txt"), nil, []string{notes}},
		{"testdata as root", filepath.Join(dir, "testdata"), nil, []string{"package skip1\n"}},
		{"glob of files", filepath.Join(dir, "a", "*.go"), nil, []string{x}},
		{"glob of dirs", filepath.Join(dir, "[ab]"), nil, []string{x, z, deep, notes, readme}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := loadString(t, Source{Path: tt.path, Include: tt.include, Seed: 7})
			order := docOrder(t, got, tt.want, false)
			if len(order) != len(tt.want) {
				t.Fatalf("read %d documents %q, want %d", len(order), order, len(tt.want))
			}
			for _, w := range tt.want {
				if !slices.Contains(order, w) {
					t.Errorf("missing %q in %q", w, got)
				}
			}
		})
	}
}

// fixedDocs writes n files of 100 bytes each, every one different, and returns the directory
// and the contents.
func fixedDocs(t *testing.T, n int) (string, []string) {
	files := map[string]string{}
	var docs []string
	for i := range n {
		d := fmt.Sprintf("// file %02d ", i)
		d += strings.Repeat(string(rune('a'+i%26)), 99-len(d)) + "\n"
		files[fmt.Sprintf("d%d/f%02d.go", i%3, i)] = d
		docs = append(docs, d)
	}
	return writeTree(t, files), docs
}

func TestLoadTokensMaxBytes(t *testing.T) {
	dir, docs := fixedDocs(t, 20)
	full := loadString(t, Source{Path: dir, Seed: 1})
	if want := 20*100 + 19; len(full) != want {
		t.Fatalf("unlimited read has %d bytes, want %d (20 files of 100 and 19 separators)", len(full), want)
	}
	tests := []struct {
		maxBytes  int64
		wantLen   int
		wantDocs  int
		wantFiles int // files read according to the log; 0: no log line
	}{
		{1, 1, 1, 1},
		{100, 100, 1, 1},
		{101, 100, 1, 1}, // the separator alone would fill the budget: stop before it
		{102, 102, 2, 2},
		{350, 350, 4, 4},
		{2019, 2019, 20, 0},
		{1 << 20, 2019, 20, 0},
		{0, 2019, 20, 0},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.maxBytes), func(t *testing.T) {
			var log bytes.Buffer
			got := loadString(t, Source{Path: dir, MaxBytes: tt.maxBytes, Seed: 1, Log: &log})
			if len(got) != tt.wantLen {
				t.Errorf("read %d bytes, want %d", len(got), tt.wantLen)
			}
			if !strings.HasPrefix(full, got) {
				t.Errorf("a truncated read is not a prefix of the full read with the same seed")
			}
			if n := len(docOrder(t, got, docs, true)); n != tt.wantDocs {
				t.Errorf("read from %d files, want %d", n, tt.wantDocs)
			}
			want := ""
			if tt.wantFiles > 0 {
				want = fmt.Sprintf("data: read %d of 2,019 bytes of text in %s, from %d of 20 files (data.max_bytes = %d; set 0 for all)\n",
					tt.wantLen, dir, tt.wantFiles, tt.maxBytes)
			}
			if log.String() != want {
				t.Errorf("log %q, want %q", log.String(), want)
			}
		})
	}
}

// TestTextDirectory reads a directory of .txt and .md files with no include patterns.
func TestTextDirectory(t *testing.T) {
	dir := writeTree(t, map[string]string{"a.txt": "alpha\n", "b.md": "# beta\n", "sub/c.txt": "gamma\n", "d.pdf": "%PDF-1.4"})
	got := loadString(t, Source{Path: dir, Format: "text"})
	order := docOrder(t, got, []string{"alpha\n", "# beta\n", "gamma\n"}, false)
	if len(order) != 3 {
		t.Errorf("read %q, want the three .txt and .md files", order)
	}
}

// TestGOROOTIsText walks the default corpus, the Go tree, as text: no file in it is
// refused or warned about.
func TestGOROOTIsText(t *testing.T) {
	if testing.Short() {
		t.Skip("reads all of $GOROOT/src")
	}
	var log bytes.Buffer
	w, err := newDocWalk(Source{Path: goSrc(t), Log: &log}, false)
	if err != nil {
		t.Fatal(err)
	}
	var text int64
	docs, err := w.each(func(d []byte) error { text += int64(len(d)); return nil })
	w.flushLog()
	if err != nil {
		t.Fatal(err)
	}
	if log.Len() > 0 {
		t.Errorf("reading the Go tree logs:\n%s", log.String())
	}
	if docs < 1000 || text < 10<<20 {
		t.Errorf("the Go tree has %d documents, %d bytes: want thousands, tens of MB", docs, text)
	}
}

func TestLoadTokensSeed(t *testing.T) {
	dir, docs := fixedDocs(t, 20)
	load := func(seed uint64) []string {
		return docOrder(t, loadString(t, Source{Path: dir, MaxBytes: 350, Seed: seed}), docs, true)
	}
	first := map[string]bool{}
	sets := map[string]bool{}
	for seed := range uint64(8) {
		a, b := load(seed), load(seed)
		if !slices.Equal(a, b) {
			t.Fatalf("seed %d: two reads differ: %q vs %q", seed, a, b)
		}
		first[a[0]] = true
		sorted := slices.Sorted(slices.Values(a))
		sets[strings.Join(sorted, "|")] = true
	}
	if len(first) < 4 || len(sets) < 6 {
		t.Errorf("8 seeds started from %d different files and chose %d different file sets; want seeds to pick different files", len(first), len(sets))
	}
	// No limit: every seed reads every file, in its own order.
	all := docOrder(t, loadString(t, Source{Path: dir, Seed: 3}), docs, false)
	if len(all) != 20 || slices.Equal(all, docs) {
		t.Errorf("seed 3 read %d files in sorted order %v; want all 20, shuffled", len(all), slices.Equal(all, docs))
	}
}

func TestLoadTokensErrors(t *testing.T) {
	empty := t.TempDir()
	txtOnly := writeTree(t, map[string]string{"a.txt": "text\n", "testdata/t.go": "package t\n"})
	emptyFiles := writeTree(t, map[string]string{"a.go": "", "b/c.go": ""})
	good := writeTree(t, map[string]string{"a.go": "package a\n"})
	missing := filepath.Join(empty, "nope")
	tests := []struct {
		name string
		src  Source
		tok  Tokenizer
		want []string
	}{
		{"empty dir", Source{Path: empty}, ByteTokenizer{}, []string{empty, `"*.go"`, "no file matches"}},
		{"no match", Source{Path: txtOnly, Include: []string{"*.go", "*.md"}}, ByteTokenizer{}, []string{txtOnly, `"*.go"`, `"*.md"`}},
		{"all empty", Source{Path: emptyFiles}, ByteTokenizer{}, []string{emptyFiles, "2 files", "empty"}},
		{"missing path", Source{Path: missing}, ByteTokenizer{}, []string{missing, "no such file"}},
		{"glob matches nothing", Source{Path: filepath.Join(empty, "*.txt")}, ByteTokenizer{}, []string{filepath.Join(empty, "*.txt"), "glob"}},
		{"empty path", Source{}, ByteTokenizer{}, []string{"path is empty"}},
		{"bad include", Source{Path: good, Include: []string{"[*.go"}}, ByteTokenizer{}, []string{`"[*.go"`, "syntax"}},
		{"jsonl default include", Source{Path: good, Format: "jsonl"}, ByteTokenizer{}, []string{good, `"*.jsonl"`, `"*.jsonl.gz"`, "no file matches"}},
		{"unknown format", Source{Path: good, Format: "arrow"}, ByteTokenizer{}, []string{`"arrow"`, "text", "c4", "parquet"}},
		{"negative max bytes", Source{Path: good, MaxBytes: -1}, ByteTokenizer{}, []string{"MaxBytes = -1"}},
		{"nil tokenizer", Source{Path: good}, nil, []string{"nil Tokenizer"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			toks, err := LoadTokens(tt.src, tt.tok)
			if err == nil {
				t.Fatalf("no error; got %d tokens", len(toks))
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %s", err, s)
				}
			}
			if !strings.HasPrefix(err.Error(), "data: ") {
				t.Errorf("error %q lacks the data: prefix", err)
			}
		})
	}
}

// upperTokenizer has no AppendEncode, so LoadTokens takes the generic Encode path.
type upperTokenizer struct{}

func (upperTokenizer) Encode(text []byte) []int32 {
	ids := make([]int32, len(text))
	for i, b := range text {
		ids[i] = int32(b) + 1000
	}
	return ids
}
func (upperTokenizer) Decode(ids []int32) []byte { panic("unused") }
func (upperTokenizer) VocabSize() int            { return 1256 }
func (upperTokenizer) Name() string              { return "upper" }

func TestLoadTokensOtherTokenizer(t *testing.T) {
	dir := writeTree(t, map[string]string{"a.go": "ab", "b.go": "cd"})
	got, err := LoadTokens(Source{Path: dir}, upperTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	want1 := []int32{1000 + 'a', 1000 + 'b', 1000 + '\n', 1000 + 'c', 1000 + 'd'}
	want2 := []int32{1000 + 'c', 1000 + 'd', 1000 + '\n', 1000 + 'a', 1000 + 'b'}
	if !slices.Equal(got, want1) && !slices.Equal(got, want2) {
		t.Errorf("got %v, want the two documents encoded with the encoded separator between", got)
	}
}

func goSrc(t testing.TB) string {
	t.Helper()
	p, err := ExpandPath("$GOROOT/src")
	if err != nil {
		t.Skip(err)
	}
	return p
}

func TestLoadTokensGOROOT(t *testing.T) {
	src := Source{Path: goSrc(t), MaxBytes: 1 << 20, Seed: 1337}
	toks, err := LoadTokens(src, ByteTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(toks); n < 1<<20-1 || n > 1<<20 {
		t.Errorf("got %d tokens, want 1 MiB (%d) or one less", n, 1<<20)
	}
	text := string(ByteTokenizer{}.Decode(toks))
	if c := strings.Count(text, "\npackage "); c < 10 {
		t.Errorf("1 MiB of Go source holds only %d package clauses", c)
	}
	again, err := LoadTokens(src, ByteTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(toks, again) {
		t.Error("two reads with the same seed differ")
	}
}

func BenchmarkLoadTokensGOROOT(b *testing.B) {
	src := Source{Path: goSrc(b), MaxBytes: 8 << 20, Seed: 1337}
	b.SetBytes(src.MaxBytes)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := LoadTokens(src, ByteTokenizer{}); err != nil {
			b.Fatal(err)
		}
	}
}
