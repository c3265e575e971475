package plan

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"distflash/ckpt"
	"distflash/config"
	"distflash/data"
	"distflash/kernels"
	"distflash/model"
	"distflash/parallel"
	"distflash/parallel/transport"
)

// megatronCommElems is the communication of Megatron-LM sequence + tensor parallelism for one
// layer's forward and backward (DistFlashAttn App. C): six all-gathers and four
// reduce-scatters of an N/P × d tensor, (P−1)/P·N·d elements each per worker, so 10·N·d, and
// 14·N·d when activation checkpointing repeats the forward's four collectives. The paper
// writes the (P−1)/P → 1 limit; like it, this counts what one worker moves.
func megatronCommElems(N, d float64, P int, recompute bool) float64 {
	c := 10.0
	if recompute {
		c = 14
	}
	return c * N * d * float64(P-1) / float64(P)
}

// distflashPaperCommElems is DistFlashAttn's own App. C figure for one layer, forward and
// backward, causal: N·d forward (half of the K/V chunks are masked) plus 2·N·d backward
// (keys, values and their gradients), 3·N·d, with the same per-worker accounting as
// megatronCommElems. Rematerialization-aware checkpointing keeps it at 3·N·d.
func distflashPaperCommElems(N, d float64) float64 { return 3 * N * d }

func loadPlanConfig(t *testing.T, path string, sets ...string) config.Config {
	t.Helper()
	cfg, err := config.Load(path, sets)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func mustCluster(t *testing.T, s string) Cluster {
	t.Helper()
	c, err := ParseCluster(s)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPlanRefusesUlysses33Heads: Ulysses needs the heads divisible by the ranks; 33 heads on
// 16 ranks are refused with a reason that names the heads.
func TestPlanRefusesUlysses33Heads(t *testing.T) {
	cfg := loadPlanConfig(t, "../configs/llama-33h.toml")
	pl := PlanFor(cfg, mustCluster(t, "2x8xA100-80GB"), "ulysses", cfg.Data.SeqLen)
	if pl.Refused == "" || !strings.Contains(pl.Refused, "head") {
		t.Fatalf("ulysses on 33 heads, 16 ranks: refused = %q", pl.Refused)
	}
	if pl := PlanFor(cfg, mustCluster(t, "2x8xA100-80GB"), "distflash", cfg.Data.SeqLen); pl.Refused != "" {
		t.Fatalf("distflash refused 33 heads: %s", pl.Refused)
	}
}

// TestPlanAppendixCCommunication checks DistFlashAttn App. C with the schedules' own traffic,
// measured by plan on LLaMA-7B's heads (MHA, 32 × 128, d = 4096) over P = 16 ranks and
// extrapolated to N = 512K tokens. The paper's volumes count what one worker moves, so the
// measured sum over ranks is divided by P. DistFlashAttn's measured per-worker volume is
// within 10% of 3·N·d·(P−1)/P and far below Megatron-LM's 10·N·d and 14·N·d; even the
// busiest rank stays under half of Megatron-LM's 10·N·d.
func TestPlanAppendixCCommunication(t *testing.T) {
	const P = 16
	h := model.Heads{N: 32, KV: 32, Dim: 128}
	N, d := float64(512<<10), float64(h.N*h.Dim)
	tr, err := measureTraffic("distflash", h, P, 0, 0, kernels.FP32)
	if err != nil {
		t.Fatal(err)
	}
	fwd, bwd, total := tr.at(N, 1)
	perWorker := total / 4 / P // fp32 bytes → elements, sum over ranks → per worker
	busiest := (fwd + bwd) / 4
	want := distflashPaperCommElems(N, d) * (P - 1) / P
	t.Logf("distflash per worker %.3f·Nd (paper 3·Nd·(P−1)/P = %.3f·Nd), busiest rank %.3f·Nd; Megatron %.3f·Nd / %.3f·Nd",
		perWorker/(N*d), want/(N*d), busiest/(N*d), megatronCommElems(N, d, P, false)/(N*d), megatronCommElems(N, d, P, true)/(N*d))
	if r := perWorker / want; r < 0.9 || r > 1.1 {
		t.Errorf("distflash per-worker volume %.3f·Nd is not within 10%% of 3·Nd·(P−1)/P", perWorker/(N*d))
	}
	if mega := megatronCommElems(N, d, P, false); !(perWorker < mega/3 && busiest < mega/2) {
		t.Errorf("distflash %.3g (busiest %.3g) elements is not far below Megatron-LM's 10Nd = %.3g", perWorker, busiest, mega)
	}
	if mega14 := megatronCommElems(N, d, P, true); !(perWorker < mega14/4.5) {
		t.Errorf("distflash %.3g elements: the paper's 4.7× reduction against 14Nd = %.3g does not hold", perWorker, mega14)
	}
}

// TestPlanBurstTable1: BurstAttention Table 1 / §3.3: forward 2·B·Z·N·d (K and V around the
// ring), backward 3·B·Z·N·d + 2·B·N·Z/G (Q, dQ, dO and the statistics D, lse); per worker,
// with the (P−1)/P of P−1 ring hops. Z·d is the hidden width.
func TestPlanBurstTable1(t *testing.T) {
	const P = 8
	h := model.Heads{N: 8, KV: 8, Dim: 64}
	tr, err := measureTraffic("burst", h, P, 0, 0, kernels.FP32)
	if err != nil {
		t.Fatal(err)
	}
	N, Zd, Z := float64(64<<10), float64(h.N*h.Dim), float64(h.N)
	f := float64(P-1) / P
	fwdTot := (tr.fwdTotA*N + tr.fwdTotB) / 4 / P
	bwdTot := (tr.bwdTotA*N + tr.bwdTotB) / 4 / P
	if want := 2 * Zd * N * f; math.Abs(fwdTot/want-1) > 0.02 {
		t.Errorf("burst forward %.4g elements per worker, Table 1 2·Z·N·d·(P−1)/P = %.4g", fwdTot, want)
	}
	if want := (3*Zd*N + 2*N*Z) * f; math.Abs(bwdTot/want-1) > 0.02 {
		t.Errorf("burst backward %.4g elements per worker, Table 1 (3·Z·N·d + 2·N·Z)·(P−1)/P = %.4g", bwdTot, want)
	}
}

// TestPlanIdleFractions: the §3.2 idle fractions, and the step-time model stretching the
// attention compute by 1/(1 − idle).
func TestPlanIdleFractions(t *testing.T) {
	for _, c := range []struct {
		name string
		P    int
		want float64
	}{
		{"ring", 8, (64.0 - 8) / 128}, {"burst", 8, 56.0 / 128}, {"ring", 1, 0},
		{"distflash", 8, 1.0 / 16}, {"distflash", 16, 1.0 / 32}, {"distflash", 7, 0},
		{"zigzag", 8, 0}, {"attn2d", 8, 0}, {"ulysses", 8, 0},
	} {
		if got := IdleFraction(c.name, c.P); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("IdleFraction(%s, %d) = %g, want %g", c.name, c.P, got, c.want)
		}
	}
	if r := IdleFraction("ring", 1000); math.Abs(r-0.5) > 1e-3 {
		t.Errorf("ring idle fraction → 1/2 for large P, got %g at P=1000", r)
	}
	cfg := loadPlanConfig(t, "../configs/llama7b-512k.toml")
	cl := mustCluster(t, "2x8xA100-80GB")
	attnTime := func(name string) (float64, Plan) {
		pl := PlanFor(cfg, cl, name, cfg.Data.SeqLen)
		return component(t, pl, "attention").Seconds, pl
	}
	base, _ := attnTime("zigzag")
	for _, name := range []string{"ring", "distflash"} {
		got, pl := attnTime(name)
		if want := base / (1 - IdleFraction(name, 16)); math.Abs(got/want-1) > 1e-9 || pl.Time.IdleFraction != IdleFraction(name, 16) {
			t.Errorf("%s attention time %.3f s, want %.3f s (zigzag's / (1 − idle))", name, got, want)
		}
	}
}

// TestPlanLLaMA7BFits: LLaMA-7B at 32K tokens per GPU, FSDP over 16 A100-80GB, attn_output
// checkpointing fits in 80 GB (the paper's Table 1 setting); without checkpointing the saved
// activations are larger (and do not fit).
func TestPlanLLaMA7BFits(t *testing.T) {
	cl := mustCluster(t, "2x8xA100-80GB")
	cfg := loadPlanConfig(t, "../configs/llama7b-512k.toml")
	pl := PlanFor(cfg, cl, "distflash", cfg.Data.SeqLen)
	if pl.TokensPerGPU != 32<<10 || !cfg.Parallelism.FSDP || cfg.Parallelism.WorldSize != 16 {
		t.Fatalf("setting: %d tokens per GPU, fsdp %v, world %d", pl.TokensPerGPU, cfg.Parallelism.FSDP, cfg.Parallelism.WorldSize)
	}
	if !pl.Memory.Fits || pl.Memory.Peak > 80e9 {
		t.Errorf("LLaMA-7B 32K/GPU attn_output: peak %.1f GB does not fit 80 GB", pl.Memory.Peak/1e9)
	}
	if pl.MaxSeqPerGPU < 32<<10 {
		t.Errorf("longest sequence per GPU %d < 32K", pl.MaxSeqPerGPU)
	}
	none := PlanFor(loadPlanConfig(t, "../configs/llama7b-512k.toml", "checkpoint.activation=none"), cl, "distflash", cfg.Data.SeqLen)
	if !(none.Memory.Activations > pl.Memory.Activations) || none.Memory.Fits {
		t.Errorf("checkpoint none: activations %.1f GB (attn_output %.1f GB), fits %v", none.Memory.Activations/1e9, pl.Memory.Activations/1e9, none.Memory.Fits)
	}
	layer := PlanFor(loadPlanConfig(t, "../configs/llama7b-512k.toml", "checkpoint.activation=layer"), cl, "distflash", cfg.Data.SeqLen)
	if !(layer.Memory.Activations < pl.Memory.Activations) || !(layer.Time.AttnFLOPs > pl.Time.AttnFLOPs) || !(layer.Comm.Attention > pl.Comm.Attention) {
		t.Errorf("checkpoint layer should save less, and recompute attention and its communication: %+v vs %+v", layer, pl)
	}
}

// TestPlanActFieldsCoverLayerActs: every field of model.LayerActs has a size in actFields, so
// the memory model follows the struct.
func TestPlanActFieldsCoverLayerActs(t *testing.T) {
	for _, f := range reflect.VisibleFields(reflect.TypeFor[model.LayerActs]()) {
		if _, ok := actFields[f.Name]; !ok {
			t.Errorf("model.LayerActs.%s has no size in actFields", f.Name)
		}
	}
	for _, kept := range keptFields {
		for _, n := range kept {
			if _, ok := actFields[n]; !ok {
				t.Errorf("keptFields names unknown field %s", n)
			}
		}
	}
}

// TestPlanFlags: cluster and sweep parsing, and errors that name the problem.
func TestPlanFlags(t *testing.T) {
	c, err := ParseCluster("2x8xH100-80GB")
	if err != nil || c.GPUs() != 16 || c.GPU.FLOPS != 989e12 {
		t.Errorf("ParseCluster: %+v, %v", c, err)
	}
	for _, bad := range []string{"2x8", "0x8xA100-80GB", "2x8xV100"} {
		if _, err := ParseCluster(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseCluster(%q): %v", bad, err)
		}
	}
	seqs, err := ParseSweep("seq_len=8K..512K")
	if err != nil || len(seqs) != 7 || seqs[0] != 8192 || seqs[6] != 512<<10 {
		t.Errorf("parseSweep: %v, %v", seqs, err)
	}
	if _, err := ParseSweep("batch=1..2"); err == nil {
		t.Error("parseSweep accepted a key other than seq_len")
	}
}

// loaderDocWindows draws a stream of documents with lengths from d (its own draws, not
// plan's sampler), writes it as tokens with a boundary token (0) starting each document,
// and returns the document starts of windows of T tokens as data.Loader yields them
// (SetBoundary, data.DocStarts): the batches training would see.
func loaderDocWindows(t *testing.T, d DocLengths, T, windows int, seed uint64) [][]int32 {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 77))
	tokens := make([]int32, 0, T*windows+1)
	for len(tokens) < cap(tokens) {
		var n int
		switch d.Dist {
		case "lognormal":
			n = int(math.Round(math.Exp(math.Log(d.Mean) - webDocSigma*webDocSigma/2 + webDocSigma*r.NormFloat64())))
		case "exponential":
			n = int(math.Round(-d.Mean * math.Log(1-r.Float64())))
		default:
			n = int(d.Mean)
		}
		tokens = append(tokens, 0)
		for i := 1; i < n && len(tokens) < cap(tokens); i++ {
			tokens = append(tokens, 1)
		}
	}
	l, err := data.NewLoader(tokens, T, 1, seed)
	if err != nil {
		t.Fatal(err)
	}
	l.SetBoundary(0)
	var out [][]int32
	for range windows {
		out = append(out, l.Next().DocStart)
	}
	return out
}

// TestPlanDocumentsMatchParallel: plan's visible fraction (closed form) and its idle
// fractions (its own seeded windows through parallel.DocumentTime, with and without
// parallel.BalanceDocuments) against what the parallel package counts on the windows
// data.Loader cuts from an independently drawn stream of documents. Tolerances: the visible
// fraction within 3 standard errors of the loader windows' mean plus 2% (the closed form
// treats lengths as continuous); idle fractions within 0.04 absolute (both sides are sample
// estimates of a heavy-tailed process: the log-normal's longest documents decide the
// largest rank; 256 windows each, they differ by at most 0.021 here, while the causal
// idle or a fixed-length visible fraction would miss by 0.09 and 3.5×). The step time falls by the visible fraction stretched by the new idle.
func TestPlanDocumentsMatchParallel(t *testing.T) {
	if testing.Short() {
		t.Skip("slow; in -short, TestPlanDocumentIdleMatchesCounters holds the documents' idle to parallel's counters")
	}
	const T, P, windows = 4096, 4, 256
	for _, d := range []DocLengths{{Dist: "lognormal", Mean: 256}, {Dist: "exponential", Mean: 512}, {Dist: "fixed", Mean: 300}} {
		ws := loaderDocWindows(t, d, T, windows, 5)
		var fr []float64
		for _, w := range ws {
			var pairs float64
			for p, s := range w {
				pairs += float64(p - int(s) + 1)
			}
			fr = append(fr, pairs/(T*(T+1)/2))
		}
		mean, se := meanSE(fr)
		vis := d.VisibleFraction(T, 0)
		if tol := 3*se + 0.02*mean; math.Abs(vis-mean) > tol {
			t.Errorf("%v: plan's visible fraction %.5f, loader windows %.5f ± %.5f (tolerance %.5f)", d, vis, mean, se, tol)
		}
		t.Logf("%v: visible %.5f plan, %.5f ± %.5f loader windows (fixed length: %.5f)", d, vis, mean, se, DocLengths{Dist: "fixed", Mean: d.Mean}.VisibleFraction(T, 0))
		for _, name := range []string{"ring", "zigzag", "burst", "attn2d", "distflash"} {
			var sum, worst, sumB, worstB float64
			for i, w := range ws {
				span, busy, err := parallel.DocumentTime(w, name, P)
				if err != nil {
					t.Fatal(err)
				}
				_, bal, err := parallel.BalanceDocuments(w, name, P, uint64(i))
				if err != nil {
					t.Fatal(err)
				}
				spanB, busyB, err := parallel.DocumentTime(bal, name, P)
				if err != nil {
					t.Fatal(err)
				}
				sum, worst = sum+float64(busy)/P, worst+float64(span)
				sumB, worstB = sumB+float64(busyB)/P, worstB+float64(spanB)
			}
			idle, idleB := 1-sum/worst, 1-sumB/worstB
			dp, err := planDocuments(d, name, P, T, 0, false)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(dp.Idle-idle) > 0.04 || math.Abs(dp.IdleBalanced-idleB) > 0.04 {
				t.Errorf("%v %s: plan idle %.3f / balanced %.3f, loader windows %.3f / %.3f", d, name, dp.Idle, dp.IdleBalanced, idle, idleB)
			}
			t.Logf("%v %s: idle %.3f plan, %.3f loader; balanced %.3f plan, %.3f loader", d, name, dp.Idle, idle, dp.IdleBalanced, idleB)
		}
	}

	// The step: attention FLOPs × visible, stretched by the documents' idle, not the causal one.
	cfg := loadPlanConfig(t, "../configs/tiny-sp4.toml", "data.seq_len=4096", "model.max_seq_len=4096",
		"data.document_mask=true", "parallelism.balance_documents=true")
	cl := mustCluster(t, "1x4xA100-80GB")
	causal := PlanWithDocs(cfg, cl, "zigzag", T, nil)
	d := DocLengths{Dist: "lognormal", Mean: 256}
	docs := PlanWithDocs(cfg, cl, "zigzag", T, &d)
	if docs.Docs == nil || !docs.Docs.Balanced || docs.Time.IdleFraction != docs.Docs.IdleBalanced {
		t.Fatalf("balance_documents on: plan uses idle %g, documents %+v", docs.Time.IdleFraction, docs.Docs)
	}
	if got, want := docs.Time.AttnFLOPs/causal.Time.AttnFLOPs, d.VisibleFraction(T, 0); math.Abs(got/want-1) > 1e-12 {
		t.Errorf("attention FLOPs scaled by %g, want the visible fraction %g", got, want)
	}
	attn := component(t, docs, "attention")
	want := causal.Time.Compute - component(t, causal, "attention").Seconds + docs.Time.AttnFLOPs/attn.Rate/(1-docs.Docs.IdleBalanced)
	if math.Abs(docs.Time.Compute/want-1) > 1e-12 || !(docs.Time.Compute < causal.Time.Compute) {
		t.Errorf("compute %g s with documents, want %g (causal %g)", docs.Time.Compute, want, causal.Time.Compute)
	}
	if !(docs.Time.Step < causal.Time.Step) {
		t.Errorf("step %g s with documents, causal %g s: want it to fall", docs.Time.Step, causal.Time.Step)
	}
}

// meanSE returns the mean of xs and its standard error.
func meanSE(xs []float64) (mean, se float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	var v float64
	for _, x := range xs {
		v += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(v / float64(len(xs)-1) / float64(len(xs)))
}

// TestPlanDocumentWindowLimit: a sequence longer than plan samples documents for is refused,
// naming the limit.
func TestPlanDocumentWindowLimit(t *testing.T) {
	cfg := loadPlanConfig(t, "../configs/tiny-sp4.toml")
	if pl := PlanWithDocs(cfg, mustCluster(t, "1x4xA100-80GB"), "ring", 2*maxDocWindow, &DocLengths{Dist: "fixed", Mean: 100}); !strings.Contains(pl.Refused, "at most") {
		t.Errorf("seq_len %d with documents: refused = %q, want the sampling limit named", 2*maxDocWindow, pl.Refused)
	}
}

// TestPlanDocumentIdleMatchesCounters: the per-rank work model plan measures idle with
// (parallel.DocumentWork) against what the schedules compute, read from each rank's attention
// FLOPs counters after a forward and backward on data.Loader windows of documents. The
// counters count whole 64×128 tiles that hold a visible pair, so with documents of a few
// hundred tokens they count well above the visible pairs, and that excess, spread over the
// ranks like the tokens, dilutes the imbalance: the counters' idle is lower than
// DocumentWork's, by 0.08–0.09 here (mean 512 in 4K windows). Asserted for the schedules
// (distflash's helper blocks included, where they run): the counters' idle at most 0.02
// above DocumentWork's and at most 0.12 below.
func TestPlanDocumentIdleMatchesCounters(t *testing.T) {
	const T, P, windows = 4096, 4, 8
	h := model.Heads{N: 1, KV: 1, Dim: 8}
	ws := loaderDocWindows(t, DocLengths{Dist: "lognormal", Mean: 512}, T, windows, 9)
	for _, name := range []string{"ring", "zigzag", "burst", "attn2d", "distflash"} {
		var sum, worst, sumC, worstC float64
		for _, starts := range ws {
			work, err := parallel.DocumentWork(starts, name, P)
			if err != nil {
				t.Fatal(err)
			}
			s, m := meanMax(work)
			sum, worst = sum+s, worst+m
			flops := make([]int64, P)
			pass := schedulePass{Name: name, Opt: parallel.Options{Overlap: true}, Heads: h, P: P, T: T, DocStart: starts,
				Backward: func(c transport.Comm, be kernels.Backend) {
					cs := be.Counters().Snapshot()
					flops[c.Rank()] = cs.AttnFwdFLOPs + cs.AttnBwdFLOPs
				}}
			if err := pass.run(); err != nil {
				t.Fatal(err)
			}
			s, m = meanMax(flops)
			sumC, worstC = sumC+s, worstC+m
		}
		idle, idleC := 1-sum/worst, 1-sumC/worstC
		// DocumentWork weighs a visible pair 14 (4 forward + 10 backward), the counters 14·hd.
		t.Logf("%s: idle %.3f by DocumentWork, %.3f by the FLOPs counters, which count %.2f× the visible pairs",
			name, idle, idleC, sumC/float64(h.Dim)/sum)
		if idleC > idle+0.02 || idleC < idle-0.12 {
			t.Errorf("%s: idle %.3f by DocumentWork, %.3f by the schedule's FLOPs counters", name, idle, idleC)
		}
	}
}

// TestGPUByDevice: the names CUDA gives its devices find their preset, of A100's two the one
// whose memory the name gives; a name of no preset finds none, and its peak is 0.
func TestGPUByDevice(t *testing.T) {
	for _, tc := range []struct{ device, want string }{
		{"NVIDIA H100 80GB HBM3", "H100-80GB"},
		{"NVIDIA H200", "H200-141GB"},
		{"NVIDIA A100-SXM4-80GB", "A100-80GB"},
		{"NVIDIA A100-PCIE-40GB", "A100-40GB"},
		{"NVIDIA GeForce RTX 4090", ""},
	} {
		g, ok := GPUByDevice(tc.device)
		if ok != (tc.want != "") || g.Name != tc.want {
			t.Errorf("%q: %q (%v), want %q", tc.device, g.Name, ok, tc.want)
		}
		if want := g.FLOPS; PeakFLOPS(tc.device) != want {
			t.Errorf("%q: peak %g, want the preset's %g", tc.device, PeakFLOPS(tc.device), want)
		}
	}
}

// TestEvalMemoryFSDP: an evaluation sharded over the world holds its 1/world of the weights
// and two gathered blocks instead of all of them; the rest of the estimate is the same.
func TestEvalMemoryFSDP(t *testing.T) {
	cfg, err := config.Load("../configs/llama7b-512k.toml", []string{"data.seq_len=65536"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Parallelism.FSDP = false
	whole := EvalMemoryFor(cfg, 1e12)
	cfg.Parallelism.FSDP = true
	sharded := EvalMemoryFor(cfg, 1e12)
	world := float64(cfg.Parallelism.WorldSize)
	m := cfg.Model
	block := float64(m.NumParams()-2*int64(m.VocabSize)*int64(m.Dim)-int64(m.Dim)) / float64(m.NLayers)
	if want := whole.Params/world + 2*block*4; math.Abs(sharded.Params-want) > 1 || world < 2 {
		t.Errorf("FSDP eval weights %.0f bytes over %g ranks, want %.0f", sharded.Params, world, want)
	}
	if sharded.Activations != whole.Activations || sharded.Logits != whole.Logits || sharded.AttnWork != whole.AttnWork {
		t.Errorf("FSDP changed what is not the weights: %+v vs %+v", sharded, whole)
	}
}

// TestPlanPhysicalOrder: a plan never ranks a GPU of a smaller peak above one of a larger peak
// on figures that are not measured (the A100's fractions are the measured Hopper ones), the
// detail says where the fractions come from, a thin margin gets a note, and a CPU cluster is
// described as CPU ranks, not GPUs on NVLink.
func TestPlanPhysicalOrder(t *testing.T) {
	cfg, err := config.Load("../configs/llama7b-512k.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	step := func(cluster string) (float64, string) {
		t.Helper()
		cl, err := ParseCluster(cluster)
		if err != nil {
			t.Fatal(err)
		}
		c, err := FitToCluster(cfg, cl)
		if err != nil {
			t.Fatal(err)
		}
		pl := PlanFor(c, cl, c.Parallelism.Attention, c.Data.SeqLen)
		var b strings.Builder
		WriteDetail(&b, Report{Summary: "x", Cluster: cl, Plans: []Plan{pl}})
		return pl.Time.Step, b.String()
	}
	a100, a100Text := step("2x8xA100-80GB")
	h100, h100Text := step("2x8xH100-80GB")
	if !(h100 < a100) {
		t.Errorf("2×8 H100 plans %.1f s a step, 2×8 A100 %.1f s", h100, a100)
	}
	if !strings.Contains(a100Text, "not measured on an A100") || !strings.Contains(h100Text, "predicted, not measured on distflash's 16-bit step") {
		t.Errorf("the cluster lines do not say where the fractions come from:\n%s\n%s", firstLine(a100Text, "cluster:"), firstLine(h100Text, "cluster:"))
	}
	// 512K tokens over 8 A100s leave 3% (2.1 GB, with the 16-bit step's packed activations,
	// issue 41; cuDNN's buffers take 6.5 GB a GPU at 64K tokens)
	cfg.Data.SeqLen = 512 << 10
	_, one := step("1x8xA100-80GB")
	if !strings.Contains(one, "note: a margin under 5%") {
		t.Errorf("1×8 A100 fits with a thin margin and no note:\n%s", firstLine(one, "fits in"))
	}
	cl, err := ParseCluster("2x2xcpu")
	if err != nil {
		t.Fatal(err)
	}
	cl.GPU.FLOPS = 1e10
	var b strings.Builder
	WriteDetail(&b, Report{Summary: "x", Cluster: cl, Plans: []Plan{{Attention: "ring", SeqLen: 1024, TokensPerGPU: 256, Refused: "-"}}})
	if line := firstLine(b.String(), "cluster:"); !strings.Contains(line, "4 CPU ranks") || strings.Contains(line, "NVLink") || strings.Contains(line, "GPU") {
		t.Errorf("a CPU cluster: %s", line)
	}
}

// component is plan pl's predicted compute time component name (gpuStepTime).
func component(t *testing.T, pl Plan, name string) TimeComponent {
	t.Helper()
	for _, c := range pl.Time.Components {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no %s component in %+v", name, pl.Time)
	return TimeComponent{}
}

// firstLine is the first line of s that contains sub.
func firstLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// TestMemoryProcessTerm: on the CPU the process outside its tensors is counted once per
// process and shared by its ranks (a fourth of it for each of 4 in-process ranks, the whole
// for an MPI rank), grows by 4 bytes a byte of data.max_bytes (an int32 token a byte at most)
// and 8 a window of data.seq_len (the loader's order), for each source of a mixture, counts the
// checkpoint writer's workers, and is absent on a GPU, whose memory holds no process.
func TestMemoryProcessTerm(t *testing.T) {
	base := loadPlanConfig(t, "../configs/tiny.toml", "data.max_bytes=1048576")
	one := MemoryFor(base, 1e12)
	writer := float64(ckpt.ProcessWorkers) * float64(ckpt.WorkerBytes(0))
	order := 8 * 1048576 / 128.0 // tiny.toml's data.seq_len is 128
	if want := ProcessBase + 4*1048576 + order + writer; one.Process != want {
		t.Errorf("one rank's process term %.0f bytes, want %.0f (base, 4 MiB of tokens, their window order, the writer)", one.Process, want)
	}
	mixed := base
	mixed.Data.Sources = []config.SourceConfig{{Path: "a", Weight: 1}, {Path: "b", Weight: 2}, {Path: "c", Format: "tokens", Weight: 1}}
	if got := MemoryFor(mixed, 1e12).Process - one.Process; got != 4*1048576+order {
		t.Errorf("a mixture of two text sources and one of shards holds %.0f bytes more than one source, want one source's %.0f more (the shards' count is not known)", got, 4*1048576+order)
	}
	if d := one.Peak - one.Process - one.Runtime; math.Abs(one.Runtime-gcHeadroom*d) > 1 {
		t.Errorf("collector headroom %.0f over the tensors' %.0f: the process term is counted in it", one.Runtime, d)
	}
	more := loadPlanConfig(t, "../configs/tiny.toml", "data.max_bytes=2097152")
	if got := MemoryFor(more, 1e12).Process - one.Process; got != 4*1048576+order {
		t.Errorf("1 MiB more of data.max_bytes adds %.0f bytes, want %.0f", got, 4*1048576+order)
	}
	four := loadPlanConfig(t, "../configs/tiny.toml", "data.max_bytes=1048576", "parallelism.world_size=4",
		"parallelism.sequence_parallel_degree=4")
	if got := MemoryFor(four, 1e12).Process; math.Abs(got-one.Process/4) > 1 {
		t.Errorf("4 in-process ranks: each %.0f bytes of the process, want a fourth of %.0f", got, one.Process)
	}
	four.Parallelism.Backend = "mpi"
	if got := MemoryFor(four, 1e12).Process; got != one.Process {
		t.Errorf("an MPI rank holds %.0f bytes of its process, want all %.0f", got, one.Process)
	}
	unbounded := base
	unbounded.Data.MaxBytes = 0
	if got := MemoryFor(unbounded, 1e12).Process; got != ProcessBase+writer {
		t.Errorf("data.max_bytes = 0: %.0f bytes, want the base and writer only (%.0f)", got, ProcessBase+writer)
	}
	gpu := base
	gpu.Device.Kind = "cuda"
	if m := MemoryFor(gpu, 1e12); m.Process != 0 || m.Runtime != 0 {
		t.Errorf("on a GPU: process %.0f and headroom %.0f bytes, want none", m.Process, m.Runtime)
	}
	if m := EvalMemoryFor(base, 1e12); m.Process != ProcessBase {
		t.Errorf("eval's process term %.0f bytes, want ProcessBase (no training data or writer)", m.Process)
	}
}

// TestPlanAttnKernel: the memory of the 16-bit attention, by what runs it: nothing in float32;
// in bf16 the operands the schedules keep packed (q, k, v, O, dO), and on the CPU their float32
// widening for a call; on a GPU with the own kernel the packed operands alone; with cuDNN its
// outputs, O′, dO, dq, dk, dv, the statistics and the float32 dQ accumulator besides, or the
// deterministic backward's capped workspace instead of the accumulator. It is in the peak and
// the detail.
func TestPlanAttnKernel(t *testing.T) {
	cfg, err := config.Load("../configs/llama-1b.toml", []string{"data.seq_len=8192"})
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.Model
	n, q, kv, h := 8192.0, float64(m.QDim()), float64(m.KVDim()), float64(m.NHeads)
	packed := 2 * n * (3*q + 2*kv)
	cudnn := packed + 2*n*(3*q+2*kv) + 8*h*n + 4*n*q + 4*h*n
	for _, c := range []struct {
		name string
		edit func(*config.Config)
		want float64
	}{
		{"cpu fp32", func(c *config.Config) { c.Device.Kind, c.Training.MixedPrecision = "cpu", "fp32" }, 0},
		{"cpu bf16", func(c *config.Config) { c.Device.Kind = "cpu" }, packed + 4*n*(2*q+2*kv)},
		{"cuda fp32", func(c *config.Config) { c.Training.MixedPrecision = "fp32" }, 0},
		{"cuda bf16, own kernel", func(c *config.Config) { c.Device.Attention = "own" }, packed},
		{"cuda bf16, cuDNN", func(c *config.Config) {}, cudnn},
		{"cuda bf16, cuDNN deterministic", func(c *config.Config) { c.Device.DeterministicAttention = true },
			cudnn - 4*n*q + CUDNNDeterministicCap},
	} {
		cc := cfg
		c.edit(&cc)
		mp := MemoryFor(cc, 80e9)
		if math.Abs(mp.AttnKernel-c.want) > 1 {
			t.Errorf("%s: 16-bit attention %.0f bytes, want %.0f", c.name, mp.AttnKernel, c.want)
		}
		others := mp.Params + mp.Grads + mp.Optimizer + mp.Activations + mp.Logits + mp.BackwardScratch + mp.AttnWork + mp.CommBuffers
		if cc.Device.Kind == "cpu" {
			others = (others+mp.AttnKernel)*(1+gcHeadroom) + mp.Process - mp.AttnKernel
		}
		if math.Abs(mp.Peak-others-mp.AttnKernel) > 1 {
			t.Errorf("%s: peak %.0f is not the sum with the 16-bit attention's %.0f", c.name, mp.Peak, mp.AttnKernel)
		}
	}
	cl, err := ParseCluster("1x1xH100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	WriteDetail(&b, Report{Summary: "x", Cluster: cl, Plans: []Plan{PlanFor(cfg, cl, "distflash", 8192)}})
	if line := firstLine(b.String(), "attention 16-bit"); !strings.Contains(line, "cuDNN") {
		t.Errorf("the detail has no 16-bit attention line: %q", line)
	}
	if e := EvalMemoryFor(cfg, 80e9); e.AttnKernel <= 0 || e.AttnKernel >= cudnn {
		t.Errorf("evaluation's 16-bit attention %.0f bytes: want the forward's, under training's %.0f", e.AttnKernel, cudnn)
	}
}
