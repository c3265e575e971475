package world

import (
	"fmt"
	"io"
	"maps"
	"math"
	"strings"
	"sync"
	"testing"

	"distflash/config"
	"distflash/kernels"
	"distflash/model"
	"distflash/plan"
	"distflash/sysmem"
)

// tinyConfig is the built-in tiny model on a world of the given dimensions.
func tinyConfig(t *testing.T, world, sp int, attn string, fsdp bool) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Parallelism.WorldSize, cfg.Parallelism.SequenceParallelDegree = world, sp
	cfg.Parallelism.Attention, cfg.Parallelism.FSDP = attn, fsdp
	if err := cfg.Model.Resolve(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// built launches, opens and builds the world of cfg with the weights of seed 7.
func built(t *testing.T, cfg config.Config, prec kernels.Precision) (*World, []float32) {
	t.Helper()
	w, err := Launch(&cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Open(); err != nil {
		t.Fatal(err)
	}
	params := model.InitParams(cfg.Model, model.NewLayout(cfg.Model), 7)
	if err := w.Build(Spec{Model: cfg.Model, Policy: model.CheckpointLayer, Precision: prec, FSDP: cfg.Parallelism.FSDP, Params: params}); err != nil {
		t.Fatal(err)
	}
	return w, params
}

// TestWorldRanks: a world of 2 replicas × 2 sequence-parallel ranks in this process: each
// rank's id, replica, sequence group and positions, the schedule on the models, the weights
// whole again from every store (replicated, FSDP chunks, with a bf16 cast copy), and Load.
func TestWorldRanks(t *testing.T) {
	for _, tc := range []struct {
		name string
		fsdp bool
		prec kernels.Precision
	}{{"replicated", false, kernels.FP32}, {"fsdp", true, kernels.FP32}, {"bf16 cast", false, kernels.BF16}, {"fsdp bf16", true, kernels.BF16}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tinyConfig(t, 4, 2, "zigzag", tc.fsdp)
			w, params := built(t, cfg, tc.prec)
			if w.MPI() || !w.Leader() || w.LocalRanks() != 4 || len(w.Ranks()) != 4 {
				t.Fatalf("in-process world: mpi %v leader %v local ranks %d", w.MPI(), w.Leader(), w.LocalRanks())
			}
			for i, r := range w.Ranks() {
				if r.ID != i || r.Replica != i/2 || r.SPRank() != i%2 || r.Seq.Size() != 2 || r.Comm.Size() != 4 {
					t.Errorf("rank %d: id %d replica %d position %d, groups of %d and %d", i, r.ID, r.Replica, r.SPRank(), r.Seq.Size(), r.Comm.Size())
				}
				if r.Model.Attn == nil || (r.FSDP != nil) != tc.fsdp || (r.Cast != nil) != (tc.prec != kernels.FP32 && !tc.fsdp) {
					t.Errorf("rank %d: schedule %v, FSDP %v, cast copy %v", i, r.Model.Attn != nil, r.FSDP != nil, r.Cast != nil)
				}
				pos, err := r.Positions(16)
				if err != nil || len(pos) != 8 {
					t.Errorf("rank %d: %d positions of 16 (%v)", i, len(pos), err)
				}
			}
			if got := w.FullParams(); !sameBits(got, params) {
				t.Fatalf("FullParams is not the weights built with")
			}
			other := model.InitParams(cfg.Model, model.NewLayout(cfg.Model), 8)
			if err := w.Run(func(r *Rank) error { return r.Load(other) }); err != nil {
				t.Fatal(err)
			}
			if got := w.FullParams(); !sameBits(got, other) {
				t.Fatalf("FullParams after Load is not the weights loaded")
			}
			if err := w.Run(func(r *Rank) error { return r.Load(other[1:]) }); err == nil || !strings.Contains(err.Error(), "parameter values") {
				t.Errorf("Load of too few values: %v", err)
			}
			if err := w.Build(Spec{Model: cfg.Model}); err == nil || !strings.Contains(err.Error(), "built twice") {
				t.Errorf("a second Build: %v", err)
			}
		})
	}
}

// TestWorldRefusals: what a world cannot be is said before anything runs.
func TestWorldRefusals(t *testing.T) {
	cfg := tinyConfig(t, 2, 2, "ring", false)
	cfg.Device.Kind = "cuda"
	if _, err := Launch(&cfg, io.Discard); err == nil || !strings.Contains(err.Error(), "a GPU rank is a process") {
		t.Errorf("2 CUDA ranks in one process: %v", err)
	}
	cfg = tinyConfig(t, 3, 2, "ring", false)
	if _, err := Launch(&cfg, io.Discard); err == nil || !strings.Contains(err.Error(), "parallelism.world_size = 3") {
		t.Errorf("3 ranks in groups of 2: %v", err)
	}
	cfg = tinyConfig(t, 1, 1, "ring", false)
	w, err := Launch(&cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Build(Spec{Model: cfg.Model}); err == nil || !strings.Contains(err.Error(), "before Open") {
		t.Errorf("Build before Open: %v", err)
	}
	if err := w.Open(); err != nil {
		t.Fatal(err)
	}
	if err := w.Open(); err == nil {
		t.Error("a second Open succeeded")
	}
	if err := w.Build(Spec{Model: cfg.Model, Params: make([]float32, 3)}); err == nil || !strings.Contains(err.Error(), "3 initial parameter values") {
		t.Errorf("Build with 3 weights: %v", err)
	}
}

// TestWorldMemory: on the CPU a rank has the process's available memory shared by the ranks
// in the process; device.kind cpu-device builds the backend whose buffers only staging moves.
func TestWorldMemory(t *testing.T) {
	avail, _, ok := sysmem.Available()
	if !ok {
		t.Skip("this machine does not say its available memory")
	}
	cfg := tinyConfig(t, 4, 4, "ring", false)
	cfg.Device.Kind = "cpu-device"
	w, err := Launch(&cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got, source, ok := w.Memory()
	// the available memory moves a little between the two reads
	if !ok || math.Abs(got*4-float64(avail)) > 0.05*float64(avail) || !strings.Contains(source, "4 in-process ranks") {
		t.Errorf("memory per rank %.0f (%s), want about %d / 4", got, source, avail)
	}
	if err := w.Open(); err != nil {
		t.Fatal(err)
	}
	if hm, ok := w.First().Backend.(interface{ HostMemory() bool }); !ok || hm.HostMemory() {
		t.Errorf("cpu-device built a backend whose memory the host communicators read (%s)", w.First().Backend.Name())
	}
}

// sameBits reports whether a and b hold the same float32 bits.
func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// warmRecorder is a rank's attention that records the masks it is called with.
type warmRecorder struct {
	model.Attention
	mu      *sync.Mutex
	windows map[[2]int]int // (window, backward) → calls
}

func (a warmRecorder) Forward(o, lse, q, k, v kernels.Buf, seq model.Seq, h model.Heads) {
	a.mu.Lock()
	a.windows[[2]int{seq.Window, 0}]++
	a.mu.Unlock()
	a.Attention.Forward(o, lse, q, k, v, seq, h)
}

func (a warmRecorder) Backward(dq, dk, dv, q, k, v, o, lse, do kernels.Buf, seq model.Seq, h model.Heads) {
	a.mu.Lock()
	a.windows[[2]int{seq.Window, 1}]++
	a.mu.Unlock()
	a.Attention.Backward(dq, dk, dv, q, k, v, o, lse, do, seq, h)
}

// TestWorldWarmAttention: the warm-up runs every rank's schedule once forward and once backward
// for each mask the layers use (here the full causal mask and a window of 5 on every second
// layer), collectively (the ranks exchange blocks: distflash over 2 ranks), and changes neither
// the weights nor the model's counts.
func TestWorldWarmAttention(t *testing.T) {
	cfg := tinyConfig(t, 2, 2, "distflash", false)
	cfg.Model.SlidingWindow, cfg.Model.SlidingWindowPattern = 5, 2
	w, params := built(t, cfg, kernels.FP32)
	var mu sync.Mutex
	seen := make([]map[[2]int]int, 2)
	for i, r := range w.Ranks() {
		seen[i] = map[[2]int]int{}
		r.Model.Attn = warmRecorder{Attention: r.Model.Attn, mu: &mu, windows: seen[i]}
	}
	if _, err := w.WarmAttention(16); err != nil {
		t.Fatal(err)
	}
	want := map[[2]int]int{{0, 0}: 1, {0, 1}: 1, {5, 0}: 1, {5, 1}: 1}
	for i, r := range w.Ranks() {
		if !maps.Equal(seen[i], want) {
			t.Errorf("rank %d: attention calls by (window, backward) %v, want %v", i, seen[i], want)
		}
		if c := r.Backend.Counters(); c.AttnBlocks.Load() == 0 || c.AttnBackwards.Load() == 0 {
			t.Errorf("rank %d: %d attention blocks and %d backwards computed", i, c.AttnBlocks.Load(), c.AttnBackwards.Load())
		}
		if r.Model.Stats != (model.Stats{}) {
			t.Errorf("rank %d: model stats %+v after the warm-up", i, r.Model.Stats)
		}
	}
	if got := w.FullParams(); !sameBits(got, params) {
		t.Fatalf("the weights changed in the warm-up")
	}
	if _, err := w.WarmAttention(15); err == nil {
		t.Errorf("a warm-up of 15 tokens over 2 ranks: no error")
	}
}

// TestActivationBytesMatchPlan: plan's count of the buffers model.Model.ActivationBytes reports
// (plan.ActivationBytes: the saved activations, the logits and head, the backward scratch) is
// the model's, to the byte, on one CPU rank after a ForwardBackward has sized them: in fp32
// and in bf16 (issue 41's 16-bit step, its packed buffers), under each checkpoint policy, with
// the MLP whole and in tiles and the logits at once and in chunks. plan's memory check and
// checkpoint.activation = "auto" decide by this count, so a buffer the model adds without plan
// counting it fails here. The bf16 rows count the 16-bit step's buffers, which come with the
// model's side of issue 41: before that merges they differ from the model's float32 ones.
func TestActivationBytesMatchPlan(t *testing.T) {
	const T = 64
	for _, prec := range []kernels.Precision{kernels.FP32, kernels.BF16} {
		for _, policy := range []string{"none", "attn_output", "layer"} {
			for _, cut := range []struct{ tile, chunk int }{{0, 0}, {16, 24}} {
				cfg := tinyConfig(t, 1, 1, "distflash", false)
				cfg.Data.SeqLen, cfg.Data.BatchSize = T, 2
				cfg.Training.MixedPrecision = prec.String()
				cfg.Checkpoint.Activation, cfg.Training.MLPTile, cfg.Training.LossChunk = policy, cut.tile, cut.chunk
				name := fmt.Sprintf("%s/%s/tile%d/chunk%d", prec, policy, cut.tile, cut.chunk)
				w, err := Launch(&cfg, io.Discard)
				if err != nil {
					t.Fatal(err)
				}
				if err := w.Open(); err != nil {
					t.Fatal(err)
				}
				p, err := model.ParseCheckpoint(policy)
				if err != nil {
					t.Fatal(err)
				}
				if err := w.Build(Spec{Model: cfg.Model, Policy: p, Precision: prec, LossChunk: cut.chunk, MLPTile: cut.tile, Seed: 3}); err != nil {
					t.Fatal(err)
				}
				m := w.First().Model
				pos := make([]int32, T)
				ids := make([]int32, 2*T)
				for i := range pos {
					pos[i] = int32(i)
				}
				for i := range ids {
					ids[i] = int32(i % cfg.Model.VocabSize)
				}
				m.ZeroGrads()
				m.ForwardBackward(model.Batch{IDs: ids, Targets: ids, B: 2, Pos: pos}, 1/float32(len(ids)))
				if got, want := m.ActivationBytes(), plan.ActivationBytes(cfg, 0); float64(got) != want {
					t.Errorf("%s: the model's activation buffers hold %d bytes, plan counts %.0f (%+.0f)", name, got, want, want-float64(got))
				}
			}
		}
	}
}
