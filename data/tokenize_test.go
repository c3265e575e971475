package data

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// varDocs returns n C4 documents of varied lengths (1 to 97 bytes) in a gzip file, and the
// documents.
func varDocs(t *testing.T, n int) (string, []string) {
	var docs []string
	for i := range n {
		docs = append(docs, fmt.Sprintf("%03d", i)+strings.Repeat("x", (i*37)%95))
	}
	return writeFiles(t, map[string][]byte{"c4-a.json.gz": gzipData(t, c4Lines(t, docs...))}), docs
}

func TestEncodeDocs(t *testing.T) {
	defer func(n int) { encBatchBytes = n }(encBatchBytes)
	encBatchBytes = 300 // many batches
	dir, docs := varDocs(t, 200)
	for _, workers := range []int{1, 2, 7} {
		w, err := newDocWalk(Source{Path: dir, Format: "c4"}, false)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		err = encodeDocs(context.Background(), w, upperTokenizer{}, workers, func(toks []int32, n int) error {
			b := make([]byte, len(toks))
			for i, id := range toks {
				b[i] = byte(id - 1000)
			}
			if n != len(b) {
				t.Errorf("text length %d for a document of %d tokens", n, len(b))
			}
			got = append(got, string(b))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, docs) {
			t.Errorf("%d workers: documents out of order or changed", workers)
		}
		// An error from emit stops the walk and comes back.
		w, _ = newDocWalk(Source{Path: dir, Format: "c4"}, false)
		calls := 0
		boom := errors.New("boom")
		err = encodeDocs(context.Background(), w, ByteTokenizer{}, workers, func([]int32, int) error {
			if calls++; calls == 5 {
				return boom
			}
			return nil
		})
		if err != boom || calls != 5 {
			t.Errorf("%d workers: emit failing at call 5: error %v after %d calls", workers, err, calls)
		}
	}
}

func TestWriteShards(t *testing.T) {
	dir, _ := varDocs(t, 300)
	src := Source{Path: dir, Format: "c4", Seed: 3}
	want, err := LoadTokens(src, ByteTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	for _, shardTokens := range []int64{0, 1000, 97, 40} {
		t.Run(fmt.Sprint(shardTokens), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			var reports []TokenizeProgress
			st, err := WriteShards(context.Background(), src, ByteTokenizer{}, ShardOptions{Out: out, ShardTokens: shardTokens, Workers: 2,
				Progress: func(p TokenizeProgress) { reports = append(reports, p) }})
			if err != nil {
				t.Fatal(err)
			}
			var docs, textBytes int64
			for i, p := range st.Shards {
				if want := filepath.Join(out, fmt.Sprintf("shard-%06d.tokens", i)); p != want {
					t.Errorf("shard %d is %s, want %s", i, p, want)
				}
				h, err := ReadShardHeader(p)
				if err != nil {
					t.Fatal(err)
				}
				if limit := shardTokens; limit > 0 && h.Tokens > limit && h.Documents > 1 {
					t.Errorf("shard %d holds %d tokens in %d documents, more than %d", i, h.Tokens, h.Documents, limit)
				}
				docs += h.Documents
				if i > 0 {
					textBytes++
				}
				textBytes += h.TextBytes
			}
			if shardTokens == 40 && len(st.Shards) < 300/2 {
				t.Errorf("%d shards of at most 40 tokens for 300 documents of 4 to 98", len(st.Shards))
			}
			if docs != 300 || st.Documents != 300 || st.Tokens != int64(len(want)) || st.TextBytes != int64(len(want)) || textBytes != st.TextBytes {
				t.Errorf("stats %+v, shards hold %d documents and %d text bytes; want 300 documents and %d tokens and bytes", st.TokenizeProgress, docs, textBytes, len(want))
			}
			if fi, _ := os.Stat(filepath.Join(dir, "c4-a.json.gz")); st.InputBytes != fi.Size() || st.InputTotal != fi.Size() || st.Files != 1 || st.FilesRead != 1 {
				t.Errorf("input bytes %d of %d in %d files, want the file's %d", st.InputBytes, st.InputTotal, st.Files, fi.Size())
			}
			if len(reports) < 2 || reports[0].Documents != 0 || reports[len(reports)-1] != st.TokenizeProgress {
				t.Errorf("progress reports %+v: want the start and the final counts", reports)
			}
			got, err := LoadTokens(Source{Path: out, Format: "tokens"}, ByteTokenizer{})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("shards read back as %d tokens, not the %d LoadTokens gives", len(got), len(want))
			}
			// The same output again is refused: old and new shards must not mix.
			_, err = WriteShards(context.Background(), src, ByteTokenizer{}, ShardOptions{Out: out})
			if err == nil || !strings.Contains(err.Error(), "already holds") {
				t.Errorf("writing into %s again: error %v, want one saying it already holds shards", out, err)
			}
		})
	}
}

func TestWriteShardsSingleFileAndMaxBytes(t *testing.T) {
	dir, _ := fixedDocs(t, 20)
	src := Source{Path: dir, MaxBytes: 777, Seed: 9}
	want, err := LoadTokens(src, upperTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "sub", "go.tokens")
	st, err := WriteShards(context.Background(), src, upperTokenizer{}, ShardOptions{Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Shards, []string{out}) || st.TextBytes != 777 || st.Files != 20 || st.FilesRead != 8 {
		t.Errorf("wrote %q with %d text bytes from %d of %d files, want [%s] with 777 from 8 of 20", st.Shards, st.TextBytes, st.FilesRead, st.Files, out)
	}
	// MaxBytes 777 reads them; a smaller limit cannot be applied to tokens.
	got, err := LoadTokens(Source{Path: out, Format: "tokens", MaxBytes: 777}, upperTokenizer{})
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("read back with MaxBytes 777: %d tokens, error %v; want the %d written", len(got), err, len(want))
	}
	if _, err := LoadTokens(Source{Path: out, Format: "tokens", MaxBytes: 776}, upperTokenizer{}); err == nil {
		t.Error("read back with MaxBytes 776: no error")
	}
	for _, tt := range []struct {
		name string
		src  Source
		opt  ShardOptions
		want string
	}{
		{"file exists", src, ShardOptions{Out: out}, "exists"},
		{"file with a shard size", src, ShardOptions{Out: out + "2.tokens", ShardTokens: 10}, "does not apply"},
		{"no output", src, ShardOptions{}, "no output named"},
		{"negative shard size", src, ShardOptions{Out: t.TempDir(), ShardTokens: -1}, "ShardTokens = -1"},
		{"tokens source", Source{Path: out, Format: "tokens"}, ShardOptions{Out: t.TempDir()}, "already token shards"},
		{"no documents", Source{Path: t.TempDir()}, ShardOptions{Out: t.TempDir()}, "no file matches"},
	} {
		if _, err := WriteShards(context.Background(), tt.src, upperTokenizer{}, tt.opt); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one mentioning %q", tt.name, err, tt.want)
		}
	}
}

func TestWriteShardsCancelAndFailure(t *testing.T) {
	defer func(n int) { encBatchBytes = n }(encBatchBytes)
	encBatchBytes = 500
	dir, _ := varDocs(t, 400)
	// Cancelled midway: an error, and no shard (or temporary file) is left.
	out := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := WriteShards(ctx, Source{Path: dir, Format: "c4"}, ByteTokenizer{}, ShardOptions{Out: out, ShardTokens: 200,
		Progress: func(p TokenizeProgress) {
			if p.Documents == 0 {
				cancel()
			}
		}})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: error %v, want context.Canceled", err)
	}
	if left, _ := os.ReadDir(out); len(left) > 0 {
		t.Errorf("cancelled run left %d files, e.g. %s", len(left), left[0].Name())
	}
	// A corrupt input file after good ones: the good ones' shards are removed too.
	good := c4Lines(t, strings.Repeat("a", 300), strings.Repeat("b", 300))
	bad := gzipData(t, append(good, good...))
	files := map[string][]byte{"c4-0.json": good, "c4-1.json.gz": bad[:len(bad)-10]}
	src := Source{Path: writeFiles(t, files), Format: "c4"}
	for ; ; src.Seed++ { // a seed that reads the good file first
		if w, err := newDocWalk(src, true); err != nil || filepath.Base(w.files[0]) == "c4-0.json" {
			break
		}
	}
	out = t.TempDir()
	_, err = WriteShards(context.Background(), src, ByteTokenizer{}, ShardOptions{Out: out, ShardTokens: 300})
	if err == nil || !strings.Contains(err.Error(), "c4-1.json.gz") {
		t.Errorf("corrupt input: error %v, want one naming c4-1.json.gz", err)
	}
	if left, _ := os.ReadDir(out); len(left) > 0 {
		t.Errorf("failed run left %d files, e.g. %s", len(left), left[0].Name())
	}
}
