package train

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"distflash/config"
	"distflash/data"
	"distflash/evaluate"
	"distflash/model"
	"distflash/parallel"
)

// BenchmarkTrainStep times one whole optimizer step of configs/tiny.toml (batch 8 × 128
// tokens: forward, backward, clipping, AdamW) under each checkpoint policy. bench/compare.sh
// sets it beside the same step in PyTorch (scripts/reference.py bench).
func BenchmarkTrainStep(b *testing.B) {
	for _, policy := range []string{"none", "layer", "attn_output"} {
		b.Run(policy, func(b *testing.B) {
			cfg, err := config.Load("../configs/tiny.toml", []string{"checkpoint.activation=" + policy, "data.max_bytes=1048576"})
			if err != nil {
				b.Fatal(err)
			}
			tr, err := newTrainer(cfg, io.Discard)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tr.step(0); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := tr.step(i + 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cfg.TokensPerStep()*int64(b.N))/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// TestRematAwareSavesForwardAndItsCommunication: under checkpoint.activation = "layer" the
// backward re-runs every block's attention forward, and with it the schedule's forward
// communication; under "attn_output" (DistFlashAttn §3.3) neither is repeated. Counted per
// step on 4 ranks for every schedule (Ulysses with the tiny model's 2 kv heads replicated); the
// metrics' attn_bytes is the busiest rank's bytes under the schedule's call sites.
func TestRematAwareSavesForwardAndItsCommunication(t *testing.T) {
	for _, name := range parallel.Names() {
		P := 4
		if err := parallel.Check(name, model.Heads{N: 4, KV: 2, Dim: 32}, P); err != nil {
			t.Fatalf("%s refuses 4 ranks for the tiny model: %v", name, err)
		}
		t.Run(fmt.Sprintf("%s/P%d", name, P), func(t *testing.T) {
			fwdBytes := map[string]int64{}
			for _, policy := range []string{"none", "layer", "attn_output"} {
				cfg, err := config.Load("../configs/tiny.toml", []string{"checkpoint.activation=" + policy,
					"data.max_bytes=1048576", "data.batch_size=1", fmt.Sprintf("parallelism.world_size=%d", P),
					fmt.Sprintf("parallelism.sequence_parallel_degree=%d", P), "parallelism.attention=" + name})
				if err != nil {
					t.Fatal(err)
				}
				tr, err := newTrainer(cfg, io.Discard)
				if err != nil {
					t.Fatal(err)
				}
				m, err := tr.step(0)
				if err != nil {
					t.Fatal(err)
				}
				L := int64(cfg.Model.NLayers)
				want := L
				if policy == "layer" {
					want = 2 * L
				}
				if m.AttnForwards != want {
					t.Errorf("%s: %d attention forwards per step, want %d", policy, m.AttnForwards, want)
				}
				var busiest int64 // the step's attention bytes: every site the schedule names
				for r := 0; r < P; r++ {
					fwdBytes[policy] += tr.w.Ranks()[r].Comm.Traffic().Sum(name + ".fwd")
					busiest = max(busiest, tr.w.Ranks()[r].Comm.Traffic().Sum(name+"."))
				}
				if m.AttnBytes != busiest || m.AttnBytes == 0 {
					t.Errorf("%s: metrics attn_bytes %d, the busiest rank's %s.* sites %d", policy, m.AttnBytes, name, busiest)
				}
			}
			if fwdBytes["none"] == 0 || fwdBytes["attn_output"] != fwdBytes["none"] || fwdBytes["layer"] != 2*fwdBytes["none"] {
				t.Errorf("forward-communication bytes per step: none %d, layer %d (want 2×), attn_output %d (want 1×)",
					fwdBytes["none"], fwdBytes["layer"], fwdBytes["attn_output"])
			}
			t.Logf("forward-communication bytes per step over %d ranks: none %d, layer %d, attn_output %d",
				P, fwdBytes["none"], fwdBytes["layer"], fwdBytes["attn_output"])
		})
	}
}

// TestResumeOlderCheckpointKeys: a key the checkpoint's config lacks (added to distflash after
// it was saved) is taken at its default, so resuming with the default prints nothing for it,
// and a value other than the default is still reported against the default.
func TestResumeOlderCheckpointKeys(t *testing.T) {
	cur := config.Default()
	curJSON, err := json.Marshal(cur)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(curJSON, &m); err != nil {
		t.Fatal(err)
	}
	delete(m["parallelism"].(map[string]any), "ulysses_degree")
	m["run"].(map[string]any)["seed"] = json.Number("18446744073709551615")
	saved, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	cur.Run.Seed = 18446744073709551615
	curJSON, _ = json.Marshal(cur)
	var out strings.Builder
	if err := resumeChanges("ck", saved, curJSON, &out); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 {
		t.Errorf("resume of a checkpoint without parallelism.ulysses_degree, same config otherwise, said:\n%s", out.String())
	}
	cur.Parallelism.UlyssesDegree = 2
	curJSON, _ = json.Marshal(cur)
	out.Reset()
	if err := resumeChanges("ck", saved, curJSON, &out); err != nil {
		t.Fatal(err)
	}
	if want := "parallelism.ulysses_degree: 1 → 2"; !strings.Contains(out.String(), want) {
		t.Errorf("resume said %q, want a line with %q", out.String(), want)
	}
}

// TestInitFromEveryParallelism: with sequence parallelism, FSDP, data-parallel replicas and
// bf16 compute, every rank starts from exactly the source's weights (gathered back bit for
// bit), and the first step's loss equals the one-worker run's.
func TestInitFromEveryParallelism(t *testing.T) {
	const src = "../weights/testdata/hf/llama-sharded"
	// the root's initBase: a little data, short sequences, one step
	base := []string{"data.max_bytes=65536", "data.seq_len=64", "data.batch_size=2", "training.steps=1",
		"training.warmup_steps=0", "run.output_dir=" + t.TempDir()}
	one := func(sets ...string) (*trainer, []float32, Metrics) {
		t.Helper()
		cfg, params, err := LoadInitConfig("../configs/tiny.toml", append(base[:len(base):len(base)], sets...), src, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := newTrainer(cfg, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.loadWeights(params); err != nil {
			t.Fatal(err)
		}
		got := tr.fullParams()
		for i := range params {
			if math.Float32bits(got[i]) != math.Float32bits(params[i]) {
				t.Fatalf("%v: weight %d is %v on the ranks, %v in the source", sets, i, got[i], params[i])
			}
		}
		m, err := tr.step(0)
		if err != nil {
			t.Fatal(err)
		}
		return tr, params, m
	}
	_, _, ref := one()
	for _, c := range []struct {
		sets []string
		tol  float64 // first loss vs one worker (NaN: other batches, not compared)
	}{
		{[]string{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4"}, 1e-6},
		{[]string{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=zigzag"}, 1e-6},
		{[]string{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.fsdp=true"}, 1e-6},
		{[]string{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=2", "parallelism.fsdp=true"}, math.NaN()},
		{[]string{"parallelism.world_size=2", "parallelism.sequence_parallel_degree=1"}, math.NaN()},
		{[]string{"training.mixed_precision=bf16"}, 2e-2},
		{[]string{"training.mixed_precision=bf16", "parallelism.world_size=2", "parallelism.fsdp=true", "parallelism.sequence_parallel_degree=2"}, 2e-2},
	} {
		t.Run(strings.Join(c.sets, ","), func(t *testing.T) {
			_, _, m := one(c.sets...)
			if !math.IsNaN(c.tol) {
				if d := math.Abs(m.Loss-ref.Loss) / math.Abs(ref.Loss); d > c.tol {
					t.Errorf("first loss %.9g, one worker %.9g (rel %.1e > %g)", m.Loss, ref.Loss, d, c.tol)
				}
			}
		})
	}
}

// TestEvaluateForTrain: the function train calls scores an untrained model at about
// ln(vocab) (the loss of a uniform guess), is the same on 4 ranks, and stops when its context
// is cancelled.
func TestEvaluateForTrain(t *testing.T) {
	cfg := config.Default()
	cfg.Eval.SeqLen = 64
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	params := model.InitParams(cfg.Model, model.NewLayout(cfg.Model), 1)
	ss, err := evaluate.LoadSamples("../weights/testdata/hf/docs/*.txt", cfg.Data, data.ByteTokenizer{}, -1, evaluate.SeqLen(cfg), 256, cfg.Eval.Samples)
	if err != nil {
		t.Fatal(err)
	}
	r1, err := evaluateAll(context.Background(), cfg, params, ss)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(r1.Loss-math.Log(256)) > 0.05 || r1.Samples != 4 || r1.SeqLen != 64 || r1.BitsPerByte <= 0 {
		t.Errorf("untrained model: %+v; want loss ≈ ln 256 = %.3f over 4 samples", r1, math.Log(256))
	}
	cfg.Parallelism.WorldSize, cfg.Parallelism.SequenceParallelDegree = 4, 4
	r4, err := evaluateAll(context.Background(), cfg, params, ss)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(r4.Loss-r1.Loss)/math.Abs(r1.Loss) > 1e-6 || r4.Tokens != r1.Tokens || r4.SequenceParallel != 4 {
		t.Errorf("4 ranks: %+v; one worker %+v", r4, r1)
	}
	if _, err := evaluateAll(context.Background(), cfg, params[1:], ss); err == nil || !strings.Contains(err.Error(), "parameter values") {
		t.Errorf("short params: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := evaluateAll(ctx, cfg, params, ss); err == nil || !strings.Contains(err.Error(), "stopped by a signal after 0 of 4") {
		t.Errorf("cancelled: %v", err)
	}
}

// BenchmarkEval times the forward pass of eval on one 2048-token sample of the tiny model
// (configs/tiny.toml's shape, untrained) on one worker and on 4 in-process ranks
// (distflash schedule), in predicted tokens per second.
func BenchmarkEval(b *testing.B) {
	for _, P := range []int{1, 4} {
		b.Run(fmt.Sprintf("P%d", P), func(b *testing.B) {
			cfg := config.Default()
			cfg.Parallelism.WorldSize, cfg.Parallelism.SequenceParallelDegree = P, P
			if err := cfg.Validate(); err != nil {
				b.Fatal(err)
			}
			ev, err := evaluate.Local(cfg.Model, cfg.Parallelism, model.InitParams(cfg.Model, model.NewLayout(cfg.Model), 1))
			if err != nil {
				b.Fatal(err)
			}
			doc := bytes.Repeat([]byte("func main() { fmt.Println(\"hello, world\") }\n"), 64)
			s, _, err := evaluate.NewSample(doc, data.ByteTokenizer{}, -1, 2048, 256)
			if err != nil {
				b.Fatal(err)
			}
			samples := []evaluate.Sample{s}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := ev.Evaluate(context.Background(), samples, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(s.Targets)*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// evaluateAll is the evaluation train runs (trainEval) in one call: the loss of params, in the
// layout of cfg.Model, on samples, on cfg's sequence-parallel world.
func evaluateAll(ctx context.Context, cfg config.Config, params []float32, samples []evaluate.Sample) (evaluate.Result, error) {
	ev, err := evaluate.Local(cfg.Model, cfg.Parallelism, params)
	if err != nil {
		return evaluate.Result{}, err
	}
	main, _, err := (&trainEval{ev: ev, sets: []evaluate.EvalSet{{Samples: samples}}, seqLen: evaluate.SeqLen(cfg)}).run(ctx)
	return main, err
}

// TestMetricsLinesWholeOnFullDisk writes metrics lines onto a tmpfs until it is full: the
// write that fails leaves no partial line, so the file stays valid JSON lines.
func TestMetricsLinesWholeOnFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	defer exec.Command("umount", dir).Run()
	path := filepath.Join(dir, "metrics.jsonl")
	mf, err := openMetrics(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	mem := make([]Memory, 40) // a long line (~3 KB), so that the last one is cut by the full disk
	var werr error
	step := 0
	for werr == nil && step < 1000 {
		step++
		werr = mf.write(Metrics{Step: step, Loss: 1.5, Memory: mem})
	}
	mf.close()
	if werr == nil || !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("after %d lines: %v, want a full disk", step, werr)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		t.Errorf("%s ends in a partial line", path)
	}
	lines := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
	for i, l := range lines {
		if !json.Valid(l) {
			t.Errorf("%s line %d is not JSON: %q", path, i+1, l)
		}
	}
	if ms := lines; len(ms) != step-1 {
		t.Errorf("%d whole lines, want %d (the one that did not fit is not there)", len(ms), step-1)
	}
}
