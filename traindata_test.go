package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// dataTrainArgs are the arguments of a short tiny run on data.train = train into dir.
func dataTrainArgs(dir, train string, sets ...string) []string {
	args := []string{"train", "--config", "configs/tiny.toml", "--progress=false",
		"--set", "data.train=" + train, "--set", "training.steps=2", "--set", "run.output_dir=" + dir}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return args
}

// TestTrainRefusesUnmeantData: data that is surely not what the user meant (a compressed
// file read as text, a binary file) stops train with an error naming the file, what was
// found and what to set.
func TestTrainRefusesUnmeantData(t *testing.T) {
	in := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(in, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	fmt.Fprintln(zw, `{"text": "a compressed JSON lines document"}`)
	zw.Close()
	binary := make([]byte, 4096)
	for i := range binary {
		binary[i] = byte(i * 7)
	}
	notUTF8 := bytes.Repeat([]byte{0xc3, 0x28, 0xff, 'a'}, 20000) // c3 and ff invalid: 50%
	tests := []struct {
		name, format, file string
		want               []string
	}{
		{"gzip as text", "text", write("corpus.jsonl.gz", gz.Bytes()), []string{"is gzip-compressed", `data.format = "jsonl"`, `"c4"`}},
		{"binary as text", "text", write("model.bin", binary), []string{"NUL byte at offset 0", `data.format = "text" reads UTF-8 text`}},
		{"not UTF-8 as text", "text", write("latin.dat", notUTF8), []string{"50% of the first 64 KiB is not UTF-8", "more than 30% is refused"}},
		{"binary as jsonl", "jsonl", write("model.jsonl", binary), []string{"NUL byte at offset 0", `data.format = "jsonl" reads JSON lines`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(dataTrainArgs(t.TempDir(), tt.file, "data.format="+tt.format), &stdout, &stderr)
			if err == nil {
				t.Fatalf("train on %s as %s: no error\n%s", tt.file, tt.format, stderr.String())
			}
			for _, s := range append([]string{"data.train", tt.file}, tt.want...) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

// TestTrainTextDirectory trains on a directory of .txt and .md files with no data.include,
// and says in its log that data.max_bytes cut the text, and which file holds invalid UTF-8.
func TestTrainTextDirectory(t *testing.T) {
	in := t.TempDir()
	para := func(s string) []byte { return []byte(strings.Repeat(s+" ", 600/(len(s)+1)) + "\n") }
	files := map[string][]byte{
		"a.txt":     para("Plain text notes."),
		"b.md":      para("# A *Markdown* page."),
		"sub/c.txt": para("More notes, in a subdirectory."),
		"d.txt":     para("Caf\xe9 cr\xe8me, in Windows-1252."), // some invalid UTF-8: read, with a warning
	}
	total := int64(len(files) - 1) // the separators; below 1,000,000 bytes in all
	for name, b := range files {
		p := filepath.Join(in, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		total += int64(len(b))
	}
	for _, tt := range []struct {
		maxBytes int64
		cut      bool
	}{{0, false}, {total, false}, {1500, true}} {
		t.Run(fmt.Sprint(tt.maxBytes), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			dir := t.TempDir()
			err := run(dataTrainArgs(dir, in, "data.format=text", fmt.Sprintf("data.max_bytes=%d", tt.maxBytes)), &stdout, &stderr)
			if err != nil {
				t.Fatalf("train: %v\n%s", err, stderr.String())
			}
			if ms := readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl")); len(ms) != 2 {
				t.Errorf("%d metric lines, want 2", len(ms))
			}
			log := stderr.String()
			read := total
			if tt.cut {
				read = tt.maxBytes
			}
			if !strings.Contains(log, fmt.Sprintf("data: %d tokens from %s", read, in)) {
				t.Errorf("stderr does not say %d tokens were read:\n%s", read, log)
			}
			cutLine := fmt.Sprintf("data: read 1,500 of %d,%03d bytes of text in %s, from ", total/1000, total%1000, in)
			if got := strings.Contains(log, cutLine) && strings.Contains(log, "files (data.max_bytes = 1500; set 0 for all)\n"); got != tt.cut {
				t.Errorf("stderr says the text was cut: %v, want %v (%q):\n%s", got, tt.cut, cutLine, log)
			}
			if !tt.cut && !strings.Contains(log, "data: warning: "+filepath.Join(in, "d.txt")+": ") {
				t.Errorf("stderr does not warn about d.txt's invalid UTF-8:\n%s", log)
			}
		})
	}
}

// tokenizeC4 writes a C4-format file of 2 × 40 documents and tokenizes its first 9000 bytes
// into shards of 4000 tokens with data tokenize; it returns the file, the shard directory
// and data tokenize's stderr.
func tokenizeC4(t *testing.T) (c4, out string, stderr *bytes.Buffer) {
	t.Helper()
	c4 = writeC4(t, 2, 40)
	out = filepath.Join(t.TempDir(), "shards")
	var stdout bytes.Buffer
	stderr = new(bytes.Buffer)
	err := run([]string{"data", "tokenize", "--config", "configs/tiny.toml", "--progress=false",
		"--set", "data.train=" + c4, "--set", "data.format=c4", "--set", "data.max_bytes=9000",
		"--out", out, "--shard-tokens", "4000"}, &stdout, stderr)
	if err != nil {
		t.Fatalf("data tokenize: %v\n%s", err, stderr.String())
	}
	return c4, out, stderr
}

// TestTrainDamagedShard: data tokenize writes checksummed shards; one flipped byte makes
// train fail naming the shard and the checksum.
func TestTrainDamagedShard(t *testing.T) {
	c4, out, stderr := tokenizeC4(t)
	var stdout bytes.Buffer
	if want := "data: read 9,000 bytes of text in " + c4 + ", from "; !strings.Contains(stderr.String(), want) {
		t.Errorf("data tokenize's stderr does not say data.max_bytes cut the text (%q):\n%s", want, stderr.String())
	}
	// The shards train.
	if err := run(dataTrainArgs(t.TempDir(), out, "data.format=tokens", "data.max_bytes=0"), &stdout, stderr); err != nil {
		t.Fatalf("train on the shards: %v\n%s", err, stderr.String())
	}
	shard := filepath.Join(out, "shard-000001.tokens")
	b, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 0x04 // a bit of the document table's last entry
	if err := os.WriteFile(shard, b, 0o644); err != nil {
		t.Fatal(err)
	}
	err = run(dataTrainArgs(t.TempDir(), out, "data.format=tokens", "data.max_bytes=0"), &stdout, stderr)
	if err == nil {
		t.Fatal("train on a damaged shard: no error")
	}
	for _, s := range []string{"data.train", shard, "checksum mismatch", "data tokenize"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

// TestTrainDocumentMaskShards: with data.document_mask, training on the shards data
// tokenize writes gives bit for bit the losses of training on the text they were written
// from (the same windows and document starts); a version 2 shard, which has no document
// table, is refused naming the shard and what to run.
func TestTrainDocumentMaskShards(t *testing.T) {
	c4, out, stderr := tokenizeC4(t)
	var stdout bytes.Buffer
	losses := func(train string, sets ...string) []float64 {
		t.Helper()
		dir := t.TempDir()
		args := dataTrainArgs(dir, train, append(sets, "data.document_mask=true", "training.steps=3")...)
		if err := run(args, &stdout, stderr); err != nil {
			t.Fatalf("train %v: %v\n%s", sets, err, stderr.String())
		}
		var l []float64
		for _, m := range readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl")) {
			l = append(l, m.Loss)
		}
		return l
	}
	text := losses(c4, "data.format=c4", "data.max_bytes=9000")
	shards := losses(out, "data.format=tokens", "data.max_bytes=0")
	if len(text) != 3 || !slices.Equal(text, shards) {
		t.Errorf("losses on the shards %v, on the text %v: want the same 3", shards, text)
	}
	v2 := filepath.Join(t.TempDir(), "old.tokens")
	b, err := os.ReadFile("data/testdata/shard-v2.tokens")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(v2, b, 0o644); err != nil {
		t.Fatal(err)
	}
	err = run(dataTrainArgs(t.TempDir(), v2, "data.format=tokens", "data.max_bytes=0", "data.document_mask=true"), &stdout, stderr)
	for _, s := range []string{v2, "version 2", "document_mask", "distflash data tokenize"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("train with document_mask on a version 2 shard: error %v does not mention %q", err, s)
		}
	}
}
