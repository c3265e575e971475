package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"distflash/data"
	"distflash/data/datatest"
)

// The tests of this file check the data commands and what train makes of data: data tokenize
// (C4, LLaMA-3's tokenizer, a progress bar) gives shards that train exactly as their text, data
// fetch (against a local server, with retries), text directories, damaged or old shards, and
// data that is surely not what the user meant, refused by name.

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
	stdout, stderr, err := cli(t, "data", "tokenize", "--config", "configs/tiny.toml", "--progress=false",
		"--set", "data.train="+c4, "--set", "data.format=c4", "--set", "data.max_bytes=0",
		"--out", out, "--shard-tokens", "4000")
	if err != nil {
		t.Fatalf("data tokenize: %v\n%s", err, stderr)
	}
	src := data.Source{Path: c4, Format: "c4", Seed: 1337}
	want, err := data.LoadTokens(src, data.ByteTokenizer{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"tokenized 120 documents from 3 files", fmt.Sprintf("%s tokens", data.Count(int64(len(want)))), "tokenizer byte", "MB/s", "tokens/s", out} {
		if !strings.Contains(stdout, s) {
			t.Errorf("stdout %q does not mention %q", stdout, s)
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
		_, stderr, err := cli(t, "train", "--config", "configs/tiny.toml", "--progress=false",
			"--set", "data.format="+tt.format, "--set", "data.train="+tt.train,
			"--set", "data.max_bytes=0", "--set", "training.steps=3", "--set", "run.output_dir="+dir)
		if err != nil {
			t.Fatalf("train on %s: %v\n%s", tt.name, err, stderr)
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
	stdout, stderr, err := cli(t, "data", "tokenize", "--progress", "--set", "data.train="+c4, "--set", "data.format=c4",
		"--out", filepath.Join(t.TempDir(), "c4.tokens"))
	if err != nil {
		t.Fatalf("data tokenize: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "tokenize") || !strings.Contains(stdout, "in 1 shards") {
		t.Errorf("stderr %q, stdout %q: want a bar and one shard", stderr, stdout)
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
		{[]string{"data", "tokenize", "--out", t.TempDir(), "--set", "data.format=parquet"}, []string{"data tokenize: data.train = ", "no file matches", `"*.parquet"`}},
		{[]string{"data", "fetch"}, []string{"name the dataset", "fetch c4"}},
		{[]string{"data", "fetch", "pile"}, []string{`unknown dataset "pile"`}},
		{[]string{"data", "fetch", "c4", "--split", "test"}, []string{`split "test"`}},
		{[]string{"data", "fetch", "c4", "--shards", "9"}, []string{"shards 9", "8 files"}},
		{[]string{"data", "fetch", "c4", "x"}, []string{"unexpected arguments", "x"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			stdout, _, err := cli(t, tt.args...)
			if err == nil {
				t.Fatalf("no error; stdout %q", stdout)
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
		stdout, stderr, err := cli(t, append(args, "--out", dir, "--base-url", base, "--progress=false")...)
		if err != nil {
			t.Fatalf("%q: %v\n%s", args, err, stderr)
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
		if !strings.Contains(stdout, "fetched 2 C4 validation files into "+dir) || !strings.Contains(stdout, "MB/s") {
			t.Errorf("stdout %q", stdout)
		}
		if !strings.Contains(stderr, "[2/2] c4-validation.00004-of-00008.json.gz:") {
			t.Errorf("stderr %q: want a line per file", stderr)
		}
		// Again: nothing to download.
		requests = nil
		if _, stderr, err = cli(t, append(args, "--out", dir, "--base-url", base, "--progress")...); err != nil {
			t.Fatal(err)
		}
		if len(requests) != 0 || !strings.Contains(stderr, "complete already") {
			t.Errorf("second fetch: %d requests, stderr %q", len(requests), stderr)
		}
	}
	// An HTTP error reaches the user with the URL and the status.
	_, _, err := cli(t, "data", "fetch", "c4", "--out", t.TempDir(), "--base-url", srv.URL+"/nowhere", "--progress=false")
	if err == nil || !strings.Contains(err.Error(), "HTTP 404") || !strings.Contains(err.Error(), "/nowhere/en/c4-validation.00000-of-00008.json.gz") {
		t.Errorf("fetch from a wrong base URL: error %v", err)
	}
}

// TestDataFetchSaysItRetries: a server that keeps failing makes data fetch show each retry
// and end with how to fetch by hand or from elsewhere, instead of waiting in silence.
func TestDataFetchSaysItRetries(t *testing.T) {
	slow(t, "data's TestFetchC4Errors retries a failing server")
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	_, stderr, err := cli(t, "data", "fetch", "c4", "--shards", "1", "--retries", "2", "--progress=false",
		"--out", t.TempDir(), "--base-url", srv.URL)
	if err == nil {
		t.Fatal("fetch from a failing server succeeded")
	}
	if calls != 3 {
		t.Errorf("%d requests, want 1 + 2 retries", calls)
	}
	for _, want := range []string{"503", "retry 1 of 2 in 1s", "retry 2 of 2 in 2s"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	for _, want := range []string{"to fetch by hand", srv.URL + "/en/c4-validation", "--base-url"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// TestDataFetchNoRoute (issue 43, item 9): a fetch that cannot leave the machine ends at once,
// saying why, instead of retrying for half a minute: with no network (the binary in a network
// namespace of its own, as root) and with a host name that does not resolve (.invalid, RFC
// 6761, where this machine's name server answers).
func TestDataFetchNoRoute(t *testing.T) {
	fetch := []string{"data", "fetch", "c4", "--progress=false", "--retries", "3"}
	check := func(name string, cmd *exec.Cmd, dir string, want ...string) {
		t.Helper()
		_, stderr, err := runCmd(t, cmd)
		msg, ok := errorMessage(stderr)
		if err == nil || err.(*exec.ExitError).ExitCode() != 2 || !ok {
			t.Fatalf("%s: %v, want exit status 2 and an error\n%s", name, err, stderr)
		}
		if strings.Contains(stderr, "retry 1 of") {
			t.Errorf("%s: retried:\n%s", name, stderr)
		}
		for _, w := range want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: the error does not say %q:\n%s", name, w, stderr)
			}
		}
		if ents, _ := os.ReadDir(dir); len(ents) > 0 {
			t.Errorf("%s: wrote %d entries into %s", name, len(ents), dir)
		}
	}
	t.Run("offline", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("a network namespace of its own (unshare -n) needs root; CI runs this as root")
		}
		dir := t.TempDir()
		check("offline", exec.Command("unshare", append([]string{"-n", bin}, append(fetch, "--out", dir)...)...), dir,
			"huggingface.co", "this machine has no network (is it offline?), so retrying cannot help", "to fetch by hand")
	})
	t.Run("no such host", func(t *testing.T) {
		const host = "distflash-fetch-test.invalid"
		var dns *net.DNSError
		if _, err := net.LookupHost(host); !errors.As(err, &dns) || !dns.IsNotFound {
			t.Skipf("this machine's name server does not answer for %s (%v); data's TestFetchC4NoRoute covers a name that does not resolve", host, err)
		}
		dir := t.TempDir()
		check("no such host", command(append(fetch, "--out", dir, "--base-url", "http://"+host)...), dir,
			"the host name "+host+" does not resolve, so retrying cannot help: check --base-url")
	})
}

// llama3Dir writes LLaMA-3's tokenizer.json (fetched by scripts/fetch_llama3_tokenizer.sh)
// into a new directory, as a model directory holds it, and returns the directory.
func llama3Dir(t *testing.T) string {
	t.Helper()
	b := datatest.Llama3TokenizerJSON(t, filepath.Join("data", "testdata", "tok", "llama3.tokenizer.json.gz"))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDataTokenizeTrainLlama3 runs data tokenize and train with data.tokenizer naming a
// directory with LLaMA-3's tokenizer.json: the shards hold uint32 ids (the vocabulary is
// 128256), the same ids as tokenizing the C4 files directly, and train refuses a model
// vocabulary smaller than the tokenizer's, naming both sizes, then trains with one that
// covers it.
func TestDataTokenizeTrainLlama3(t *testing.T) {
	tok := llama3Dir(t)
	c4 := writeC4(t, 1, 20)
	out := filepath.Join(t.TempDir(), "shards")
	_, stderr, err := cli(t, "data", "tokenize", "--config", "configs/tiny.toml", "--progress=false",
		"--set", "data.train="+c4, "--set", "data.format=c4", "--set", "data.tokenizer="+tok,
		"--out", out)
	if err != nil {
		t.Fatalf("data tokenize: %v\n%s", err, stderr)
	}
	shards, _ := filepath.Glob(filepath.Join(out, "*.tokens"))
	if len(shards) != 1 {
		t.Fatalf("%d shards, want 1", len(shards))
	}
	h, err := data.ReadShardHeader(shards[0])
	if err != nil {
		t.Fatal(err)
	}
	if h.TokenBytes != 4 || h.VocabSize != 128256 {
		t.Errorf("shard header: %d bytes per token, vocabulary %d; want 4 and 128256", h.TokenBytes, h.VocabSize)
	}
	l3, err := data.NewTokenizer(tok)
	if err != nil {
		t.Fatal(err)
	}
	want, err := data.LoadTokens(data.Source{Path: c4, Format: "c4", Seed: 1337}, l3)
	if err != nil {
		t.Fatal(err)
	}
	got, err := data.LoadTokens(data.Source{Path: out, Format: "tokens"}, l3)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) || len(want) == 0 {
		t.Fatalf("the shards hold %d tokens, not the %d of the C4 files", len(got), len(want))
	}

	train := func(vocab string) (string, string, error) {
		return cli(t, "train", "--config", "configs/tiny.toml", "--progress=false",
			"--set", "data.format=tokens", "--set", "data.train="+out, "--set", "data.tokenizer="+tok,
			"--set", "model.vocab_size="+vocab, "--set", "model.dim=32", "--set", "model.n_layers=1",
			"--set", "model.n_heads=2", "--set", "model.n_kv_heads=1", "--set", "model.ffn_dim=64",
			"--set", "data.seq_len=16", "--set", "data.batch_size=1", "--set", "training.steps=1",
			"--set", "run.output_dir="+t.TempDir())
	}
	if _, _, err := train("32000"); err == nil || !strings.Contains(err.Error(), "128256") || !strings.Contains(err.Error(), "32000") {
		t.Errorf("train with model.vocab_size 32000: error %v, want one naming 128256 and 32000", err)
	}
	stdout, stderr, err := train("128256")
	if err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	if all := stdout + stderr; !strings.Contains(all, "vocab 128256") {
		t.Errorf("train output does not mention vocab 128256:\n%s", all)
	}
}

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
			_, stderr, err := cli(t, dataTrainArgs(t.TempDir(), tt.file, "data.format="+tt.format)...)
			if err == nil {
				t.Fatalf("train on %s as %s: no error\n%s", tt.file, tt.format, stderr)
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
			dir := t.TempDir()
			_, log, err := cli(t, dataTrainArgs(dir, in, "data.format=text", fmt.Sprintf("data.max_bytes=%d", tt.maxBytes))...)
			if err != nil {
				t.Fatalf("train: %v\n%s", err, log)
			}
			if ms := readMetrics(t, filepath.Join(dir, "tiny", "metrics.jsonl")); len(ms) != 2 {
				t.Errorf("%d metric lines, want 2", len(ms))
			}
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
func tokenizeC4(t *testing.T) (c4, out, stderr string) {
	t.Helper()
	c4 = writeC4(t, 2, 40)
	out = filepath.Join(t.TempDir(), "shards")
	_, stderr, err := cli(t, "data", "tokenize", "--config", "configs/tiny.toml", "--progress=false",
		"--set", "data.train="+c4, "--set", "data.format=c4", "--set", "data.max_bytes=9000",
		"--out", out, "--shard-tokens", "4000")
	if err != nil {
		t.Fatalf("data tokenize: %v\n%s", err, stderr)
	}
	return c4, out, stderr
}

// TestTrainDamagedShard: data tokenize writes checksummed shards; one flipped byte makes
// train fail naming the shard and the checksum.
func TestTrainDamagedShard(t *testing.T) {
	c4, out, stderr := tokenizeC4(t)
	if want := "data: read 9,000 bytes of text in " + c4 + ", from "; !strings.Contains(stderr, want) {
		t.Errorf("data tokenize's stderr does not say data.max_bytes cut the text (%q):\n%s", want, stderr)
	}
	// The shards train.
	if _, stderr, err := cli(t, dataTrainArgs(t.TempDir(), out, "data.format=tokens", "data.max_bytes=0")...); err != nil {
		t.Fatalf("train on the shards: %v\n%s", err, stderr)
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
	_, _, err = cli(t, dataTrainArgs(t.TempDir(), out, "data.format=tokens", "data.max_bytes=0")...)
	if err == nil {
		t.Fatal("train on a damaged shard: no error")
	}
	for _, s := range []string{"data.train", shard, "checksum mismatch", "data tokenize"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

// TestTrainIncompleteShardSet (issue 33, item 6): a tokenized set knows its shards; with one
// deleted, train (which used to go on with the rest without a word) refuses naming it, and a
// shard that is not one of the set is refused by name too.
func TestTrainIncompleteShardSet(t *testing.T) {
	_, out, _ := tokenizeC4(t)
	last := filepath.Join(out, "shard-000002.tokens")
	aside := filepath.Join(t.TempDir(), "aside.tokens")
	if err := os.Rename(last, aside); err != nil {
		t.Fatal(err)
	}
	train := dataTrainArgs(t.TempDir(), out, "data.format=tokens", "data.max_bytes=0")
	mustFail(t, train, "lists 3 shards, and shard-000002.tokens is missing", "the set is incomplete")
	b, err := os.ReadFile(aside)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{last, filepath.Join(out, "shard-000009.tokens")} {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mustFail(t, train, "holds shard-000009.tokens, which is not in the set", "remove it")
}

// TestTrainShardSetWithoutItsList (issue 43, item 9): a directory of shards that data tokenize
// wrote, whose shards.json is gone, trains (its shards are whole) but says that the set can no
// longer be checked, naming the directory and the file; with the file there is no such note.
func TestTrainShardSetWithoutItsList(t *testing.T) {
	_, out, _ := tokenizeC4(t)
	train := dataTrainArgs(t.TempDir(), out, "data.format=tokens", "data.max_bytes=0")
	note := "data: note: " + out + " holds shards named as data tokenize names them (shard-NNNNNN.tokens), but no shards.json"
	if stderr := mustSucceed(t, train...); strings.Contains(stderr, "shards.json") {
		t.Errorf("a whole set is noted:\n%s", stderr)
	}
	if err := os.Remove(filepath.Join(out, "shards.json")); err != nil {
		t.Fatal(err)
	}
	train = dataTrainArgs(t.TempDir(), out, "data.format=tokens", "data.max_bytes=0")
	if stderr := mustSucceed(t, train...); !strings.Contains(stderr, note) || !strings.Contains(stderr, "tokenize the data again") {
		t.Errorf("a set without its shards.json is read without a note (%q):\n%s", note, stderr)
	}
}

// TestTrainDocumentMaskShards: with data.document_mask, training on the shards data
// tokenize writes gives bit for bit the losses of training on the text they were written
// from (the same windows and document starts); a version 2 shard, which has no document
// table, is refused naming the shard and what to run.
func TestTrainDocumentMaskShards(t *testing.T) {
	c4, out, _ := tokenizeC4(t)
	losses := func(train string, sets ...string) []float64 {
		t.Helper()
		dir := t.TempDir()
		args := dataTrainArgs(dir, train, append(sets, "data.document_mask=true", "training.steps=3")...)
		if _, stderr, err := cli(t, args...); err != nil {
			t.Fatalf("train %v: %v\n%s", sets, err, stderr)
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
	_, _, err = cli(t, dataTrainArgs(t.TempDir(), v2, "data.format=tokens", "data.max_bytes=0", "data.document_mask=true")...)
	for _, s := range []string{v2, "version 2", "document_mask", "distflash data tokenize"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("train with document_mask on a version 2 shard: error %v does not mention %q", err, s)
		}
	}
}
