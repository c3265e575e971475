package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"distflash/evaluate"
	"distflash/train/tensorboard"
)

// The tests of this file check a weighted mixture of sources ([[data.sources]], issue 42)
// through the binary: a run that stops and resumes is the run that never stopped, bit for bit;
// metrics.jsonl, the log and TensorBoard give each source's tokens and held-out loss; a source
// that runs out is said once; eval evaluates each source's hold-out; data tokenize writes a
// shard set per source that trains as the text does.

// writeJSONL writes n documents made by doc as JSON lines into path.
func writeJSONL(t *testing.T, path string, n int, doc func(i int) string) {
	t.Helper()
	var b strings.Builder
	enc := json.NewEncoder(&b)
	for i := range n {
		if err := enc.Encode(map[string]string{"text": doc(i), "id": fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// mixtureConfig writes the data of a two-source mixture into dir, "web" (prose, 24 KB) and
// "code" (Go-like lines, 800 bytes: it runs out within a few steps), each with a hold-out, and a
// config of configs/tiny.toml with their [[data.sources]] tables (more appended), and returns
// the config's path.
func mixtureConfig(t *testing.T, dir, more string) string {
	t.Helper()
	web := func(i int) string {
		return fmt.Sprintf("Article %d. The river town held its market on the %dth day, and the traders came early. ", i, i%28+1) +
			strings.Repeat("Fields of barley ran down to the water. ", 3+i%5)
	}
	code := func(i int) string {
		return fmt.Sprintf("func f%d(x int) int {\n\treturn x*%d + %d\n}\n", i, i%7+1, i%3)
	}
	writeJSONL(t, filepath.Join(dir, "web.jsonl"), 100, web)
	writeJSONL(t, filepath.Join(dir, "web-val.jsonl"), 4, func(i int) string { return web(1000 + i) })
	writeJSONL(t, filepath.Join(dir, "code.jsonl"), 20, code)
	writeJSONL(t, filepath.Join(dir, "code-val.jsonl"), 4, func(i int) string { return code(1000 + i) })
	tiny, err := os.ReadFile("configs/tiny.toml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(tiny) + fmt.Sprintf(`
[[data.sources]]
name = "web"
path = %q
format = "jsonl"
weight = 0.6
eval = %q

[[data.sources]]
name = "code"
path = %q
format = "jsonl"
weight = 0.4
eval = %q
`, filepath.Join(dir, "web.jsonl"), filepath.Join(dir, "web-val.jsonl"), filepath.Join(dir, "code.jsonl"), filepath.Join(dir, "code-val.jsonl")) + more
	path := filepath.Join(dir, "mix.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestMixtureResumeIsExact: 8 steps of a two-source mixture straight, and 4 steps + a new
// process resuming for 4 more, give bit-identical weights, moments, losses and per-source
// token counts; every metrics line has each source's tokens (adding up to the tokens trained
// on) and epochs, the eval steps each source's held-out loss (in the log, metrics.jsonl and
// TensorBoard, and eval_loss their samples pooled); the small source's running out is said
// once in the two processes together.
func TestMixtureResumeIsExact(t *testing.T) {
	in := t.TempDir()
	cfg := mixtureConfig(t, in, "")
	args := func(out string, more ...string) []string {
		return append([]string{"train", "--config", cfg, "--progress=false", "--set", "run.output_dir=" + out,
			"--set", "data.batch_size=4", "--set", "training.steps=8", "--set", "training.warmup_steps=2",
			"--set", "checkpoint.interval=4", "--set", "eval.interval=4", "--set", "eval.samples=2"}, more...)
	}
	straight, split := t.TempDir(), t.TempDir()
	out := mustSucceed(t, args(straight)...)
	if !strings.Contains(out, "data: a mixture of 2 sources") || !strings.Contains(out, "web 0.600 (") || !strings.Contains(out, "code 0.400 (") {
		t.Errorf("no mixture report in the log:\n%s", out)
	}
	said := strings.Count(out, "data: source code ran out at step ")
	if said != 1 || strings.Contains(out, "data: source web ran out") {
		t.Errorf("code's running out said %d times (want 1), web's %v:\n%s", said, strings.Contains(out, "source web ran out"), out)
	}
	for _, want := range []string{"eval step 4: loss", "of the sources' samples together", "eval step 4: source web: loss", "eval step 8: source code: loss"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	first := mustSucceed(t, args(split, "--stop-after", "4")...)
	second := mustSucceed(t, args(split, "--resume", "auto")...)
	if !strings.Contains(second, "resume: step 4 from") {
		t.Fatalf("did not resume:\n%s", second)
	}
	if n := strings.Count(first+second, "data: source code ran out at step "); n != 1 {
		t.Errorf("code's running out said %d times over the stopped and resumed runs, want 1:\n%s\n%s", n, first, second)
	}
	a, b := filepath.Join(straight, "tiny"), filepath.Join(split, "tiny")
	if err := sameState(stateOf(t, filepath.Join(a, "step-000008")), stateOf(t, filepath.Join(b, "step-000008"))); err != nil {
		t.Errorf("step 8 straight vs resumed: %v", err)
	}
	ma, mb := readMetrics(t, filepath.Join(a, "metrics.jsonl")), readMetrics(t, filepath.Join(b, "metrics.jsonl"))
	if len(ma) != 8 || len(mb) != 8 {
		t.Fatalf("%d and %d metric lines, want 8", len(ma), len(mb))
	}
	for i := range ma {
		x, y := ma[i], mb[i]
		if x.Loss != y.Loss || fmt.Sprint(x.SourceTokens) != fmt.Sprint(y.SourceTokens) || fmt.Sprint(x.SourceEpochs) != fmt.Sprint(y.SourceEpochs) {
			t.Errorf("step %d: loss %v, sources %v %v straight; %v, %v %v resumed", x.Step, x.Loss, x.SourceTokens, x.SourceEpochs, y.Loss, y.SourceTokens, y.SourceEpochs)
		}
		if got, want := x.SourceTokens["web"]+x.SourceTokens["code"], int64(x.Step*4*128); got != want || x.Tokens != want {
			t.Errorf("step %d: sources' tokens %v add up to %d, tokens %d; want %d", x.Step, x.SourceTokens, got, x.Tokens, want)
		}
		if x.Step%4 == 0 {
			if len(x.EvalSources) != 2 || x.EvalSources["web"].Loss <= 0 || x.EvalSources["code"].Loss <= 0 || x.EvalLoss <= 0 {
				t.Errorf("step %d: eval_sources %v, eval_loss %v", x.Step, x.EvalSources, x.EvalLoss)
			}
			// eval_loss is the samples of both pooled: their losses weighted by their tokens.
			w, c := x.EvalSources["web"], x.EvalSources["code"]
			pooled := (w.Loss*float64(w.Tokens) + c.Loss*float64(c.Tokens)) / float64(w.Tokens+c.Tokens)
			if d := x.EvalLoss - pooled; d > 1e-12 || d < -1e-12 {
				t.Errorf("step %d: eval_loss %v, the sources' pooled %v", x.Step, x.EvalLoss, pooled)
			}
			if x.EvalSources["web"] != y.EvalSources["web"] {
				t.Errorf("step %d: web's eval %v straight, %v resumed", x.Step, x.EvalSources["web"], y.EvalSources["web"])
			}
		} else if x.EvalSources != nil {
			t.Errorf("step %d: eval_sources %v off an eval step", x.Step, x.EvalSources)
		}
	}
	if last := ma[7]; last.SourceEpochs["code"] < 1 || last.SourceEpochs["web"] != 0 {
		t.Errorf("epochs after 8 steps %v: code (%d tokens drawn) should have run out, web not", last.SourceEpochs, last.SourceTokens["code"])
	}
	files, _ := filepath.Glob(filepath.Join(a, "tb", "events.out.tfevents.*"))
	if len(files) != 1 {
		t.Fatalf("event files %v", files)
	}
	evs, err := tensorboard.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs[1:] {
		m := ma[e.Step-1]
		if got := e.Values["data/tokens/code"]; got != float32(m.SourceTokens["code"]) {
			t.Errorf("step %d: data/tokens/code %v, metrics %v", e.Step, got, m.SourceTokens["code"])
		}
		if got, ok := e.Values["eval/loss/web"]; ok != (e.Step%4 == 0) || ok && got != float32(m.EvalSources["web"].Loss) {
			t.Errorf("step %d: eval/loss/web %v (present %v), metrics %v", e.Step, got, ok, m.EvalSources["web"].Loss)
		}
	}
}

// TestMixtureEvalAndShards: eval of a mixture's checkpoint evaluates each source's hold-out
// (the checkpoint's config brings them) and reports them in the log and the JSON, their losses
// equal to eval --data of each alone; data tokenize writes one shard set per source and the
// [[data.sources]] tables for them, and training on those equals training on the text;
// a changed weight refuses to resume.
func TestMixtureEvalAndShards(t *testing.T) {
	in := t.TempDir()
	cfg := mixtureConfig(t, in, "")
	dir := t.TempDir()
	trainArgs := []string{"train", "--config", cfg, "--progress=false", "--set", "data.batch_size=2", "--set", "training.steps=4",
		"--set", "training.warmup_steps=2", "--set", "checkpoint.interval=4"}
	mustSucceed(t, append(trainArgs, "--set", "run.output_dir="+dir)...)
	ckptDir := filepath.Join(dir, "tiny", "step-000004")
	res := filepath.Join(dir, "eval.json")
	stdout, _ := succeed(t, "eval", "--model", ckptDir, "--samples", "3", "--out", res)
	for _, want := range []string{"source web (" + filepath.Join(in, "web-val.jsonl") + "): loss", "source code ("} {
		if !strings.Contains(stdout, want) {
			t.Errorf("eval's output lacks %q:\n%s", want, stdout)
		}
	}
	var rep evaluate.Report
	readJSON(t, res, &rep)
	if len(rep.Sources) != 2 || rep.Sources[0].Name != "web" || rep.Sources[1].Name != "code" {
		t.Fatalf("report's sources: %+v", rep.Sources)
	}
	for _, s := range rep.Sources {
		one := filepath.Join(dir, s.Name+".json")
		succeed(t, "eval", "--model", ckptDir, "--samples", "3", "--data", s.Data, "--set", "data.format=jsonl", "--out", one)
		var alone evaluate.Result
		readJSON(t, one, &alone)
		if s.Loss != alone.Loss || s.Tokens != alone.Tokens || s.Samples != 3 {
			t.Errorf("source %s: loss %v over %d tokens of %d samples in the mixture's eval, %v over %d alone", s.Name, s.Loss, s.Tokens, s.Samples, alone.Loss, alone.Tokens)
		}
	}
	if w, c := rep.Sources[0], rep.Sources[1]; rep.Tokens != w.Tokens+c.Tokens || rep.Samples != 6 {
		t.Errorf("the whole result: %d tokens of %d samples, want the sources' %d of 6", rep.Tokens, rep.Samples, w.Tokens+c.Tokens)
	}

	// data tokenize: a shard set per source, and the tables that train on them.
	shards := filepath.Join(t.TempDir(), "shards")
	stdout, _ = succeed(t, "data", "tokenize", "--config", cfg, "--progress=false", "--out", shards)
	for _, name := range []string{"web", "code"} {
		if _, err := os.Stat(filepath.Join(shards, name, "shards.json")); err != nil {
			t.Errorf("source %s: %v", name, err)
		}
	}
	_, tables, ok := strings.Cut(stdout, "# The mixture, its sources tokenized: [[data.sources]] tables to train on them\n")
	if !ok || strings.Count(tables, "[[data.sources]]") != 2 || !strings.Contains(tables, `format = "tokens"`) || !strings.Contains(tables, `eval_format = "jsonl"`) {
		t.Fatalf("tokenize's output has no tables for the shards:\n%s", stdout)
	}
	tiny, _ := os.ReadFile("configs/tiny.toml")
	shardCfg := filepath.Join(in, "shards.toml")
	if err := os.WriteFile(shardCfg, append(tiny, "\n"+tables...), 0o644); err != nil {
		t.Fatal(err)
	}
	fromShards := t.TempDir()
	shardArgs := slicesReplace(trainArgs, cfg, shardCfg)
	mustSucceed(t, append(shardArgs, "--set", "run.output_dir="+fromShards)...)
	lt, ls := lossesOf(t, filepath.Join(dir, "tiny")), lossesOf(t, filepath.Join(fromShards, "tiny"))
	if fmt.Sprint(lt) != fmt.Sprint(ls) {
		t.Errorf("losses on the text %v, on its shards %v", lt, ls)
	}

	// A changed weight moves every later draw: refused, the key named.
	reweighted := mixtureConfig(t, in, "")
	b, _ := os.ReadFile(reweighted)
	if err := os.WriteFile(reweighted, []byte(strings.Replace(string(b), "weight = 0.4", "weight = 0.5", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	mustFail(t, append(slicesReplace(trainArgs, cfg, reweighted), "--set", "run.output_dir="+dir, "--set", "training.steps=6", "--resume", "auto"),
		"resume: data.sources.1.weight: 0.4 → 0.5 (refused)", "data.sources.1.weight changed")
}

// slicesReplace returns a copy of args with every old replaced by new.
func slicesReplace(args []string, old, new string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == old {
			a = new
		}
		out[i] = a
	}
	return out
}
