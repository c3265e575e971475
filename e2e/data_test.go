package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"distflash/config"
	"distflash/data"
)

// writeC4 writes files of C4 lines (gzip-compressed) with n documents each into a new
// directory and returns it.
func writeC4(t *testing.T, files, n int) string {
	t.Helper()
	dir := t.TempDir()
	for f := range files {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		enc := json.NewEncoder(zw)
		for i := range n {
			text := fmt.Sprintf("File %d, document %d. %s", f, i, strings.Repeat(fmt.Sprintf("The number %d follows %d. ", i*f+1, i*f), 5+i%7))
			if err := enc.Encode(map[string]string{"text": text, "timestamp": "2019-04-25T12:57:54Z", "url": "https://example.com/"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		name := filepath.Join(dir, fmt.Sprintf("c4-train.%05d-of-01024.json.gz", f))
		if err := os.WriteFile(name, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestDataTokenizeThenTrain tokenizes C4 files into shards and trains on the shards and on
// the C4 files themselves: the two runs see the same tokens, so their losses are identical.
func TestDataTokenizeThenTrain(t *testing.T) {
	c4 := writeC4(t, 3, 40)
	out := filepath.Join(t.TempDir(), "shards")
	var stdout, stderr bytes.Buffer
	err := run([]string{"data", "tokenize", "--config", "configs/tiny.toml", "--progress=false",
		"--set", "data.train=" + c4, "--set", "data.format=c4", "--set", "data.max_bytes=0",
		"--out", out, "--shard-tokens", "4000"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("data tokenize: %v\n%s", err, stderr.String())
	}
	src := data.Source{Path: c4, Format: "c4", Seed: 1337}
	want, err := data.LoadTokens(src, data.ByteTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"tokenized 120 documents from 3 files", fmt.Sprintf("%s tokens", config.Count(int64(len(want)))), "tokenizer byte", "MB/s", "tokens/s", out} {
		if !strings.Contains(stdout.String(), s) {
			t.Errorf("stdout %q does not mention %q", stdout.String(), s)
		}
	}
	shards, _ := filepath.Glob(filepath.Join(out, "*.tokens"))
	if len(shards) < 2 {
		t.Errorf("%d shards of at most 4000 tokens for %d tokens", len(shards), len(want))
	}
	got, err := data.LoadTokens(data.Source{Path: out, Format: "tokens"}, data.ByteTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the shards hold %d tokens, not the %d of the C4 files", len(got), len(want))
	}

	losses := map[string][]float64{}
	for _, tt := range []struct{ name, format, train string }{{"c4", "c4", c4}, {"tokens", "tokens", out}} {
		dir := t.TempDir()
		stdout.Reset()
		err := run([]string{"train", "--config", "configs/tiny.toml", "--progress=false",
			"--set", "data.format=" + tt.format, "--set", "data.train=" + tt.train,
			"--set", "data.max_bytes=0", "--set", "training.steps=3", "--set", "run.output_dir=" + dir}, &stdout, &stderr)
		if err != nil {
			t.Fatalf("train on %s: %v\n%s", tt.name, err, stderr.String())
		}
		for _, m := range readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl")) {
			losses[tt.name] = append(losses[tt.name], m.Loss)
		}
	}
	if len(losses["c4"]) != 3 || !slices.Equal(losses["c4"], losses["tokens"]) {
		t.Errorf("losses on C4 %v and on its shards %v, want 3 identical", losses["c4"], losses["tokens"])
	}
}

func TestDataTokenizeProgressBar(t *testing.T) {
	c4 := writeC4(t, 1, 30)
	var stdout, stderr bytes.Buffer
	err := run([]string{"data", "tokenize", "--progress", "--set", "data.train=" + c4, "--set", "data.format=c4",
		"--out", filepath.Join(t.TempDir(), "c4.tokens")}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("data tokenize: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "tokenize") || !strings.Contains(stdout.String(), "in 1 shards") {
		t.Errorf("stderr %q, stdout %q: want a bar and one shard", stderr.String(), stdout.String())
	}
}

func TestDataCommandErrors(t *testing.T) {
	c4 := writeC4(t, 1, 3)
	existing := filepath.Join(t.TempDir(), "x.tokens")
	if err := os.WriteFile(existing, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"data"}, []string{"no subcommand"}},
		{[]string{"data", "shuffle"}, []string{`unknown subcommand "shuffle"`, "tokenize, fetch or passkey"}},
		{[]string{"data", "tokenize"}, []string{"--out is required"}},
		{[]string{"data", "tokenize", "--out", existing, "extra"}, []string{"unexpected arguments", "extra"}},
		{[]string{"data", "tokenize", "--out", existing, "--set", "data.train=" + c4, "--set", "data.format=c4"}, []string{existing, "exists"}},
		{[]string{"data", "tokenize", "--out", t.TempDir(), "--set", "data.train=" + c4, "--set", "data.format=tokens"}, []string{"already token shards"}},
		{[]string{"data", "tokenize", "--out", t.TempDir(), "--set", "data.train=" + c4, "--set", "data.format=jsonl"}, []string{"data tokenize: data.train = ", "no file matches", `"*.jsonl"`}},
		{[]string{"data", "tokenize", "--out", t.TempDir(), "--set", "data.format=parquet"}, []string{"data.format", "parquet"}},
		{[]string{"data", "fetch"}, []string{"name the dataset", "fetch c4"}},
		{[]string{"data", "fetch", "pile"}, []string{`unknown dataset "pile"`}},
		{[]string{"data", "fetch", "c4", "--split", "test"}, []string{`split "test"`}},
		{[]string{"data", "fetch", "c4", "--shards", "9"}, []string{"shards 9", "8 files"}},
		{[]string{"data", "fetch", "c4", "x"}, []string{"unexpected arguments", "x"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(tt.args, &stdout, &stderr)
			if err == nil {
				t.Fatalf("no error; stdout %q", stdout.String())
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestDataFetch(t *testing.T) {
	files := map[string][]byte{}
	for i := range 8 {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		fmt.Fprintf(zw, "{\"text\": \"validation file %d\"}\n", i)
		zw.Close()
		files[fmt.Sprintf("c4-validation.%05d-of-00008.json.gz", i)] = buf.Bytes()
	}
	var requests []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests = append(requests, r.URL.Path)
		name, _ := strings.CutPrefix(r.URL.Path, "/datasets/allenai/c4/resolve/main/en/")
		content, ok := files[name]
		if !ok {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(content))
	}))
	defer srv.Close()
	base := srv.URL + "/datasets/allenai/c4/resolve/main"
	for _, args := range [][]string{
		{"data", "fetch", "c4", "--split", "validation", "--first", "3", "--shards", "2"},
		{"data", "fetch", "--split", "validation", "c4", "--first", "3", "--shards", "2"}, // the name after a flag
	} {
		dir := t.TempDir()
		requests = nil
		var stdout, stderr bytes.Buffer
		if err := run(append(args, "--out", dir, "--base-url", base, "--progress=false"), &stdout, &stderr); err != nil {
			t.Fatalf("%q: %v\n%s", args, err, stderr.String())
		}
		want := []string{"/datasets/allenai/c4/resolve/main/en/c4-validation.00003-of-00008.json.gz", "/datasets/allenai/c4/resolve/main/en/c4-validation.00004-of-00008.json.gz"}
		if !slices.Equal(requests, want) {
			t.Errorf("requests %q, want %q", requests, want)
		}
		for _, name := range []string{"c4-validation.00003-of-00008.json.gz", "c4-validation.00004-of-00008.json.gz"} {
			if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || !bytes.Equal(b, files[name]) {
				t.Errorf("%s: %v, or its content differs", name, err)
			}
		}
		if !strings.Contains(stdout.String(), "fetched 2 C4 validation files into "+dir) || !strings.Contains(stdout.String(), "MB/s") {
			t.Errorf("stdout %q", stdout.String())
		}
		if !strings.Contains(stderr.String(), "[2/2] c4-validation.00004-of-00008.json.gz:") {
			t.Errorf("stderr %q: want a line per file", stderr.String())
		}
		// Again: nothing to download.
		stdout.Reset()
		stderr.Reset()
		requests = nil
		if err := run(append(args, "--out", dir, "--base-url", base, "--progress"), &stdout, &stderr); err != nil {
			t.Fatal(err)
		}
		if len(requests) != 0 || !strings.Contains(stderr.String(), "complete already") {
			t.Errorf("second fetch: %d requests, stderr %q", len(requests), stderr.String())
		}
	}
	// An HTTP error reaches the user with the URL and the status.
	var stdout, stderr bytes.Buffer
	err := run([]string{"data", "fetch", "c4", "--out", t.TempDir(), "--base-url", srv.URL + "/nowhere", "--progress=false"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "HTTP 404") || !strings.Contains(err.Error(), "/nowhere/en/c4-validation.00000-of-00008.json.gz") {
		t.Errorf("fetch from a wrong base URL: error %v", err)
	}
}

// TestDataFetchSaysItRetries: a server that keeps failing makes data fetch show each retry
// and end with how to fetch by hand or from elsewhere, instead of waiting in silence.
func TestDataFetchSaysItRetries(t *testing.T) {
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	var stdout, stderr bytes.Buffer
	err := run([]string{"data", "fetch", "c4", "--shards", "1", "--retries", "2", "--progress=false",
		"--out", t.TempDir(), "--base-url", srv.URL}, &stdout, &stderr)
	if err == nil {
		t.Fatal("fetch from a failing server succeeded")
	}
	if calls != 3 {
		t.Errorf("%d requests, want 1 + 2 retries", calls)
	}
	for _, want := range []string{"503", "retry 1 of 2 in 1s", "retry 2 of 2 in 2s"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	for _, want := range []string{"to fetch by hand", srv.URL + "/en/c4-validation", "--base-url"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}
