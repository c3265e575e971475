package data

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDocStarts: a document starts at each boundary token, and a window that opens inside a
// document continues it from position 0.
func TestDocStarts(t *testing.T) {
	for _, c := range []struct {
		seq, want []int32
	}{
		{[]int32{5, 6, 7}, []int32{0, 0, 0}},
		{[]int32{0, 6, 7}, []int32{0, 0, 0}},
		{[]int32{5, 0, 7, 8, 0}, []int32{0, 1, 1, 1, 4}},
		{[]int32{0, 0, 0}, []int32{0, 1, 2}},
	} {
		got := make([]int32, len(c.seq))
		DocStarts(got, c.seq, 0)
		if !slices.Equal(got, c.want) {
			t.Errorf("DocStarts(%v) = %v, want %v", c.seq, got, c.want)
		}
	}
}

// TestLoadTokensBoundary: with a boundary token the documents are joined by it alone, and a
// document that holds it is refused with its path.
func TestLoadTokensBoundary(t *testing.T) {
	dir := writeTree(t, map[string]string{"a.txt": "one\ntwo", "b.txt": "three"})
	b := int32(0)
	toks, err := LoadTokens(Source{Path: dir, Boundary: &b}, ByteTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(ByteTokenizer{}.Decode(toks)), "\x00"); n != 1 || len(toks) != len("one\ntwo")+len("three")+1 {
		t.Errorf("stream %q: want the two documents joined by one NUL", ByteTokenizer{}.Decode(toks))
	}
	// jsonl can carry a NUL inside its text through a \u0000 escape
	bad := writeTree(t, map[string]string{"x.jsonl": `{"text": "a\u0000b"}` + "\n"})
	_, err = LoadTokens(Source{Path: bad, Format: "jsonl", Boundary: &b}, ByteTokenizer{})
	if err == nil || !strings.Contains(err.Error(), "document boundary") || !strings.Contains(err.Error(), bad) {
		t.Errorf("document holding the boundary: err = %v", err)
	}
	if bt, err := DocumentBoundary(ByteTokenizer{}); err != nil || bt != 0 {
		t.Errorf("DocumentBoundary(byte) = %d, %v; want 0", bt, err)
	}
}

// TestLoaderDocumentsResume: a packing loader yields document starts that match its inputs,
// a document longer than a window runs on into the next window, and a loader restored from
// any state yields bit-identical batches (inputs, targets and document starts).
func TestLoaderDocumentsResume(t *testing.T) {
	// documents of lengths 3, 40 (longer than a window), 1, 7, ... each starting with 0
	var stream []int32
	for i, n := range []int{3, 40, 1, 7, 12, 2, 30, 5} {
		stream = append(stream, 0)
		for j := 0; j < n; j++ {
			stream = append(stream, int32(100+i))
		}
	}
	const T, B = 16, 2
	mk := func() *Loader {
		l := mustLoader(t, stream, T, B, 7)
		l.SetBoundary(0)
		return l
	}
	a := mk()
	var states []LoaderState
	var batches []Batch
	for range 12 {
		states = append(states, a.State())
		batches = append(batches, a.Next())
	}
	sawContinued := false
	for _, bt := range batches {
		for r := 0; r < B; r++ {
			in, ds := bt.Inputs[r*T:(r+1)*T], bt.DocStart[r*T:(r+1)*T]
			for i := range in {
				s := ds[i]
				if s > int32(i) || (in[s] != 0 && s != 0) || slices.Contains(in[s+1:i+1], 0) {
					t.Fatalf("row %v: DocStart %v is not the last boundary at or before each token", in, ds)
				}
				if s == 0 && in[0] != 0 && i == T-1 {
					sawContinued = true // the whole window continues one document
				}
			}
		}
	}
	if !sawContinued {
		t.Error("no window continued a document from the previous window")
	}
	for k, st := range states {
		b := mk()
		if err := b.Restore(st); err != nil {
			t.Fatal(err)
		}
		for _, want := range batches[k:] {
			got := b.Next()
			if !slices.Equal(got.Inputs, want.Inputs) || !slices.Equal(got.Targets, want.Targets) || !slices.Equal(got.DocStart, want.DocStart) {
				t.Fatalf("resumed at %+v: batch differs", st)
			}
		}
	}
	if mustLoader(t, stream, T, B, 7).Next().DocStart != nil {
		t.Error("a loader without a boundary sets DocStart")
	}
}

// pairTokenizer encodes each byte b as the two tokens 2b+1 and 2b+2, so its DocSeparator
// is two tokens and 0 is free for a boundary.
type pairTokenizer struct{}

func (pairTokenizer) Encode(text []byte) []int32 {
	ids := make([]int32, 0, 2*len(text))
	for _, b := range text {
		ids = append(ids, 2*int32(b)+1, 2*int32(b)+2)
	}
	return ids
}
func (pairTokenizer) Decode(ids []int32) []byte { panic("unused") }
func (pairTokenizer) VocabSize() int            { return 513 }
func (pairTokenizer) Name() string              { return "pair" }

// silentTokenizer is the byte tokenizer with newlines dropped: its DocSeparator encodes to
// no tokens, and a document of newlines to none.
type silentTokenizer struct{ ByteTokenizer }

func (silentTokenizer) Encode(text []byte) []int32 {
	ids := make([]int32, 0, len(text))
	for _, b := range text {
		if b != '\n' {
			ids = append(ids, int32(b))
		}
	}
	return ids
}
func (silentTokenizer) Name() string { return "silent" }

// TestShardDocumentsMatchText: token shards written by WriteShards (distflash data
// tokenize), read with a document boundary, give bit for bit the stream the text they were
// written from gives, so the loader yields the same windows with the same document starts
// and its state carries over between the two: for separators of one, two and no tokens,
// one shard and several, and documents of no tokens.
func TestShardDocumentsMatchText(t *testing.T) {
	var lines []string
	for i := range 40 {
		text := strings.Repeat(fmt.Sprintf("doc %d says\n", i), 1+i*7%5)
		if i%9 == 4 {
			text = "\n" // no tokens with silentTokenizer
		}
		lines = append(lines, fmt.Sprintf("{\"text\": %q}", text))
	}
	files := map[string]string{}
	for f := range 4 {
		files[fmt.Sprintf("part-%d.jsonl", f)] = strings.Join(lines[f*10:(f+1)*10], "\n") + "\n"
	}
	dir := writeTree(t, files)
	boundary := int32(0)
	for _, tok := range []Tokenizer{ByteTokenizer{}, pairTokenizer{}, silentTokenizer{}} {
		for _, shardTokens := range []int64{0, 150} {
			t.Run(fmt.Sprintf("%s/shard-tokens-%d", tok.Name(), shardTokens), func(t *testing.T) {
				src := Source{Path: dir, Format: "jsonl", Seed: 3, Boundary: &boundary}
				text, err := LoadTokens(src, tok)
				if err != nil {
					t.Fatal(err)
				}
				out := filepath.Join(t.TempDir(), "shards")
				st, err := WriteShards(context.Background(), src, tok, ShardOptions{Out: out, ShardTokens: shardTokens})
				if err != nil {
					t.Fatal(err)
				}
				if shardTokens > 0 && len(st.Shards) < 3 {
					t.Fatalf("%d shards: the test wants several", len(st.Shards))
				}
				shards, err := LoadTokens(Source{Path: out, Format: "tokens", Boundary: &boundary}, tok)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(shards, text) {
					t.Fatalf("shards give %d tokens, the text %d, or they differ", len(shards), len(text))
				}
				if n := strings.Count(string(ByteTokenizer{}.Decode(text)), "\x00"); tok.Name() != "pair" && n != 39 {
					t.Fatalf("%d boundaries in the stream, want 39", n)
				}
				const T, B, seed = 24, 3, 11
				mk := func(tokens []int32) *Loader {
					l := mustLoader(t, tokens, T, B, seed)
					l.SetBoundary(boundary)
					return l
				}
				a, b := mk(text), mk(shards)
				inner := false
				for k := range 3 * a.Windows() / B {
					x, y := a.Next(), b.Next()
					if !slices.Equal(x.Inputs, y.Inputs) || !slices.Equal(x.Targets, y.Targets) || !slices.Equal(x.DocStart, y.DocStart) {
						t.Fatalf("batch %d differs between text and shards", k)
					}
					inner = inner || slices.ContainsFunc(y.DocStart, func(s int32) bool { return s > 0 })
					if k == a.Windows()/2 {
						// A run on shards resumes from a run on the text's state, and back.
						c := mk(shards)
						if err := c.Restore(a.State()); err != nil {
							t.Fatal(err)
						}
						d := mk(text)
						if err := d.Restore(b.State()); err != nil {
							t.Fatal(err)
						}
						a, b = d, c
					}
				}
				if !inner {
					t.Error("no window holds a document start after position 0")
				}
			})
		}
	}
}

// TestShardDocumentsErrors: shards read with a document boundary refuse a document that
// holds the boundary and a document table that does not fall after the separators, naming
// the shard.
func TestShardDocumentsErrors(t *testing.T) {
	boundary := int32('#')
	dir := t.TempDir()
	holds := filepath.Join(dir, "holds.tokens")
	writeShard(t, holds, ByteTokenizer{}, "one", "t#o")
	if _, err := LoadTokens(Source{Path: holds, Format: "tokens"}, ByteTokenizer{}); err != nil {
		t.Fatalf("without a boundary: %v", err)
	}
	_, err := LoadTokens(Source{Path: holds, Format: "tokens", Boundary: &boundary}, ByteTokenizer{})
	for _, s := range []string{holds, "document 1 holds token 35", "at token 5", "document boundary"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("a document holding the boundary: error %v does not mention %q", err, s)
		}
	}
	// "one", "two": move the second document's start from 4 to 3, onto the separator.
	moved := filepath.Join(dir, "moved.tokens")
	writeShard(t, moved, ByteTokenizer{}, "one", "two")
	b, err := os.ReadFile(moved)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint64(b[len(b)-8:], 3)
	if err := os.WriteFile(moved, reseal(b, true), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = LoadTokens(Source{Path: moved, Format: "tokens", Boundary: &boundary}, ByteTokenizer{})
	for _, s := range []string{moved, "document 1 starts at token 3", "does not follow the separator", "data tokenize"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("a document table off the separators: error %v does not mention %q", err, s)
		}
	}
}

// TestShardVersion2: testdata/shard-v2.tokens, written by the version 2 writer (before
// document tables), is still read, is toVersion2 of what the writer writes now, and is
// refused with a document boundary with a message that says to write it again.
func TestShardVersion2(t *testing.T) {
	const path = "testdata/shard-v2.tokens"
	docs := []string{"a version 2 shard", "written before shards had document tables\n", "third"}
	h, toks, starts, err := ReadShardDocuments(path)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != 2 || h.HasDocStarts() || starts != nil || h.Documents != 3 {
		t.Errorf("header %+v, starts %v: want version 2, 3 documents and no document table", h, starts)
	}
	if got, want := string(ByteTokenizer{}.Decode(toks)), strings.Join(docs, "\n"); got != want {
		t.Errorf("tokens %q, want %q", got, want)
	}
	v3 := filepath.Join(t.TempDir(), "v3.tokens")
	writeShard(t, v3, ByteTokenizer{}, docs...)
	b3, err := os.ReadFile(v3)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := toVersion2(b3); !slices.Equal(got, b2) {
		t.Errorf("toVersion2 gives\n% x\nwant\n% x", got, b2)
	}
	if _, err := LoadTokens(Source{Path: path, Format: "tokens"}, ByteTokenizer{}); err != nil {
		t.Errorf("without a boundary: %v", err)
	}
	boundary := int32(0)
	_, err = LoadTokens(Source{Path: path, Format: "tokens", Boundary: &boundary}, ByteTokenizer{})
	for _, s := range []string{path, "version 2", "does not record where its documents start", "data.document_mask", "distflash data tokenize"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("version 2 with a boundary: error %v does not mention %q", err, s)
		}
	}
}
