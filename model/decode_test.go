package model

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"distflash/kernels"
)

// tolDecode bounds the relative difference between a decoded token's logits and the full
// forward's at its position: the same float32 arithmetic in another order (one attention
// block over the cache against the forward's tiles); measured: 0, the CPU kernels compute
// each row in the same order either way.
const tolDecode = 1e-5

// fullLogits is the logits of every position of one Forward over ids ([len(ids), vocab]),
// with the batch's SeqLen set to seqLen (the RoPE table of a Decoder's whole sequence).
func fullLogits(m *Model, ids []int32, seqLen int) []float32 {
	V := m.Cfg.VocabSize
	out := make([]float32, len(ids)*V)
	m.RowHook = func(row0 int, lg kernels.Buf, rows int) {
		copy(out[row0*V:(row0+rows)*V], kernels.Host(lg)[:rows*V])
	}
	targets := slices.Repeat([]int32{-1}, len(ids))
	m.Forward(Batch{IDs: ids, Targets: targets, B: 1, Pos: Positions(len(ids)), SeqLen: seqLen})
	m.RowHook = nil
	return out
}

// TestDecodeMatchesForward: prefill a prompt, then feed tokens one at a time; the logits of
// the prefill and of every step equal those of one Forward over the whole sequence at the
// same positions, for every head layout, with sliding windows (every layer, some layers, a
// window shorter than the prompt and one reached only by the new tokens), with dynamic RoPE
// scaling (the table of the whole sequence), with the loss in chunks and the MLP in tiles.
func TestDecodeMatchesForward(t *testing.T) {
	type variant struct {
		name string
		edit func(*Config)
		m    func(*Model)
	}
	variants := []variant{
		{"plain", func(*Config) {}, nil},
		{"window3", func(c *Config) { c.SlidingWindow = 3 }, nil},
		{"window16_layer1", func(c *Config) { c.SlidingWindow, c.SlidingWindowLayers = 16, []int{1} }, nil},
		{"dynamic", func(c *Config) {
			c.MaxSeqLen = 64
			c.RopeScaling = RopeScaling{Type: "dynamic", Factor: 4, OriginalMaxPositionEmbeddings: 8}
		}, nil},
		{"chunks_tiles", func(*Config) {}, func(m *Model) { m.LossChunk, m.MLPTile = 5, 3 }},
	}
	const prompt, steps = 13, 9
	for name, base := range testConfigs() {
		for _, v := range variants {
			t.Run(name+"/"+v.name, func(t *testing.T) {
				cfg := base
				v.edit(&cfg)
				if err := cfg.Resolve(); err != nil {
					t.Fatal(err)
				}
				m := New(cfg, CheckpointLayer, kernels.NewCPU())
				m.LoadParams(perturbedInit(cfg, m.Layout))
				if v.m != nil {
					v.m(m)
				}
				r := rand.New(rand.NewPCG(uint64(len(name)), 3))
				ids := randomTokens(r, prompt+steps, cfg.VocabSize)
				want := fullLogits(m, ids[:prompt+steps-1], prompt+steps-1)

				d := NewDecoder(m, nil)
				V := cfg.VocabSize
				got := d.Prefill(ids[:prompt], Positions(prompt), prompt, steps-1)
				worst := relErr(got, want[(prompt-1)*V:prompt*V])
				for i := 0; i < steps-1; i++ {
					got = d.Step(ids[prompt+i])
					worst = max(worst, relErr(got, want[(prompt+i)*V:(prompt+i+1)*V]))
				}
				if worst > tolDecode {
					t.Errorf("decoded logits differ from the forward's by %.2e relative (tol %g)", worst, tolDecode)
				}
				if d.Cached() != prompt+steps-1 {
					t.Errorf("%d tokens cached, want %d", d.Cached(), prompt+steps-1)
				}
			})
		}
	}
}

// TestDecodeWindowMatters: the same weights decode other logits with a window shorter than
// the sequence, so the test above checks the window and not only the prefix.
func TestDecodeWindowMatters(t *testing.T) {
	cfg := testConfigs()["gqa"]
	win := cfg
	win.SlidingWindow = 3
	logits := map[string][]float32{}
	for name, c := range map[string]Config{"causal": cfg, "window": win} {
		if err := c.Resolve(); err != nil {
			t.Fatal(err)
		}
		m := New(c, CheckpointLayer, kernels.NewCPU())
		m.LoadParams(perturbedInit(c, m.Layout))
		d := NewDecoder(m, nil)
		ids := randomTokens(rand.New(rand.NewPCG(1, 1)), 10, c.VocabSize)
		d.Prefill(ids, Positions(10), 10, 2)
		logits[name] = slices.Clone(d.Step(3))
	}
	if e := relErr(logits["window"], logits["causal"]); e < 1e-3 {
		t.Errorf("a window of 3 over 11 tokens changed the logits by %.2e only", e)
	}
}

// TestDecodePanics: a step past the room made at the prefill, and padding before prompt
// tokens on a rank, are programming errors.
func TestDecodePanics(t *testing.T) {
	cfg := testConfigs()["mha"]
	if err := cfg.Resolve(); err != nil {
		t.Fatal(err)
	}
	m := New(cfg, CheckpointLayer, kernels.NewCPU())
	for _, c := range []struct {
		name string
		f    func(d *Decoder)
	}{
		{"past maxNew", func(d *Decoder) { d.Prefill([]int32{1, 2}, Positions(2), 2, 1); d.Step(1); d.Step(2) }},
		{"padding first", func(d *Decoder) { d.Prefill([]int32{1, 2}, []int32{5, 0}, 2, 1) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", c.name)
				}
			}()
			c.f(NewDecoder(m, nil))
		}()
	}
}

func ExampleCacheBytes() {
	c := Config{Dim: 4096, NLayers: 32, NHeads: 32, NKVHeads: 8, FFNDim: 14336, VocabSize: 128256, NormEps: 1e-5, RopeTheta: 500000, MaxSeqLen: 8192}
	if err := c.Resolve(); err != nil {
		panic(err)
	}
	fmt.Printf("%.2f GiB for 32K tokens\n", float64(CacheBytes(c, 32768))/(1<<30))
	// Output: 8.00 GiB for 32K tokens
}
