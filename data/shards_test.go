package data

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// wideTokenizer has a vocabulary above 65536, so its shards hold 4-byte tokens.
type wideTokenizer struct{}

func (wideTokenizer) Encode(text []byte) []int32 {
	ids := make([]int32, len(text))
	for i, b := range text {
		ids[i] = 70000 + int32(b)
	}
	return ids
}
func (wideTokenizer) Decode(ids []int32) []byte { panic("unused") }
func (wideTokenizer) VocabSize() int            { return 70256 }
func (wideTokenizer) Name() string              { return "wide" }

// impostorTokenizer calls itself "byte" and has 256 ids, but encodes differently.
type impostorTokenizer struct{ ByteTokenizer }

func (impostorTokenizer) Encode(text []byte) []int32 {
	ids := ByteTokenizer{}.Encode(text)
	for i := range ids {
		ids[i] ^= 1
	}
	return ids
}

// writeShard writes docs as one shard of tok at path and returns the tokens of the stream.
func writeShard(t *testing.T, path string, tok Tokenizer, docs ...string) []int32 {
	t.Helper()
	w, err := CreateShard(path, tok)
	if err != nil {
		t.Fatal(err)
	}
	var stream []int32
	for i, d := range docs {
		if i > 0 {
			stream = append(stream, tok.Encode([]byte{DocSeparator})...)
		}
		ids := tok.Encode([]byte(d))
		stream = append(stream, ids...)
		if err := w.WriteDocument(ids, len(d)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(path); err == nil {
		t.Errorf("%s exists before Close", path)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".tmp"); err == nil {
		t.Errorf("%s.tmp is left after Close", path)
	}
	return stream
}

func TestShardRoundTrip(t *testing.T) {
	docs := []string{"first document", "second, ünïcödé", "x"}
	for _, tt := range []struct {
		tok        Tokenizer
		tokenBytes int
	}{
		{ByteTokenizer{}, 2},
		{upperTokenizer{}, 2},
		{wideTokenizer{}, 4},
	} {
		t.Run(tt.tok.Name(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "a.tokens")
			want := writeShard(t, path, tt.tok, docs...)
			h, got, err := ReadShard(path)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("tokens %v, want %v", got, want)
			}
			file, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			wantH := ShardHeader{Version: 3, TokenBytes: tt.tokenBytes, VocabSize: tt.tok.VocabSize(),
				HeaderSize: headerSize(len(tt.tok.Name())), Tokens: int64(len(want)), Documents: 3,
				TextBytes: int64(len(strings.Join(docs, "\n"))), Fingerprint: TokenizerFingerprint(tt.tok), Tokenizer: tt.tok.Name(),
				Checksum: crc32.Checksum(file[headerSize(len(tt.tok.Name())):], crc32.MakeTable(crc32.Castagnoli))}
			if h != wantH {
				t.Errorf("header %+v\nwant   %+v", h, wantH)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if size := h.HeaderSize + int64(len(want)*tt.tokenBytes) + 8*3; fi.Size() != size {
				t.Errorf("file has %d bytes, want %d", fi.Size(), size)
			}
			if h.HeaderSize%8 != 0 {
				t.Errorf("header size %d is not a multiple of 8", h.HeaderSize)
			}
			// LoadTokens reads it as the tokenizer's stream.
			loaded, err := LoadTokens(Source{Path: path, Format: "tokens"}, tt.tok)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(loaded, want) {
				t.Errorf("LoadTokens gives %v, want %v", loaded, want)
			}
			// The document table says where each document starts.
			_, _, starts, err := ReadShardDocuments(path)
			if err != nil {
				t.Fatal(err)
			}
			sep := len(tt.tok.Encode([]byte{DocSeparator}))
			var wantStarts []int64
			at := 0
			for _, d := range docs {
				wantStarts = append(wantStarts, int64(at))
				at += len(tt.tok.Encode([]byte(d))) + sep
			}
			if !slices.Equal(starts, wantStarts) {
				t.Errorf("document starts %v, want %v", starts, wantStarts)
			}
		})
	}
}

// TestShardLayout pins the bytes of a shard to the layout documented in shards.go.
func TestShardLayout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.tokens")
	writeShard(t, path, ByteTokenizer{}, "hi", "A")
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	le := binary.LittleEndian
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	var tokens []byte
	for _, c := range "hi\nA" {
		tokens = le.AppendUint16(tokens, uint16(c))
	}
	tokens = le.AppendUint64(tokens, 0) // document table: "hi" starts at token 0,
	tokens = le.AppendUint64(tokens, 3) // "A" at token 3
	want = append(want, "DFTOK1\x00\x00"...)
	want = le.AppendUint32(want, 3)   // version
	want = le.AppendUint32(want, 2)   // bytes per token
	want = le.AppendUint32(want, 256) // vocabulary
	want = le.AppendUint32(want, 72)  // header size: 66 + 4 rounded up to 8
	want = le.AppendUint64(want, 4)   // tokens: h i \n A
	want = le.AppendUint64(want, 2)   // documents
	want = le.AppendUint64(want, 4)   // text bytes: "hi\nA"
	want = le.AppendUint64(want, TokenizerFingerprint(ByteTokenizer{}))
	want = le.AppendUint32(want, crc32.Checksum(tokens, castagnoli)) // tokens and table
	want = le.AppendUint32(want, 0)                                  // the header's checksum, filled in below
	want = le.AppendUint16(want, 4)
	want = append(want, "byte\x00\x00"...)
	le.PutUint32(want[60:], crc32.Checksum(want, castagnoli))
	want = append(want, tokens...)
	if !bytes.Equal(got, want) {
		t.Errorf("shard bytes\n% x\nwant\n% x", got, want)
	}
}

func TestTokenizerFingerprint(t *testing.T) {
	fp := TokenizerFingerprint(ByteTokenizer{})
	if fp != TokenizerFingerprint(ByteTokenizer{}) {
		t.Error("fingerprint is not deterministic")
	}
	for _, other := range []Tokenizer{upperTokenizer{}, wideTokenizer{}, impostorTokenizer{}} {
		if TokenizerFingerprint(other) == fp {
			t.Errorf("%T has the byte tokenizer's fingerprint", other)
		}
	}
}

// reseal sets the checksums of the version 2 or 3 shard b to match its (patched) content: the
// tokens' if tokens is set, then the header's over its header-size field's bytes.
func reseal(b []byte, tokens bool) []byte {
	le := binary.LittleEndian
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	hs := int(le.Uint32(b[20:]))
	if tokens {
		le.PutUint32(b[56:], crc32.Checksum(b[hs:], castagnoli))
	}
	le.PutUint32(b[60:], 0)
	le.PutUint32(b[60:], crc32.Checksum(b[:hs], castagnoli))
	return b
}

func TestReadShardErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.tokens")
	writeShard(t, good, ByteTokenizer{}, "hello", "world")
	orig, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	patch := func(off int, v ...byte) []byte {
		b := bytes.Clone(orig)
		copy(b[off:], v)
		return b
	}
	flip := func(off int) []byte {
		b := bytes.Clone(orig)
		b[off] ^= 0x10
		return b
	}
	// sealed patches the header and sets its checksum, so that the check after it is seen.
	sealed := func(off int, v ...byte) []byte { return reseal(patch(off, v...), false) }
	u32 := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
	u64 := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	const hs = 72         // 66 header bytes + "byte", rounded up to 8
	const table = 72 + 22 // the document table: after 11 tokens of 2 bytes
	tests := []struct {
		name    string
		content []byte
		want    []string
	}{
		{"empty file", nil, []string{"not a token shard", "DFTOK1"}},
		{"gzip file", gzipData(t, []byte("x")), []string{"not a token shard", "gzip-compressed"}},
		{"zstd file", zstdData(t, []byte("x")), []string{"not a token shard", "zstd-compressed"}},
		{"json file", c4Lines(t, "x"), []string{"not a token shard", "looks like JSON"}},
		{"magic only", orig[:8], []string{"truncated", "8 bytes"}},
		{"header cut", orig[:60], []string{"truncated", "66-byte header"}},
		{"header cut after the name", orig[:70], []string{"truncated", "72-byte header"}},
		{"last byte cut", orig[:len(orig)-1], []string{"truncated", "11 tokens", "table of 2 document starts", "110 bytes in all", "file has 109"}},
		{"document table cut", orig[:table], []string{"truncated", "11 tokens", "table of 2 document starts", "110 bytes in all", "file has 94"}},
		{"trailing byte", append(bytes.Clone(orig), 0), []string{"1 bytes after its end"}},
		{"version 4", patch(8, u32(4)...), []string{"version 4", "reads versions 1 to 3"}},
		// Any damaged byte of the header or the tokens is a checksum mismatch.
		{"flipped token count", flip(24), []string{"header checksum mismatch", "damaged"}},
		{"flipped fingerprint", flip(50), []string{"header checksum mismatch"}},
		{"flipped tokens checksum", flip(57), []string{"header checksum mismatch"}},
		{"flipped header checksum", flip(62), []string{"header checksum mismatch"}},
		{"flipped name", flip(67), []string{"header checksum mismatch"}},
		{"flipped padding", flip(71), []string{"header checksum mismatch"}},
		{"flipped first token", flip(hs), []string{"checksum mismatch", "11 tokens", "damaged", "data tokenize"}},
		{"flipped last token", flip(table - 1), []string{"checksum mismatch", "11 tokens"}},
		{"flipped document start", flip(table + 8), []string{"checksum mismatch", "11 tokens and 2 document starts", "damaged"}},
		// A header that is consistent with its checksum but wrong says what is wrong.
		{"3-byte tokens", sealed(12, u32(3)...), []string{"3 bytes per token", "want 2 (uint16) or 4 (uint32)"}},
		{"vocab 0", sealed(16, u32(0)...), []string{"vocabulary size 0"}},
		{"vocab too big for uint16", sealed(16, u32(70000)...), []string{"vocabulary size 70000", "2-byte tokens"}},
		{"header size", sealed(20, u32(80)...), []string{"header size 80, want 72"}},
		{"token count", sealed(24, u64(1<<62)...), []string{"out of range"}},
		{"name length 0", sealed(64, 0, 0), []string{"tokenizer name of 0 bytes"}},
		{"token outside vocabulary", reseal(patch(hs+2*3, 0x2c, 0x01), true), []string{"token 3", "is 300", "[0, 256)"}},
		{"no documents", sealed(32, u64(0)...), []string{"11 tokens but no documents"}},
		{"document count", sealed(32, u64(1<<61)...), []string{"document count", "out of range"}},
		// A document table consistent with its checksum but wrong says what is wrong.
		{"first document not at 0", reseal(patch(table, 1), true), []string{"document table", "document 0 starts at token 1, want 0"}},
		{"document past the tokens", reseal(patch(table+8, 12), true), []string{"document table", "document 1 starts at token 12, outside the 11 tokens"}},
		{"document start huge", reseal(patch(table+8, u64(1<<63)...), true), []string{"document 1 starts at token 9223372036854775808"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_")+".tokens")
			if err := os.WriteFile(path, tt.content, 0o644); err != nil {
				t.Fatal(err)
			}
			_, toks, err := ReadShard(path)
			if err == nil {
				t.Fatalf("no error; read %d tokens", len(toks))
			}
			for _, s := range append([]string{"data: ", path}, tt.want...) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if _, err := LoadTokens(Source{Path: path, Format: "tokens"}, ByteTokenizer{}); err == nil || !strings.Contains(err.Error(), path) {
				t.Errorf("LoadTokens: error %v, want one naming %s", err, path)
			}
		})
	}
}

// TestReadShardVersion1 reads testdata/shard-v1.tokens, written by the version 1 writer
// (before checksums): it is read, and LoadTokens warns that it is not verified.
func TestReadShardVersion1(t *testing.T) {
	const path = "testdata/shard-v1.tokens"
	const text = "a version 1 shard\nwritten before shards had checksums\n"
	h, toks, err := ReadShard(path)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != 1 || h.HeaderSize != 64 || h.Tokenizer != "byte" || h.Documents != 2 || h.Checksum != 0 {
		t.Errorf("header %+v: want version 1, a 64-byte header, tokenizer byte, 2 documents, no checksum", h)
	}
	if got := string(ByteTokenizer{}.Decode(toks)); got != text {
		t.Errorf("tokens %q, want %q", got, text)
	}
	var log bytes.Buffer
	loaded, err := LoadTokens(Source{Path: path, Format: "tokens", Log: &log}, ByteTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(loaded, toks) {
		t.Errorf("LoadTokens gives %q, want %q", ByteTokenizer{}.Decode(loaded), text)
	}
	for _, s := range []string{"data: warning: ", path, "version 1", "no checksum", "data tokenize"} {
		if !strings.Contains(log.String(), s) {
			t.Errorf("log %q does not mention %q", log.String(), s)
		}
	}
	// Its header is checked as version 1's layout.
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(orig)
	binary.LittleEndian.PutUint32(bad[20:], 72)
	p := filepath.Join(t.TempDir(), "bad.tokens")
	if err := os.WriteFile(p, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadShard(p); err == nil || !strings.Contains(err.Error(), "header size 72, want 64") {
		t.Errorf("version 1 shard with header size 72: error %v", err)
	}
	// A directory of several: each warned about up to maxWarnings, then one line.
	dir := t.TempDir()
	for i := range maxWarnings + 2 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("s%d.tokens", i)), orig, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log.Reset()
	if _, err := LoadTokens(Source{Path: dir, Format: "tokens", Log: &log}, ByteTokenizer{}); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(log.String(), "no checksum"); n != maxWarnings {
		t.Errorf("%d warnings about missing checksums, want %d:\n%s", n, maxWarnings, log.String())
	}
	if !strings.Contains(log.String(), "data: warning: 2 more like it in "+dir) {
		t.Errorf("log does not count the warnings left out:\n%s", log.String())
	}
}

func TestLoadShardsTokenizerMismatch(t *testing.T) {
	dir := t.TempDir()
	writeShard(t, filepath.Join(dir, "a.tokens"), ByteTokenizer{}, "hello")
	tests := []struct {
		tok  Tokenizer
		want []string
	}{
		{upperTokenizer{}, []string{`tokenizer "byte" (vocabulary 256)`, `configured tokenizer is "upper" (vocabulary 1256)`}},
		{wideTokenizer{}, []string{`"byte"`, `"wide"`, "70256"}},
		{impostorTokenizer{}, []string{`"byte"`, "tokenize a probe text differently"}},
	}
	for _, tt := range tests {
		_, err := LoadTokens(Source{Path: dir, Format: "tokens"}, tt.tok)
		if err == nil {
			t.Fatalf("%T: no error", tt.tok)
		}
		for _, s := range append(tt.want, filepath.Join(dir, "a.tokens")) {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%T: error %q does not mention %q", tt.tok, err, s)
			}
		}
	}
}

func TestLoadShards(t *testing.T) {
	dir := t.TempDir()
	a := writeShard(t, filepath.Join(dir, "shard-000000.tokens"), ByteTokenizer{}, "one", "two")
	b := writeShard(t, filepath.Join(dir, "shard-000001.tokens"), ByteTokenizer{}, "three")
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeShard(t, filepath.Join(dir, "sub", "shard-000002.tokens"), ByteTokenizer{}) // empty: skipped
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a shard"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := slices.Concat(a, []int32{'\n'}, b)
	// A copy of the directory with one byte of the second shard's tokens flipped.
	damaged := t.TempDir()
	for _, name := range []string{"shard-000000.tokens", "shard-000001.tokens"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "shard-000001.tokens" {
			b[len(b)-2] ^= 0x01
		}
		if err := os.WriteFile(filepath.Join(damaged, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name     string
		src      Source
		wantErr  []string
		wantToks []int32
	}{
		{"dir", Source{Path: dir}, nil, want},
		{"seed does not reorder", Source{Path: dir, Seed: 12345}, nil, want},
		{"glob", Source{Path: filepath.Join(dir, "shard-*")}, nil, want},
		{"max bytes covers the text", Source{Path: dir, MaxBytes: int64(len("one\ntwo\nthree"))}, nil, want},
		{"max bytes below the text", Source{Path: dir, MaxBytes: 12}, []string{"encode 13 bytes of text", "MaxBytes = 12", "data.max_bytes = 0"}, nil},
		{"no shards", Source{Path: filepath.Join(dir, "notes.txt"), Include: nil}, []string{"not a token shard"}, nil},
		{"only empty shards", Source{Path: filepath.Join(dir, "sub")}, []string{"no tokens", "1 shards", "empty"}, nil},
		{"no match", Source{Path: t.TempDir()}, []string{"no token shards", `"*.tokens"`}, nil},
		{"damaged shard", Source{Path: damaged}, []string{filepath.Join(damaged, "shard-000001.tokens"), "checksum mismatch"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.src.Format = "tokens"
			got, err := LoadTokens(tt.src, ByteTokenizer{})
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, tt.wantToks) {
					t.Errorf("got %q, want %q", ByteTokenizer{}.Decode(got), ByteTokenizer{}.Decode(tt.wantToks))
				}
				return
			}
			if err == nil {
				t.Fatalf("no error")
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestShardWriterErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.tokens")
	writeShard(t, path, ByteTokenizer{}, "x")
	if _, err := CreateShard(path, ByteTokenizer{}); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("CreateShard over an existing shard: error %v", err)
	}
	w, err := CreateShard(filepath.Join(dir, "b.tokens"), ByteTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteDocument([]int32{1, 256}, 2); err == nil || !strings.Contains(err.Error(), "256") || !strings.Contains(err.Error(), `"byte"`) {
		t.Errorf("WriteDocument of token 256 with the byte tokenizer: error %v", err)
	}
	w.Abort()
	if m, _ := filepath.Glob(filepath.Join(dir, "b.tokens*")); len(m) > 0 {
		t.Errorf("Abort left %q", m)
	}
}

// toVersion2 rewrites the version 3 shard b in version 2's layout: no document table, the
// body checksum over the tokens alone.
func toVersion2(b []byte) []byte {
	le := binary.LittleEndian
	tokens := int(le.Uint64(b[24:])) * int(le.Uint32(b[12:]))
	out := bytes.Clone(b[:int(le.Uint32(b[20:]))+tokens])
	le.PutUint32(out[8:], 2)
	return reseal(out, true)
}

// toVersion1 rewrites the version 2 shard b in version 1's layout: no checksums, the name
// length at offset 56 and the name at 58.
func toVersion1(b []byte) []byte {
	le := binary.LittleEndian
	hs := int(le.Uint32(b[20:]))
	n := int(le.Uint16(b[64:]))
	hs1 := int(headerSizeFor(shardFixedV1, n))
	out := make([]byte, hs1, hs1+len(b)-hs)
	copy(out, b[:56])
	le.PutUint32(out[8:], 1)
	le.PutUint32(out[20:], uint32(hs1))
	le.PutUint16(out[56:], uint16(n))
	copy(out[shardFixedV1:], b[shardFixedSize:shardFixedSize+n])
	return append(out, b[hs:]...)
}

// TestShardVersion1Layout: toVersion1 of (toVersion2 of) a shard written now is the version 1
// file the old writer wrote (testdata/shard-v1.tokens), and reads as the same tokens.
func TestShardVersion1Layout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.tokens")
	writeShard(t, path, ByteTokenizer{}, "a version 1 shard", "written before shards had checksums\n")
	v3, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v1, err := os.ReadFile("testdata/shard-v1.tokens")
	if err != nil {
		t.Fatal(err)
	}
	if got := toVersion1(toVersion2(v3)); !bytes.Equal(got, v1) {
		t.Errorf("toVersion1 gives\n% x\nwant\n% x", got, v1)
	}
}

// BenchmarkReadShard reads a shard of 8M uint16 tokens as version 3 (the checksum of the
// tokens and document table verified) and as version 1 (not), the same tokens: the
// difference is the verification.
func BenchmarkReadShard(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, "v3.tokens")
	w, err := CreateShard(path, ByteTokenizer{})
	if err != nil {
		b.Fatal(err)
	}
	doc := ByteTokenizer{}.Encode(randomBytes(1 << 20))
	for range 8 {
		if err := w.WriteDocument(doc, len(doc)); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	v3, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	v1 := filepath.Join(dir, "v1.tokens")
	if err := os.WriteFile(v1, toVersion1(toVersion2(v3)), 0o644); err != nil {
		b.Fatal(err)
	}
	for _, p := range []string{path, v1} {
		b.Run(strings.TrimSuffix(filepath.Base(p), ".tokens"), func(b *testing.B) {
			b.SetBytes(int64(len(v3)))
			var dst []int32
			for b.Loop() {
				if _, dst, _, err = appendShard(dst[:0], p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
