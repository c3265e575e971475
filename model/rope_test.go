package model

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"distflash/kernels"
)

// RoPE scaling parity: testdata/rope/*.safetensors are golden model files (see golden_test.go)
// of one model under each RoPE variant, made by scripts/reference.py rope from Hugging Face's
// definitions, at 64 positions of which 48 lie beyond the pretrained length 16. The
// tolerances are the golden ones.

func ropeFiles(t *testing.T) []string {
	files, err := filepath.Glob("testdata/rope/*.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 6 {
		t.Fatalf("want the vectors of 6 RoPE variants in testdata/rope, found %d (regenerate: /usr/bin/python3 scripts/reference.py rope)", len(files))
	}
	return files
}

// TestRopeTables: Config.RoPE equals the reference's inverse frequencies and attention factor
// (both float64) to 1e-13.
func TestRopeTables(t *testing.T) {
	for _, path := range ropeFiles(t) {
		g := loadGolden(t, path)
		var want []float64
		if err := json.Unmarshal([]byte(g.st.Metadata["inv_freq"]), &want); err != nil {
			t.Fatalf("%s: inv_freq: %v", path, err)
		}
		att, err := strconv.ParseFloat(g.st.Metadata["attention_factor"], 64)
		if err != nil {
			t.Fatalf("%s: attention_factor: %v", path, err)
		}
		got := g.cfg.RoPE(g.T)
		if len(got.InvFreq) != len(want) {
			t.Fatalf("%s: %d frequencies, want %d", g.name, len(got.InvFreq), len(want))
		}
		for i := range want {
			if e := math.Abs(got.InvFreq[i]-want[i]) / want[i]; e > 1e-13 {
				t.Errorf("%s: inv_freq[%d] = %.17g, reference %.17g", g.name, i, got.InvFreq[i], want[i])
			}
		}
		if math.Abs(got.Scale-att) > 1e-13 {
			t.Errorf("%s: scale %.17g, reference attention_factor %.17g", g.name, got.Scale, att)
		}
	}
}

// TestRopeParity: logits, loss and every parameter gradient equal the PyTorch reference's for
// each RoPE variant, under every checkpoint policy.
func TestRopeParity(t *testing.T) {
	for _, path := range ropeFiles(t) {
		g := loadGolden(t, path)
		for _, policy := range []Checkpoint{CheckpointNone, CheckpointLayer, CheckpointAttnOutput} {
			t.Run(fmt.Sprintf("%s/%v", g.name, policy), func(t *testing.T) {
				fe, ge, worst := g.compare(t, g.cfg, policy)
				t.Logf("%s T=%d: forward rel err %.2e, worst gradient rel err %.2e (%s)", g.name,
					g.T, fe, ge, worst)
				if fe > tolForward {
					t.Errorf("logits/loss rel err %.3g > %g", fe, tolForward)
				}
				if ge > tolGradient {
					t.Errorf("gradient %s rel err %.3g > %g", worst, ge, tolGradient)
				}
			})
		}
	}
}

// TestRopeToleranceCatchesBugs: each variant's vectors reject small and plausible mistakes:
// a parameter off by a fraction of a percent, the scaling left out, dynamic NTK fed
// max(pos) instead of max(pos)+1 or a rank's slice length instead of the global one, YaRN
// without its attention factor or with its ramp ending two dimensions later.
func TestRopeToleranceCatchesBugs(t *testing.T) {
	type bug struct {
		name   string
		mutate func(*Config)
		seqLen int
	}
	common := []bug{
		{"rope_theta+0.1%", func(c *Config) { c.RopeTheta *= 1.001 }, 0},
	}
	scaled := []bug{
		{"factor+0.5%", func(c *Config) { c.RopeScaling.Factor *= 1.005 }, 0},
		{"no scaling", func(c *Config) { c.RopeScaling = RopeScaling{} }, 0},
	}
	bugs := map[string][]bug{
		"theta.safetensors":  {{"rope_theta 1e4", func(c *Config) { c.RopeTheta = 1e4 }, 0}},
		"linear.safetensors": scaled,
		"dynamic.safetensors": append(scaled,
			bug{"seq_len = max(pos)", nil, 63},
			bug{"seq_len of one of 2 ranks", nil, 32},
			bug{"original+1", func(c *Config) { c.RopeScaling.OriginalMaxPositionEmbeddings++ }, 0}),
		"yarn.safetensors": append(scaled,
			bug{"no attention factor", func(c *Config) { c.RopeScaling.AttentionFactor = 1 }, 0},
			bug{"attention factor on q only", func(c *Config) { c.RopeScaling.AttentionFactor = math.Sqrt(0.1*math.Log(4) + 1) }, 0}),
		"yarn_betas.safetensors": append(scaled,
			bug{"attention_factor+0.5%", func(c *Config) { c.RopeScaling.AttentionFactor *= 1.005 }, 0},
			bug{"beta_slow ÷ 2.9 (ramp to dimension 5, not 3)", func(c *Config) { c.RopeScaling.BetaSlow /= 2.9 }, 0}),
		"llama3.safetensors": append(scaled,
			bug{"low_freq_factor+1%", func(c *Config) { c.RopeScaling.LowFreqFactor *= 1.01 }, 0},
			bug{"high_freq_factor+1%", func(c *Config) { c.RopeScaling.HighFreqFactor *= 1.01 }, 0}),
	}
	for _, path := range ropeFiles(t) {
		g := loadGolden(t, path)
		list, ok := bugs[g.name]
		if !ok {
			t.Errorf("%s: no mutations listed for this variant", g.name)
		}
		for _, b := range append(common, list...) {
			cfg := g.cfg
			if b.mutate != nil {
				b.mutate(&cfg)
			}
			if err := cfg.Resolve(); err != nil {
				t.Fatalf("%s with %s: %v", g.name, b.name, err)
			}
			gb := g
			gb.seqLen = b.seqLen
			fe, ge, _ := gb.compare(t, cfg, CheckpointNone)
			t.Logf("%s with %s: forward err %.2e, gradient err %.2e", g.name, b.name, fe, ge)
			if fe <= tolForward && ge <= tolGradient {
				t.Errorf("%s with %s: forward err %.2e, gradient err %.2e pass the tolerances", g.name, b.name, fe, ge)
			}
		}
	}
}

// TestRopeDynamicSeqLen: dynamic NTK is plain RoPE up to original_max_position_embeddings
// (bit for bit) and scales with the global sequence length past it; the model takes that
// length from Model.SeqLen when set, else from max(pos)+1.
func TestRopeDynamicSeqLen(t *testing.T) {
	cfg := Config{Dim: 32, NLayers: 1, NHeads: 2, NKVHeads: 1, FFNDim: 32, VocabSize: 61, NormEps: 1e-5,
		RopeTheta: 1e4, MaxSeqLen: 64, RopeScaling: RopeScaling{Type: "dynamic", Factor: 4}}
	if err := cfg.Resolve(); err != nil {
		t.Fatal(err)
	}
	if cfg.RopeScaling.OriginalMaxPositionEmbeddings != 16 {
		t.Fatalf("original_max_position_embeddings resolved to %d, want max_seq_len / factor = 16", cfg.RopeScaling.OriginalMaxPositionEmbeddings)
	}
	plain := kernels.DefaultRoPE(1e4, 16)
	for _, n := range []int{1, 15, 16} {
		if got := cfg.RoPE(n); !slicesEqual(got.InvFreq, plain.InvFreq) || got.Scale != 1 {
			t.Errorf("seq_len %d: %v, want plain RoPE %v", n, got, plain)
		}
	}
	prev := plain.InvFreq[1]
	for _, n := range []int{17, 32, 64, 1 << 20} {
		got := cfg.RoPE(n)
		base := 1e4 * math.Pow(4*float64(n)/16-3, 16.0/14)
		if want := math.Pow(base, -2.0/16); math.Abs(got.InvFreq[1]-want) > 1e-15*want || !(got.InvFreq[1] < prev) {
			t.Errorf("seq_len %d: inv_freq[1] = %g, want %g and below %g", n, got.InvFreq[1], want, prev)
		}
		prev = got.InvFreq[1]
	}

	logits := func(seqLen int, T int) []float32 {
		m := New(cfg, CheckpointNone, kernels.NewCPU())
		m.LoadParams(InitParams(cfg, m.Layout, 1))
		ids := make([]int32, T)
		for i := range ids {
			ids[i] = int32(i * 7 % 61)
		}
		m.Forward(Batch{IDs: ids, Targets: ids, B: 1, Pos: Positions(T), SeqLen: seqLen})
		return kernels.Host(m.Logits())
	}
	if a, b := logits(0, 24), logits(24, 24); !slicesEqual(a, b) {
		t.Errorf("SeqLen 0 and SeqLen = T differ")
	}
	if a, b := logits(0, 24), logits(48, 24); slicesEqual(a, b) {
		t.Errorf("SeqLen 48 gives the logits of SeqLen 24: the model ignores SeqLen")
	}
}

func slicesEqual[E comparable](a, b []E) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRopeScalingErrors: every bad [model.rope_scaling] is refused naming the key and value.
func TestRopeScalingErrors(t *testing.T) {
	for _, c := range []struct {
		rs   RopeScaling
		want []string
	}{
		{RopeScaling{Type: "ntk", Factor: 2}, []string{`model.rope_scaling.type = "ntk": unknown`, "none, linear, dynamic, yarn, llama3"}},
		{RopeScaling{Type: "linear", Factor: 0.5}, []string{"model.rope_scaling.factor = 0.5: must be ≥ 1"}},
		{RopeScaling{Type: "linear"}, []string{"model.rope_scaling.factor = 0: must be ≥ 1"}},
		{RopeScaling{Type: "yarn", Factor: math.Inf(1)}, []string{"model.rope_scaling.factor = +Inf: must be a finite number"}},
		{RopeScaling{Factor: 4}, []string{"model.rope_scaling.factor = 4: not a parameter of rope_scaling.type none"}},
		{RopeScaling{Type: "linear", Factor: 2, OriginalMaxPositionEmbeddings: 512}, []string{"model.rope_scaling.original_max_position_embeddings = 512: not a parameter of rope_scaling.type linear", "it reads type, factor"}},
		{RopeScaling{Type: "yarn", Factor: 2, LowFreqFactor: 1}, []string{"model.rope_scaling.low_freq_factor = 1: not a parameter of rope_scaling.type yarn"}},
		{RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, BetaFast: 32}, []string{"model.rope_scaling.beta_fast = 32: not a parameter of rope_scaling.type llama3"}},
		{RopeScaling{Type: "dynamic", Factor: 3}, []string{"original_max_position_embeddings is absent", "512 / 3 is not a whole number"}},
		{RopeScaling{Type: "dynamic", Factor: 2, OriginalMaxPositionEmbeddings: -4}, []string{"model.rope_scaling.original_max_position_embeddings = -4: must be > 0"}},
		{RopeScaling{Type: "yarn", Factor: 2, BetaFast: -1}, []string{"model.rope_scaling.beta_fast = -1: must be > 0"}},
		{RopeScaling{Type: "yarn", Factor: 2, BetaFast: 2, BetaSlow: 4}, []string{"model.rope_scaling.beta_fast = 2 is below model.rope_scaling.beta_slow = 4"}},
		{RopeScaling{Type: "yarn", Factor: 2, AttentionFactor: -0.5}, []string{"model.rope_scaling.attention_factor = -0.5: must be > 0"}},
		{RopeScaling{Type: "yarn", Factor: 2, BetaSlow: math.NaN()}, []string{"model.rope_scaling.beta_slow = NaN: must be a finite number"}},
		{RopeScaling{Type: "llama3", Factor: 8, HighFreqFactor: 4}, []string{"model.rope_scaling.low_freq_factor = 0: must be > 0"}},
		{RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 4, HighFreqFactor: 1}, []string{"model.rope_scaling.high_freq_factor = 1: must be > model.rope_scaling.low_freq_factor = 4"}},
	} {
		cfg := Config{Dim: 64, NLayers: 1, NHeads: 4, FFNDim: 64, VocabSize: 32, NormEps: 1e-5, RopeTheta: 1e4,
			MaxSeqLen: 512, RopeScaling: c.rs}
		err := cfg.Resolve()
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %v, want it to contain %q", c.rs, err, w)
			}
		}
	}
	// Accepted: "none" and "default" are plain RoPE; an absent original length is derived.
	for _, c := range []struct {
		rs   RopeScaling
		want RopeScaling
	}{
		{RopeScaling{Type: "none"}, RopeScaling{}},
		{RopeScaling{Type: "default"}, RopeScaling{}},
		{RopeScaling{Type: "linear", Factor: 2}, RopeScaling{Type: "linear", Factor: 2}},
		{RopeScaling{Type: "yarn", Factor: 4}, RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositionEmbeddings: 128}},
		{RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192},
			RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}},
	} {
		cfg := Config{Dim: 64, NLayers: 1, NHeads: 4, FFNDim: 64, VocabSize: 32, NormEps: 1e-5, RopeTheta: 1e4,
			MaxSeqLen: 512, RopeScaling: c.rs}
		if err := cfg.Resolve(); err != nil || cfg.RopeScaling != c.want {
			t.Errorf("%+v: resolved to %+v (%v), want %+v", c.rs, cfg.RopeScaling, err, c.want)
		}
	}
}
