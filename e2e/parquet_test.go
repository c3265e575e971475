package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"distflash/data/datatest"
)

// The tests of this file check data.format = "parquet" and data.text_key through the
// binary: Parquet files tokenize to the shards and train to the losses of the same
// documents as JSON lines, a bad Parquet file is refused by name with nothing written, and
// a nested text_key reads jsonl.

// pqRow is a row of the Parquet files written here: the text (null in some rows) beside
// an int64 column.
type pqRow struct {
	ID   int64   `parquet:"id"`
	Text *string `parquet:"text,optional"`
}

// writeParquetAndJSONL writes files documents (of which every 13th is null, left out of
// the jsonl) as Parquet files (snappy, a row group every 25 rows) into one new directory
// and as jsonl files of the same names into another, and returns both.
func writeParquetAndJSONL(t *testing.T, files, docs int) (parquetDir, jsonlDir string) {
	t.Helper()
	parquetDir, jsonlDir = t.TempDir(), t.TempDir()
	for f := range files {
		var rows []pqRow
		var jl bytes.Buffer
		for i := range docs {
			row := pqRow{ID: int64(i)}
			if i%13 != 4 {
				text := fmt.Sprintf("File %d, document %d: «Parquet» café. %s", f, i, strings.Repeat(fmt.Sprintf("The number %d follows %d. ", i*f+1, i*f), 5+i%7))
				row.Text = &text
				line, err := json.Marshal(map[string]any{"id": i, "text": text})
				if err != nil {
					t.Fatal(err)
				}
				jl.Write(append(line, '\n'))
			}
			rows = append(rows, row)
		}
		name := fmt.Sprintf("train-%05d-of-%05d", f, files)
		pf, err := os.Create(filepath.Join(parquetDir, name+".parquet"))
		if err != nil {
			t.Fatal(err)
		}
		w := parquet.NewGenericWriter[pqRow](pf, parquet.Compression(&parquet.Snappy))
		for i := 0; i < len(rows); i += 25 {
			if _, err := w.Write(rows[i:min(i+25, len(rows))]); err != nil {
				t.Fatal(err)
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := pf.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(jsonlDir, name+".jsonl"), jl.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return parquetDir, jsonlDir
}

// TestDataTokenizeParquet: data tokenize of Parquet files writes the shards, byte for
// byte, that it writes for the same documents as JSON lines, and says how many null texts
// it skipped.
func TestDataTokenizeParquet(t *testing.T) {
	pq, jl := writeParquetAndJSONL(t, 3, 60)
	out := map[string]string{}
	for _, tt := range []struct{ format, dir string }{{"parquet", pq}, {"jsonl", jl}} {
		out[tt.format] = filepath.Join(t.TempDir(), "shards")
		stdout, stderr := succeed(t, "data", "tokenize", "--config", "configs/tiny.toml", "--progress=false",
			"--set", "data.train="+tt.dir, "--set", "data.format="+tt.format, "--set", "data.max_bytes=0",
			"--out", out[tt.format], "--shard-tokens", "3000")
		if want := "tokenized 165 documents from 3 files"; !strings.Contains(stdout, want) {
			t.Errorf("%s: stdout %q does not say %q", tt.format, stdout, want)
		}
		if tt.format == "parquet" && !strings.Contains(stderr, "data: 15 null texts skipped in "+pq) {
			t.Errorf("stderr %q does not count the 15 null texts", stderr)
		}
	}
	if n := datatest.SameFiles(t, out["parquet"], out["jsonl"]); n < 4 {
		t.Errorf("%d files: want several shards and shards.json", n)
	}
}

// TestTrainParquet trains a few steps on Parquet files and on the same documents as JSON
// lines: the same tokens, so the same losses.
func TestTrainParquet(t *testing.T) {
	pq, jl := writeParquetAndJSONL(t, 2, 80)
	losses := map[string][]float64{}
	for _, tt := range []struct{ format, dir string }{{"parquet", pq}, {"jsonl", jl}} {
		dir := t.TempDir()
		_, stderr := succeed(t, dataTrainArgs(dir, tt.dir, "data.format="+tt.format, "data.max_bytes=0", "training.steps=3")...)
		if tt.format == "parquet" && !strings.Contains(stderr, "null texts skipped") {
			t.Errorf("train's log does not count the null texts:\n%s", stderr)
		}
		losses[tt.format] = lossesOf(t, filepath.Join(dir, "tiny"))
	}
	if len(losses["parquet"]) != 3 || !slices.Equal(losses["parquet"], losses["jsonl"]) {
		t.Errorf("losses on Parquet %v and on jsonl %v, want 3 identical", losses["parquet"], losses["jsonl"])
	}
}

// TestParquetBadFile: a truncated Parquet file, and one whose text column is missing, stop
// data tokenize and train with an error naming the file and what is wrong, and nothing is
// written.
func TestParquetBadFile(t *testing.T) {
	pq, _ := writeParquetAndJSONL(t, 1, 30)
	good := filepath.Join(pq, "train-00000-of-00001.parquet")
	b, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	truncated := filepath.Join(t.TempDir(), "cut.parquet")
	if err := os.WriteFile(truncated, b[:len(b)-100], 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, file, key string
		want            []string
	}{
		{"truncated", truncated, "text", []string{truncated, "is truncated", "does not end with the PAR1 magic"}},
		{"missing column", good, "content", []string{good, `no column "content"`, "the file's columns are id (INT64", "text (BYTE_ARRAY STRING)"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			parent := t.TempDir()
			out := filepath.Join(parent, "shards")
			_, stderr, err := cli(t, "data", "tokenize", "--progress=false", "--set", "data.format=parquet",
				"--set", "data.train="+tt.file, "--set", "data.text_key="+tt.key, "--out", out)
			if err == nil {
				t.Fatalf("data tokenize: no error\n%s", stderr)
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("data tokenize: error %q does not say %q", err, s)
				}
			}
			if ents, _ := os.ReadDir(parent); len(ents) != 0 {
				t.Errorf("data tokenize left %v", ents)
			}
			runs := t.TempDir()
			_, stderr, err = cli(t, dataTrainArgs(runs, tt.file, "data.format=parquet", "data.text_key="+tt.key)...)
			if err == nil {
				t.Fatalf("train: no error\n%s", stderr)
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("train: error %q does not say %q", err, s)
				}
			}
			if m, _ := filepath.Glob(filepath.Join(runs, "*", "*.ckpt*")); len(m) != 0 {
				t.Errorf("train wrote %v", m)
			}
		})
	}
}

// TestTextKeyNested: data.text_key = "meta.body" reads the nested field of JSON lines,
// which tokenize to the shards of the same documents under "text"; a key a line lacks is an
// error naming it.
func TestTextKeyNested(t *testing.T) {
	_, jl := writeParquetAndJSONL(t, 2, 40)
	nested := t.TempDir()
	files, err := filepath.Glob(filepath.Join(jl, "*.jsonl"))
	if err != nil || len(files) != 2 {
		t.Fatalf("%v, %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
			var v struct {
				ID   int    `json:"id"`
				Text string `json:"text"`
			}
			if err := json.Unmarshal(line, &v); err != nil {
				t.Fatal(err)
			}
			// "text" is there too, and must not be read.
			nl, err := json.Marshal(map[string]any{"id": v.ID, "text": "not this", "meta": map[string]any{"lang": "en", "body": v.Text}})
			if err != nil {
				t.Fatal(err)
			}
			out.Write(append(nl, '\n'))
		}
		if err := os.WriteFile(filepath.Join(nested, filepath.Base(f)), out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := map[string]string{}
	for _, tt := range []struct{ name, dir, key string }{{"text", jl, "text"}, {"meta.body", nested, "meta.body"}} {
		out[tt.name] = filepath.Join(t.TempDir(), "shards")
		succeed(t, "data", "tokenize", "--progress=false", "--set", "data.format=jsonl", "--set", "data.max_bytes=0",
			"--set", "data.train="+tt.dir, "--set", "data.text_key="+tt.key, "--out", out[tt.name], "--shard-tokens", "2000")
	}
	if n := datatest.SameFiles(t, out["meta.body"], out["text"]); n < 3 {
		t.Errorf("%d files: want several shards and shards.json", n)
	}
	for _, tt := range []struct{ key, want string }{
		{"content", `the object has no "content" field`},
		{"meta.title", `the object has no "meta.title" field: "meta" has no "title"`},
		{"id.x", `"id" is a number, want an object holding "x"`},
	} {
		_, stderr, err := cli(t, "data", "tokenize", "--progress=false", "--set", "data.format=jsonl",
			"--set", "data.train="+nested, "--set", "data.text_key="+tt.key, "--out", filepath.Join(t.TempDir(), "x"))
		if err == nil {
			t.Fatalf("text_key %s: no error\n%s", tt.key, stderr)
		}
		if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), nested) {
			t.Errorf("text_key %s: error %q does not say %q and name the file", tt.key, err, tt.want)
		}
	}
}
