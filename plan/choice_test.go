package plan

import (
	"math"
	"slices"
	"strings"
	"testing"

	"distflash/config"
)

// TestChooseLeastRecomputation (issue 41, change 7): checkpoint.activation = "auto" takes the
// policy that recomputes least among those whose step fits 90% of the device by MemoryFor's
// estimate, and the MLP and the logits whole where they fit so. The 0.85B of
// configs/llama-1b.toml in bf16 on an 80 GB H100: none, whole, up to 32K tokens; none with its
// MLP in tiles (each tile's gate and up recomputed: less than attn_output's projections) at
// 64K; attn_output at 128K; layer at 256K, and at 512K layer though nothing fits, said so.
// Every choice is the first candidate, in the order of recomputation, that fits, and its peak
// is MemoryFor's of the config it gives.
func TestChooseLeastRecomputation(t *testing.T) {
	base := loadPlanConfig(t, "../configs/llama-1b.toml", "checkpoint.activation=auto")
	const h100 = 80e9
	for _, c := range []struct {
		seq         int
		policy      string
		tile, chunk int // 0: whole
		fits        bool
	}{
		{8 << 10, "none", 0, 0, true},
		{32 << 10, "none", 0, 0, true},
		{64 << 10, "none", config.AutoMLPTile(5632), config.AutoLossChunk(32000), true},
		{128 << 10, "attn_output", 0, config.AutoLossChunk(32000), true},
		{256 << 10, "layer", config.AutoMLPTile(5632), config.AutoLossChunk(32000), true},
		{512 << 10, "layer", config.AutoMLPTile(5632), config.AutoLossChunk(32000), false},
	} {
		cfg := base
		cfg.Data.SeqLen, cfg.Model.MaxSeqLen = c.seq, c.seq
		ch := Choose(cfg, h100)
		got := ch.Candidate
		if got.Policy != c.policy || got.MLPTile != c.tile || got.LossChunk != c.chunk || got.Fits != c.fits {
			t.Errorf("%s: chose %+v, want %s, tile %d, chunk %d, fits %v", seqName(c.seq), got, c.policy, c.tile, c.chunk, c.fits)
		}
		if want := MemoryFor(got.Apply(cfg), h100).Peak; got.Peak != want {
			t.Errorf("%s: the choice's peak %.4g, MemoryFor's of its config %.4g", seqName(c.seq), got.Peak, want)
		}
		if ch.Budget != SafeCapacity(h100) || got.Fits != (got.Peak <= ch.Budget) {
			t.Errorf("%s: budget %.4g, peak %.4g, fits %v", seqName(c.seq), ch.Budget, got.Peak, got.Fits)
		}
		// the policies weighed before the one taken do not fit; those after need less
		if len(ch.Others) != 2 {
			t.Fatalf("%s: %d other policies weighed: %+v", seqName(c.seq), len(ch.Others), ch.Others)
		}
		order := slices.Index(autoPolicies, got.Policy)
		for _, o := range ch.Others {
			if before := slices.Index(autoPolicies, o.Policy) < order; before && o.Fits {
				t.Errorf("%s: %s fits (%.4g) but %s was taken", seqName(c.seq), o.Policy, o.Peak, got.Policy)
			}
		}
		text := ch.String()
		want := "checkpoint.activation = auto → " + c.policy + ": " + gb1(got.Peak) + " of " + gb1(ch.Budget) + " (90% of 80.0 GB)"
		if !c.fits {
			want = "checkpoint.activation = auto → layer: DOES NOT FIT: " + gb1(got.Peak) + " of " + gb1(ch.Budget)
		}
		if !strings.HasPrefix(text, want) || !strings.Contains(text, "training.mlp_tile = -1 → ") || !strings.Contains(text, "training.loss_chunk = -1 → ") {
			t.Errorf("%s: %q\nwant it to begin %q and say the tile and the chunk", seqName(c.seq), text, want)
		}
		for _, o := range ch.Others {
			if !strings.Contains(text, o.Policy+" "+gb1(o.Peak)) {
				t.Errorf("%s: %q does not give %s's estimate %s", seqName(c.seq), text, o.Policy, gb1(o.Peak))
			}
		}
	}
}

// TestChooseWhatTheConfigLeaves: a policy, tile or chunk the config sets is kept, and only the
// keys it leaves are decided (and said); a config that leaves nothing gets its own values and
// no line; where the memory is not known auto takes attn_output with the 256 MiB tile and chunk.
func TestChooseWhatTheConfigLeaves(t *testing.T) {
	base := loadPlanConfig(t, "../configs/llama-1b.toml", "checkpoint.activation=attn_output") // tile and chunk -1
	ch := Choose(base, 80e9)
	if ch.Policy != "attn_output" || ch.MLPTile != 0 || ch.LossChunk != 0 || !slices.Equal(ch.Auto, []string{"training.mlp_tile", "training.loss_chunk"}) || len(ch.Others) != 0 {
		t.Errorf("attn_output set, tile and chunk left: %+v", ch)
	}
	if s := ch.String(); !strings.HasPrefix(s, "training.mlp_tile = -1 → the MLP whole: the step takes ") || strings.Contains(s, "checkpoint.activation") {
		t.Errorf("attn_output set: %q", s)
	}
	set := loadPlanConfig(t, "../configs/llama-1b.toml", "checkpoint.activation=attn_output", "training.mlp_tile=1024", "training.loss_chunk=0")
	if ch := Choose(set, 80e9); ch.Policy != "attn_output" || ch.MLPTile != 1024 || ch.LossChunk != 0 || len(ch.Auto) != 0 || ch.String() != "" {
		t.Errorf("everything set: %+v %q", ch, ch.String())
	}
	if IsAuto(set) || !IsAuto(base) {
		t.Errorf("IsAuto: set %v, left %v", IsAuto(set), IsAuto(base))
	}
	auto := loadPlanConfig(t, "../configs/llama-1b.toml", "checkpoint.activation=auto")
	ch = Choose(auto, 0)
	if ch.Policy != "attn_output" || ch.MLPTile != config.AutoMLPTile(5632) || ch.LossChunk != config.AutoLossChunk(32000) || ch.Fits {
		t.Errorf("memory not known: %+v", ch)
	}
	if s := ch.String(); !strings.Contains(s, "auto → attn_output: the device's memory is not known") || !strings.Contains(s, "tiles of 3968 tokens") {
		t.Errorf("memory not known: %q", s)
	}
	// MemoryFor of an auto config is that of the config its choice gives, and the eval during
	// training must fit too
	if got, want := MemoryFor(auto, 80e9), MemoryFor(Resolved(auto, 80e9), 80e9); got != want {
		t.Errorf("MemoryFor(auto) %+v, of its choice %+v", got, want)
	}
	ev := auto
	ev.Eval.Interval, ev.Eval.SeqLen, ev.Model.MaxSeqLen = 10, 64<<10, 64<<10
	if a, b := Choose(auto, 80e9), Choose(ev, 80e9); a.Policy != "none" || b.Peak <= a.Peak {
		t.Errorf("an evaluation of 64K tokens during training: %+v, without %+v: want a larger peak", b, a)
	}
}

// TestStepTimeComponents (issue 41): a GPU's predicted step is GEMMs, attention, the other
// kernels' bytes and the optimizer phase's, each at its rate, summing to the compute time; the
// 0.85B at 8K counts the review's GEMM FLOPs (38.68 TFLOP without recomputation, 47.48 under
// attn_output: its §8), attention FLOPs (15.39 TFLOP) and the fused optimizer phase's 34
// bytes a parameter (AdamW 28, the bf16 copy 2, Σg² and finiteness 4). The figures are the
// review's, counted independently of this code, and within 0.1%.
func TestStepTimeComponents(t *testing.T) {
	cl := mustCluster(t, "1x1xH100-80GB")
	for _, c := range []struct {
		policy string
		gemm   float64
	}{{"none", 38.68e12}, {"attn_output", 47.48e12}} {
		cfg := loadPlanConfig(t, "../configs/llama-1b.toml", "checkpoint.activation="+c.policy, "training.mlp_tile=0", "training.loss_chunk=0")
		pl := PlanFor(cfg, cl, "distflash", 8192)
		sum := 0.0
		for _, tc := range pl.Time.Components {
			sum += tc.Seconds
			if tc.Rate <= 0 || math.Abs(tc.Seconds-tc.Work/tc.Rate) > 1e-12*tc.Seconds {
				t.Errorf("%s %s: %g s for %g at %g", c.policy, tc.Name, tc.Seconds, tc.Work, tc.Rate)
			}
		}
		if math.Abs(sum-pl.Time.Compute) > 1e-12 || pl.Time.Step < pl.Time.Compute {
			t.Errorf("%s: components sum to %g s, compute %g s, step %g s", c.policy, sum, pl.Time.Compute, pl.Time.Step)
		}
		for _, w := range []struct {
			name string
			want float64
			rate float64
		}{
			{"gemm", c.gemm, gemmFraction * 989e12},
			{"attention", 15.39e12, cudnnAttnFraction * 989e12},
			{"optimizer", 34 * cfg.Model.ParamCount(), hbmFraction * 3.35e12},
		} {
			got := component(t, pl, w.name)
			if math.Abs(got.Work/w.want-1) > 1e-3 || got.Rate != w.rate {
				t.Errorf("%s %s: %.5g at %.4g, want %.5g at %.4g", c.policy, w.name, got.Work, got.Rate, w.want, w.rate)
			}
		}
	}
	// the own kernels, and --attn-mfu, set the attention's rate; a CPU cluster has no components
	cfg := loadPlanConfig(t, "../configs/llama-1b.toml", "device.attention=own")
	if got := component(t, PlanFor(cfg, cl, "distflash", 8192), "attention").Rate; got != ownAttnFraction*989e12 {
		t.Errorf("device.attention = own: %g FLOP/s", got)
	}
	given := cl
	given.AttnMFU = 0.3
	if got := component(t, PlanFor(cfg, given, "distflash", 8192), "attention"); got.Rate != 0.3*989e12 || !strings.Contains(got.Basis, "--attn-mfu") {
		t.Errorf("--attn-mfu 0.3: %+v", got)
	}
	cpu := mustCluster(t, "1x1xcpu")
	cpu.GPU.FLOPS = 1e11
	if pl := PlanFor(loadPlanConfig(t, "../configs/tiny.toml"), cpu, "distflash", 128); len(pl.Time.Components) != 0 || !(pl.Time.Compute > 0) {
		t.Errorf("a CPU rank: %+v", pl.Time)
	}
}
