package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"distflash/config"
	"distflash/evaluate"
	"distflash/model"
	"distflash/parallel"
)

// The tests of this file check that several in-process ranks compute what one worker does:
// training through the binary (every schedule, document masks, sliding windows, the Ulysses ×
// ring hybrid, buffers that only staging reaches) and evaluation (every schedule, dynamic
// RoPE). Their MPI, multi-host and Slurm counterparts are in like_in_process_*_test.go.

// trainLosses trains configs/tiny.toml (batch 2, 20 steps) with overrides and returns the
// per-step losses.
func trainLosses(t *testing.T, sets ...string) []float64 {
	t.Helper()
	dir := t.TempDir()
	args := []string{"train", "--config", "configs/tiny.toml", "--progress=false", "--set", "run.output_dir=" + dir,
		"--set", "training.steps=20", "--set", "data.batch_size=2", "--set", "data.max_bytes=1048576"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	if _, stderr, err := cli(t, args...); err != nil {
		t.Fatalf("train %v: %v\n%s", sets, err, stderr)
	}
	return lossesOf(t, filepath.Join(dir, "tiny"))
}

// TestSequenceParallelTrainsLikeOneWorker: 4 in-process ranks, each holding a quarter of every
// sequence, follow the loss curve of one worker over 20 steps, for every schedule, under the
// rematerialization-aware checkpoint policy (Ulysses too: it replicates the tiny model's 2 kv
// heads over the 4 ranks). The curves differ only by
// summation order (gradients are all-reduced across ranks): measured ≤ 4e-8 relative over
// 20 steps, so the bound is 1e-6; a wrong mask, position or merge moves the loss by far more.
func TestSequenceParallelTrainsLikeOneWorker(t *testing.T) {
	slow(t, "parallel's TestSchedulesExact holds every schedule to one worker")
	want := trainLosses(t, "checkpoint.activation=attn_output")
	for _, name := range parallel.Names() {
		P := 4
		if err := parallel.Check(name, model.Heads{N: 4, KV: 2, Dim: 32}, P); err != nil {
			t.Fatalf("%s refuses 4 ranks for the tiny model: %v", name, err)
		}
		t.Run(fmt.Sprintf("%s/P%d", name, P), func(t *testing.T) {
			got := trainLosses(t, "checkpoint.activation=attn_output", fmt.Sprintf("parallelism.world_size=%d", P),
				fmt.Sprintf("parallelism.sequence_parallel_degree=%d", P), "parallelism.attention="+name)
			worst := 0.0
			for i := range want {
				d := math.Abs(got[i]-want[i]) / want[i]
				worst = math.Max(worst, d)
				if d > 1e-6 {
					t.Errorf("step %d: loss %.7f on %d ranks, %.7f on one (rel diff %.2e)", i+1, got[i], P, want[i], d)
				}
			}
			t.Logf("loss %.6f -> %.6f; worst relative difference from one worker over %d steps: %.2e",
				got[0], got[len(got)-1], len(got), worst)
		})
	}
}

// writeShortDocs writes n JSON-lines documents of 3 to 120 random words' bytes (few longer
// than the tiny model's 128-token window, so most windows hold several documents) and
// returns the file.
func writeShortDocs(t *testing.T, n int) string {
	t.Helper()
	words := strings.Fields("the of and to in is was for on that with as by at from his her an it were which are this be")
	var b strings.Builder
	for i := 0; i < n; i++ {
		var doc []string
		for w := 0; w < 1+(i*7919)%40; w++ {
			doc = append(doc, words[(i*31+w*17)%len(words)])
		}
		fmt.Fprintf(&b, "{\"text\": %q}\n", strings.Join(doc, " "))
	}
	p := filepath.Join(t.TempDir(), "docs.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDocumentMaskTrainsLikeOneWorker: with packed, document-masked short documents (and
// positions restarting per document) every schedule on 4 ranks (Ulysses on 2) follows one
// worker's loss over 20 steps as closely as unmasked training does, and the mask changes the
// curve (it is not ignored).
func TestDocumentMaskTrainsLikeOneWorker(t *testing.T) {
	slow(t, "parallel's TestSchedulesExactDocuments holds every schedule under document masks to one worker, and TestTrainDocumentMaskShards trains masked")
	docs := writeShortDocs(t, 3000)
	sets := []string{"checkpoint.activation=attn_output", "data.train=" + docs, "data.format=jsonl",
		"data.document_mask=true", "data.position_reset=true"}
	want := trainLosses(t, sets...)
	plain := trainLosses(t, sets[:3]...)
	if math.Abs(plain[len(plain)-1]-want[len(want)-1]) < 1e-4 {
		t.Fatalf("document masking leaves the loss as it was: %.6f vs %.6f", want[len(want)-1], plain[len(plain)-1])
	}
	for _, name := range parallel.Names() {
		P := 4
		if err := parallel.Check(name, model.Heads{N: 4, KV: 2, Dim: 32}, P); err != nil {
			t.Fatalf("%s refuses 4 ranks for the tiny model: %v", name, err)
		}
		t.Run(fmt.Sprintf("%s/P%d", name, P), func(t *testing.T) {
			got := trainLosses(t, append(slices.Clone(sets), fmt.Sprintf("parallelism.world_size=%d", P),
				fmt.Sprintf("parallelism.sequence_parallel_degree=%d", P), "parallelism.attention="+name)...)
			worst := 0.0
			for i := range want {
				d := math.Abs(got[i]-want[i]) / want[i]
				worst = math.Max(worst, d)
				if d > 1e-6 {
					t.Errorf("step %d: loss %.7f on %d ranks, %.7f on one (rel diff %.2e)", i+1, got[i], P, want[i], d)
				}
			}
			t.Logf("loss %.6f -> %.6f; worst relative difference from one worker: %.2e", got[0], got[len(got)-1], worst)
		})
	}
	// balanced document order (parallelism.balance_documents): the same tokens, targets and
	// in-document positions in another order, so the same curve up to summation order
	for _, name := range []string{"zigzag", "burst"} {
		got := trainLosses(t, append(slices.Clone(sets), "parallelism.world_size=4", "parallelism.sequence_parallel_degree=4",
			"parallelism.attention="+name, "parallelism.balance_documents=true")...)
		worst := worstRel(got, want)
		if worst > 1e-6 {
			t.Errorf("%s with balanced documents: worst relative loss difference from one worker %.2e > 1e-6", name, worst)
		}
		t.Logf("%s, balanced documents: worst relative difference from one worker %.2e", name, worst)
	}
}

// TestWindowTrainsLikeOneWorker: a tiny model whose layers 0 and 2 attend within a sliding
// window of 20 tokens (under a quarter rank's 32) follows one worker's loss over 20 steps on 4
// sequence-parallel ranks, for every schedule and the hybrid, as unwindowed training does, and
// the window changes the curve.
func TestWindowTrainsLikeOneWorker(t *testing.T) {
	slow(t, "parallel's TestSchedulesExactWindows holds every schedule under a window to one worker and model's TestWindowParity the model")
	window := []string{"checkpoint.activation=attn_output", "model.sliding_window=20", "model.sliding_window_layers=[0, 2]"}
	want := trainLosses(t, window...)
	if plain := trainLosses(t, "checkpoint.activation=attn_output"); plain[len(plain)-1] == want[len(want)-1] {
		t.Fatalf("the window left the loss curve as it was")
	}
	cases := map[string][]string{}
	for _, name := range parallel.Names() {
		cases[name] = []string{"parallelism.attention=" + name}
	}
	cases["hybrid ulysses 2 × ring"] = []string{"parallelism.attention=ring", "parallelism.ulysses_degree=2"}
	for name, sets := range cases {
		t.Run(name, func(t *testing.T) {
			got := trainLosses(t, append(append(append([]string{}, window...), "parallelism.world_size=4",
				"parallelism.sequence_parallel_degree=4"), sets...)...)
			worst := 0.0
			for i := range want {
				d := math.Abs(got[i]-want[i]) / want[i]
				worst = math.Max(worst, d)
				if d > 1e-6 {
					t.Errorf("step %d: loss %.7f on 4 ranks, %.7f on one (rel diff %.2e)", i+1, got[i], want[i], d)
				}
			}
			t.Logf("worst relative difference from one worker over %d steps: %.2e", len(got), worst)
		})
	}
}

// TestHybridTrainsLikeOneWorker: 4 in-process ranks in 2 Ulysses groups of 2
// (parallelism.ulysses_degree = 2), with zigzag or distflash between the groups, follow the
// loss curve of one worker over 20 steps within TestSequenceParallelTrainsLikeOneWorker's
// bound (1e-6 relative; the curves differ by summation order only).
func TestHybridTrainsLikeOneWorker(t *testing.T) {
	slow(t, "parallel's TestHybridExact holds every factorisation to one worker")
	want := trainLosses(t, "checkpoint.activation=attn_output")
	for _, name := range []string{"zigzag", "distflash"} {
		t.Run(name+"/P4/U2", func(t *testing.T) {
			got := trainLosses(t, "checkpoint.activation=attn_output", "parallelism.world_size=4",
				"parallelism.sequence_parallel_degree=4", "parallelism.ulysses_degree=2", "parallelism.attention="+name)
			worst := 0.0
			for i := range want {
				d := math.Abs(got[i]-want[i]) / want[i]
				worst = math.Max(worst, d)
				if d > 1e-6 {
					t.Errorf("step %d: loss %.7f on 4 ranks (2 groups of 2), %.7f on one (rel diff %.2e)", i+1, got[i], want[i], d)
				}
			}
			t.Logf("loss %.6f -> %.6f; worst relative difference from one worker over %d steps: %.2e", got[0], got[len(got)-1], len(got), worst)
		})
	}
}

// TestHybridDocumentMaskTrainsLikeOneWorker: with packed documents under the document mask,
// and with parallelism.balance_documents (which then balances the 2 groups), 4 ranks in groups
// of 2 follow one worker's masked curve within 1e-6.
func TestHybridDocumentMaskTrainsLikeOneWorker(t *testing.T) {
	slow(t, "parallel's TestHybridExact covers the hybrid with documents and TestBalanceDocuments the balanced order")
	docs := writeShortDocs(t, 3000)
	sets := []string{"checkpoint.activation=attn_output", "data.train=" + docs, "data.format=jsonl",
		"data.document_mask=true", "data.position_reset=true"}
	want := trainLosses(t, sets...)
	for _, balance := range []string{"false", "true"} {
		got := trainLosses(t, append(slices.Clone(sets), "parallelism.world_size=4", "parallelism.sequence_parallel_degree=4",
			"parallelism.ulysses_degree=2", "parallelism.attention=zigzag", "parallelism.balance_documents="+balance)...)
		worst := worstRel(got, want)
		if worst > 1e-6 {
			t.Errorf("balance_documents=%s: worst relative loss difference from one worker %.2e > 1e-6", balance, worst)
		}
		t.Logf("zigzag between 2 groups of 2, balance_documents=%s: worst relative difference from one worker %.2e", balance, worst)
	}
}

// stagingCases are the worlds the device-staging tests train: every schedule on 4
// sequence-parallel ranks, the Ulysses × ring hybrid, and FSDP over 2 replicas of 2.
func stagingCases() [][]string {
	var cases [][]string
	for _, name := range parallel.Names() {
		cases = append(cases, []string{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=" + name})
	}
	return append(cases,
		[]string{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=4", "parallelism.attention=ring", "parallelism.ulysses_degree=2"},
		[]string{"parallelism.world_size=4", "parallelism.sequence_parallel_degree=2", "parallelism.fsdp=true"})
}

// TestDeviceStagingTrainsLikeHost: ranks whose buffers are not host memory (device.kind =
// "cpu-device": only Upload and Download move them, so every exchange goes through
// transport.Staged's host copies, as a GPU rank's does) train bit for bit as the host path,
// every schedule, the hybrid and FSDP, and their attention sends the same bytes.
func TestDeviceStagingTrainsLikeHost(t *testing.T) {
	slow(t, "transport's TestStagedMatchesHost holds every Comm call through staging to the host path, bit for bit")
	for _, c := range stagingCases() {
		t.Run(fmt.Sprint(c[1:]), func(t *testing.T) {
			host, dev := t.TempDir(), t.TempDir()
			for _, d := range []struct{ dir, kind string }{{host, "cpu"}, {dev, "cpu-device"}} {
				args := smallRun(d.dir, "--set", "training.steps=4", "--set", "device.kind="+d.kind)
				for _, s := range c {
					args = append(args, "--set", s)
				}
				mustSucceed(t, args...)
			}
			a := readMetrics(t, filepath.Join(host, "tiny", "metrics.jsonl"))
			b := readMetrics(t, filepath.Join(dev, "tiny", "metrics.jsonl"))
			for i := range a {
				if a[i].Loss != b[i].Loss || a[i].GradNorm != b[i].GradNorm || a[i].AttnBytes != b[i].AttnBytes {
					t.Errorf("step %d: host loss %v grad_norm %v attn_bytes %d; staged %v %v %d",
						a[i].Step, a[i].Loss, a[i].GradNorm, a[i].AttnBytes, b[i].Loss, b[i].GradNorm, b[i].AttnBytes)
				}
			}
			if err := sameState(stateOf(t, filepath.Join(host, "tiny")), stateOf(t, filepath.Join(dev, "tiny"))); err != nil {
				t.Errorf("the checkpoints' state differs: %v", err)
			}
		})
	}
}

// TestEvalSequenceParallelMatchesOneWorker: on P = 2 and 4 in-process ranks every schedule
// gives the one-worker loss of every sample, to floating-point tolerance (the schedules merge
// attention blocks in another order: measured ≤ 2.2e-8 relative; bound 1e-6). The documents'
// lengths (45, 108, 79, 2, 46 tokens) are not multiples of P or 2P, so the padding is used.
func TestEvalSequenceParallelMatchesOneWorker(t *testing.T) {
	for _, name := range []string{"llama-sharded", "llama-tied"} {
		one, em := hfEvaluator(t, name, 1, "")
		ss := fixtureSamples(t, em, 512, 5)
		var want []float64
		for _, s := range ss {
			l, _, err := one.Score(s)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, l)
		}
		ran := 0
		for _, attn := range parallel.Names() {
			for _, P := range []int{2, 4} {
				h := model.Heads{N: em.Config.NHeads, KV: em.Config.NKVHeads, Dim: em.Config.HeadDim}
				if err := parallel.Check(attn, h, P); err != nil {
					t.Logf("%s: %s on %d ranks refused: %v", name, attn, P, err)
					continue
				}
				ran++
				t.Run(fmt.Sprintf("%s/%s/P%d", name, attn, P), func(t *testing.T) {
					ev, _ := hfEvaluator(t, name, P, attn)
					worst := 0.0
					for i, s := range ss {
						l, n, err := ev.Score(s)
						if err != nil {
							t.Fatal(err)
						}
						d := relDiff(l, want[i])
						worst = max(worst, d)
						if n != len(s.Targets) || d > 1e-6 {
							t.Errorf("doc %d (%d tokens): loss sum %.9g over %d tokens, one worker %.9g (rel diff %.2e)", i, len(s.IDs), l, n, want[i], d)
						}
					}
					t.Logf("worst relative difference from one worker: %.2e", worst)
				})
			}
		}
		if ran < 10 {
			t.Errorf("%s: only %d schedule × P combinations ran", name, ran)
		}
	}
}

// TestEvalDynamicRopeSequenceParallel: dynamic NTK RoPE depends on the length of the whole
// sequence, which a sequence-parallel rank does not see (it holds a slice of the positions,
// padded). On 2 and 4 ranks every sample's loss equals the one-worker loss (1e-6 relative, the
// schedules' own tolerance), and the scaling is active: the losses differ from plain RoPE's by more than 1e-5.
func TestEvalDynamicRopeSequenceParallel(t *testing.T) {
	plain, em := hfEvaluator(t, "llama-sharded", 1, "")
	ss := fixtureSamples(t, em, 512, 5)
	cfg := em.Config
	cfg.RopeScaling = model.RopeScaling{Type: "dynamic", Factor: 4, OriginalMaxPositionEmbeddings: 16}
	if err := cfg.Resolve(); err != nil {
		t.Fatal(err)
	}
	evaluator := func(P int, attn string) *evaluate.Evaluator {
		par := config.Default().Parallelism
		par.WorldSize, par.SequenceParallelDegree, par.Attention = P, P, attn
		ev, err := evaluate.Local(cfg, par, em.Params)
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	one := evaluator(1, "")
	var want []float64
	for i, s := range ss {
		l, _, err := one.Score(s)
		if err != nil {
			t.Fatal(err)
		}
		p, _, err := plain.Score(s)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.IDs) > 16 && relDiff(l, p) < 1e-5 {
			t.Errorf("doc %d (%d tokens): dynamic loss %.9g is plain RoPE's %.9g", i, len(s.IDs), l, p)
		}
		want = append(want, l)
	}
	for _, attn := range parallel.Names() {
		for _, P := range []int{2, 4} {
			h := model.Heads{N: cfg.NHeads, KV: cfg.NKVHeads, Dim: cfg.HeadDim}
			if err := parallel.Check(attn, h, P); err != nil {
				continue
			}
			t.Run(fmt.Sprintf("%s/P%d", attn, P), func(t *testing.T) {
				ev := evaluator(P, attn)
				for i, s := range ss {
					l, _, err := ev.Score(s)
					if err != nil {
						t.Fatal(err)
					}
					if d := relDiff(l, want[i]); d > 1e-6 {
						t.Errorf("doc %d (%d tokens): loss sum %.9g, one worker %.9g (rel diff %.2e)", i, len(s.IDs), l, want[i], d)
					}
				}
			})
		}
	}
}

// worstRel is the largest relative difference of got from want, element by element.
func worstRel(got, want []float64) float64 {
	worst := 0.0
	for i := range want {
		worst = math.Max(worst, math.Abs(got[i]-want[i])/want[i])
	}
	return worst
}
