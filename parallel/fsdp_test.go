package parallel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel/transport"
)

// fsdpConfig is a small model with uneven unit sizes, so padding is exercised.
func fsdpConfig() model.Config {
	c := model.Config{Dim: 24, NLayers: 2, NHeads: 3, NKVHeads: 1, FFNDim: 40, VocabSize: 37,
		NormEps: 1e-5, RopeTheta: 10000, MaxSeqLen: 64}
	if err := c.Resolve(); err != nil {
		panic(err)
	}
	return c
}

// fsdpBatch returns P sequences of T tokens with their next-token targets.
func fsdpBatch(cfg model.Config, P, T int) (ids, targets []int32) {
	r := rand.New(rand.NewPCG(7, 8))
	ids, targets = make([]int32, P*T), make([]int32, P*T)
	for i := range ids {
		ids[i] = int32(r.IntN(cfg.VocabSize))
		targets[i] = int32(r.IntN(cfg.VocabSize))
	}
	return ids, targets
}

// TestFSDPMatchesReplicated runs data-parallel FSDP on P ranks (rank r takes sequence r of
// the batch) and checks that the loss and every rank's gradient chunk equal one model's
// gradient of the whole batch, for every checkpoint policy, with and without prefetch.
func TestFSDPMatchesReplicated(t *testing.T) {
	cfg := fsdpConfig()
	layout := model.NewLayout(cfg)
	params := model.InitParams(cfg, layout, 3)
	const T = 8
	for _, P := range []int{1, 2, 3, 4} {
		ids, targets := fsdpBatch(cfg, P, T)
		dscale := float32(1) / float32(P*T)
		ref := model.New(cfg, model.CheckpointNone, kernels.NewCPU())
		ref.LoadParams(params)
		refLoss, _ := ref.ForwardBackward(model.Batch{IDs: ids, Targets: targets, B: P, Pos: model.Positions(T)}, dscale)
		want := kernels.Host(ref.Grads.Flat)
		for _, policy := range []model.Checkpoint{model.CheckpointNone, model.CheckpointLayer, model.CheckpointAttnOutput} {
			var prev [][]float32
			for _, prefetch := range []bool{false, true} {
				name := fmt.Sprintf("P%d/%s/prefetch=%v", P, policy, prefetch)
				grads, loss := runFSDP(t, transport.NewWorld(P).Run, cfg, params, ids, targets, P, T, dscale, policy, prefetch)
				if d := math.Abs(loss-refLoss) / math.Abs(refLoss); d > 1e-6 {
					t.Errorf("%s: loss %v, replicated %v (rel %.2g)", name, loss, refLoss, d)
				}
				covered := make([]int, layout.Size)
				var worst float64
				for r, g := range grads {
					st := NewFSDP(transport.NewWorld(P).Comm(r), kernels.NewCPU(), layout, FSDPOptions{})
					for _, rg := range st.Owned() {
						for i := 0; i < rg.N; i++ {
							covered[rg.Off+i]++
							worst = math.Max(worst, math.Abs(float64(g[rg.Local+i]-want[rg.Off+i])))
						}
					}
				}
				for i, c := range covered {
					if c != 1 {
						t.Fatalf("%s: element %d owned by %d ranks", name, i, c)
					}
				}
				scale := maxAbs(want)
				if worst/scale > 1e-5 {
					t.Errorf("%s: gradient chunks differ from the replicated gradient by %.3g (max |g| %.3g)", name, worst, scale)
				}
				if prev != nil {
					for r := range grads {
						for i := range grads[r] {
							if grads[r][i] != prev[r][i] {
								t.Fatalf("%s: prefetch changed rank %d gradient element %d: %v vs %v", name, r, i, grads[r][i], prev[r][i])
							}
						}
					}
				}
				prev = grads
			}
		}
	}
}

// runFSDP runs one forward-backward of the batch on P FSDP ranks (world runs them: a
// World's Run, or one that wraps its communicators), rank r on sequence r, and returns each
// rank's gradient chunks and the summed loss.
func runFSDP(t *testing.T, world func(func(transport.Comm) error) error, cfg model.Config, params []float32, ids, targets []int32, P, T int, dscale float32,
	policy model.Checkpoint, prefetch bool) ([][]float32, float64) {
	t.Helper()
	grads := make([][]float32, P)
	losses := make([]float64, P)
	err := world(func(c transport.Comm) error {
		be := kernels.NewCPU()
		st := NewFSDP(c, be, model.NewLayout(cfg), FSDPOptions{Prefetch: prefetch})
		st.Load(params)
		m := model.NewWithStore(cfg, policy, be, st)
		r := c.Rank()
		losses[r] = twoMicroBatches(m, ids, targets, r, T, dscale) // gradients accumulate in the chunks
		grads[r] = append([]float32(nil), kernels.Host(st.MasterGrads)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, l := range losses {
		sum += l
	}
	return grads, sum
}

// rankBatch is rank r's sequence of T tokens of a batch that holds every rank's in order.
func rankBatch(ids, targets []int32, r, T int) model.Batch {
	return model.Batch{IDs: ids[r*T : (r+1)*T], Targets: targets[r*T : (r+1)*T], B: 1, Pos: model.Positions(T)}
}

// twoMicroBatches runs rank r's sequence through m as two micro-batches of half the loss each,
// so that the gradients accumulate, and returns the loss.
func twoMicroBatches(m *model.Model, ids, targets []int32, r, T int, dscale float32) float64 {
	var loss float64
	for range 2 {
		l, _ := m.ForwardBackward(rankBatch(ids, targets, r, T), dscale/2)
		loss += l / 2
	}
	return loss
}

func maxAbs(x []float32) float64 {
	var m float64
	for _, v := range x {
		m = math.Max(m, math.Abs(float64(v)))
	}
	return m
}

// TestFSDPShardsMemory checks the 1/P shape: each rank's master chunks are the parameter
// count over P plus at most 2P−1 padding elements per unit.
func TestFSDPShardsMemory(t *testing.T) {
	cfg := fsdpConfig()
	layout := model.NewLayout(cfg)
	units := len(layout.Units())
	for _, P := range []int{1, 2, 4, 8} {
		st := NewFSDP(transport.NewWorld(P).Comm(0), kernels.NewCPU(), layout, FSDPOptions{})
		got := st.Memory().MasterParams / 4
		lo, hi := int64(layout.Size/P), int64(layout.Size/P+units*(2*P-1)/P+units)
		if got < lo || got > hi {
			t.Errorf("P=%d: %d master elements per rank, want %d…%d (size %d / P plus padding)", P, got, lo, hi, layout.Size)
		}
	}
}

// TestFSDPSegments checks that the decay runs of a rank's chunks follow the layout's tensors.
func TestFSDPSegments(t *testing.T) {
	cfg := fsdpConfig()
	layout := model.NewLayout(cfg)
	decay := make([]int, layout.Size) // 1 decay, 2 no decay
	for _, tn := range layout.Tensors {
		for i := 0; i < tn.Size(); i++ {
			decay[tn.Off+i] = 2
			if tn.Decay {
				decay[tn.Off+i] = 1
			}
		}
	}
	for _, P := range []int{1, 3, 4} {
		w := transport.NewWorld(P)
		for r := 0; r < P; r++ {
			st := NewFSDP(w.Comm(r), kernels.NewCPU(), layout, FSDPOptions{})
			local := make([]int, st.Master.Len())
			end := 0
			for _, s := range st.Segments(layout) {
				if s.Off != end {
					t.Fatalf("P=%d rank %d: segments leave a gap at %d", P, r, end)
				}
				end = s.Off + s.N
				for i := s.Off; i < end; i++ {
					local[i] = 2
					if s.Decay {
						local[i] = 1
					}
				}
			}
			if end != len(local) {
				t.Fatalf("P=%d rank %d: segments cover %d of %d", P, r, end, len(local))
			}
			for _, rg := range st.Owned() {
				for i := 0; i < rg.N; i++ {
					if local[rg.Local+i] != decay[rg.Off+i] {
						t.Fatalf("P=%d rank %d: element %d decay flag wrong", P, r, rg.Off+i)
					}
				}
			}
		}
	}
}

// BenchmarkFSDPPrefetch times one forward-backward of a 4-layer model on 4 FSDP ranks whose
// messages cross a simulated 200 MB/s link, with and without prefetching the next unit's
// all-gather: prefetch hides a unit's gather behind the previous unit's compute.
func BenchmarkFSDPPrefetch(b *testing.B) {
	cfg := model.Config{Dim: 256, NLayers: 4, NHeads: 4, NKVHeads: 4, FFNDim: 704, VocabSize: 256,
		NormEps: 1e-5, RopeTheta: 10000, MaxSeqLen: 512}
	if err := cfg.Resolve(); err != nil {
		b.Fatal(err)
	}
	const P, T = 4, 256
	params := model.InitParams(cfg, model.NewLayout(cfg), 1)
	ids, targets := fsdpBatch(cfg, P, T)
	for _, prefetch := range []bool{false, true} {
		b.Run(fmt.Sprintf("prefetch=%v", prefetch), func(b *testing.B) {
			w := transport.NewWorld(P)
			w.SimulateLink(200e6, 50e-6*1e9)
			models := make([]*model.Model, P)
			if err := w.Run(func(c transport.Comm) error {
				be := kernels.NewCPU()
				st := NewFSDP(c, be, model.NewLayout(cfg), FSDPOptions{Prefetch: prefetch})
				st.Load(params)
				models[c.Rank()] = model.NewWithStore(cfg, model.CheckpointNone, be, st)
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if err := w.Run(func(c transport.Comm) error {
					r := c.Rank()
					models[r].ForwardBackward(rankBatch(ids, targets, r, T), 1)
					return nil
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestFSDPLoadEach: loading a rank's chunks from the generator (model.InitParamsEach, in
// blocks smaller than, equal to and larger than the tensors) gives the chunks Load cuts
// from the whole vector, bit for bit, on every rank of 1 to 5.
func TestFSDPLoadEach(t *testing.T) {
	cfg := fsdpConfig()
	layout := model.NewLayout(cfg)
	full := model.InitParams(cfg, layout, 9)
	for P := 1; P <= 5; P++ {
		w := transport.NewWorld(P)
		for r := 0; r < P; r++ {
			for _, block := range []int{7, 1000, 1 << 20} {
				a := NewFSDP(w.Comm(r), kernels.NewCPU(), layout, FSDPOptions{})
				b := NewFSDP(w.Comm(r), kernels.NewCPU(), layout, FSDPOptions{})
				a.Load(full)
				b.LoadEach(func(visit func(off int, vals []float32)) { model.InitParamsEach(cfg, layout, 9, block, visit) })
				if !slices.Equal(kernels.Host(a.Master), kernels.Host(b.Master)) {
					t.Fatalf("P=%d rank %d block %d: LoadEach's chunks differ from Load's", P, r, block)
				}
			}
		}
	}
}
