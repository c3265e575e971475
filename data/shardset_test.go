package data

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestShardSet: a tokenized directory lists its shards in shards.json, also when written into
// a directory that holds other files; a shard deleted, one added and one replaced by another
// each make reading the set an error naming the file, and the intact set reads as written.
func TestShardSet(t *testing.T) {
	dir, _ := varDocs(t, 300)
	src := Source{Path: dir, Format: "c4", Seed: 3}
	for _, preexisting := range []bool{false, true} {
		out := filepath.Join(t.TempDir(), "out")
		if preexisting {
			if err := os.MkdirAll(out, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(out, "README"), []byte("mine"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		st, err := WriteShards(context.Background(), src, ByteTokenizer{}, ShardOptions{Out: out, ShardTokens: 97})
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Shards) < 3 {
			t.Fatalf("%d shards, want several", len(st.Shards))
		}
		read := Source{Path: out, Format: "tokens"}
		whole, err := LoadTokens(read, ByteTokenizer{})
		if err != nil || len(whole) == 0 {
			t.Fatalf("the intact set: %d tokens, %v", len(whole), err)
		}
		third := st.Shards[2]
		b, err := os.ReadFile(third)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name  string
			harm  func() error
			heal  func() error
			wants []string
		}{
			{"deleted", func() error { return os.Remove(third) }, func() error { return os.WriteFile(third, b, 0o644) },
				[]string{filepath.Base(third), "is missing"}},
			{"added", func() error { return os.WriteFile(filepath.Join(out, "shard-999999.tokens"), b, 0o644) },
				func() error { return os.Remove(filepath.Join(out, "shard-999999.tokens")) }, []string{"shard-999999.tokens", "not in the set"}},
			{"replaced", func() error { return copyFile(st.Shards[0], third) }, func() error { return os.WriteFile(third, b, 0o644) },
				[]string{third, "was replaced"}},
		} {
			if err := tc.harm(); err != nil {
				t.Fatal(err)
			}
			_, err := LoadTokens(read, ByteTokenizer{})
			for _, w := range tc.wants {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("preexisting=%v, a shard %s: %v, want an error saying %q", preexisting, tc.name, err, w)
				}
			}
			if err := tc.heal(); err != nil {
				t.Fatal(err)
			}
		}
		if again, err := LoadTokens(read, ByteTokenizer{}); err != nil || len(again) != len(whole) {
			t.Errorf("the set restored: %d tokens, %v", len(again), err)
		}
	}
}

// copyFile copies src over dst.
func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// TestWrittenFraction: the fraction of the input a disk-full estimate scales by is that of the
// text written, not of the input read ahead of it (a 92.7 MB estimate where 172 MB were needed
// came from counting the read-ahead); with data.max_bytes it is the text over the cut.
func TestWrittenFraction(t *testing.T) {
	p := TokenizeProgress{InputBytes: 100, InputTotal: 400, TextBytes: 150}
	if got := writtenFraction(p, 300, 0); got != 0.125 { // half the text read is written: half of 100 of 400
		t.Errorf("read ahead by half: %g, want 0.125", got)
	}
	if got := writtenFraction(p, 150, 0); got != 0.25 {
		t.Errorf("nothing ahead: %g, want 0.25", got)
	}
	if got := writtenFraction(p, 300, 300); got != 0.5 {
		t.Errorf("max_bytes 300: %g, want 0.5", got)
	}
	if got := writtenFraction(TokenizeProgress{InputTotal: 10}, 0, 0); got != 0 {
		t.Errorf("nothing read: %g, want 0", got)
	}
}
