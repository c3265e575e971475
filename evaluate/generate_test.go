package evaluate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"distflash/config"
	"distflash/model"
	"distflash/weights"
)

// generateCase is one case of weights/testdata/hf/generate.json (scripts/reference.py generate):
// PyTorch's float64 greedy decoding of a committed Hugging Face fixture, by full forwards.
type generateCase struct {
	Model       string    `json:"model"`
	Prompt      string    `json:"prompt"`
	PromptIDs   []int32   `json:"prompt_ids"`
	Tokens      []int32   `json:"tokens"`
	MinMargin   float64   `json:"min_margin"`
	FirstLogits []float64 `json:"first_logits"`
}

func readGenerateCases(t *testing.T) []generateCase {
	t.Helper()
	raw, err := os.ReadFile("../weights/testdata/hf/generate.json")
	if err != nil {
		t.Fatalf("%v (regenerate: /usr/bin/python3 scripts/reference.py generate)", err)
	}
	var f struct {
		Cases []generateCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Cases) != 12 {
		t.Fatalf("generate.json has %d cases, want 12", len(f.Cases))
	}
	return f.Cases
}

// evaluatorOf loads a fixture onto an evaluator of P ranks running schedule attn.
func evaluatorOf(t *testing.T, dir string, P int, attn string) *Evaluator {
	t.Helper()
	em, err := weights.Load(dir, config.Default(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	par := config.Default().Parallelism
	par.SequenceParallelDegree, par.WorldSize, par.Attention = P, P, attn
	e, err := Local(em.Config, par, em.Params)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// tolGenLogits bounds the prefill's logits against PyTorch's float64 ones, relative to their
// largest magnitude (float32 arithmetic; measured ≤ 7.8e-7).
const tolGenLogits = 1e-5

// TestGenerateMatchesPyTorch: greedy decoding of the three fixtures (LLaMA, tied LLaMA,
// Mistral with a window of 16 that 52-byte prompts outgrow) gives PyTorch's tokens, token for
// token, on one rank and on 4 ranks of every schedule (Ulysses on 2: the tied fixture's 6 heads),
// and 3 of the ring, where the cache is sharded and each token's attention merged from the ranks;
// the first logits agree to tolGenLogits.
func TestGenerateMatchesPyTorch(t *testing.T) {
	cases := readGenerateCases(t)
	worlds := []struct {
		P    int
		attn string
	}{{1, "distflash"}, {4, "distflash"}, {4, "ring"}, {4, "zigzag"}, {4, "burst"}, {2, "ulysses"}, {4, "attn2d"}, {3, "ring"}}
	for _, w := range worlds {
		evs := map[string]*Evaluator{}
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/P%d/%s/%d", c.Model, w.P, w.attn, len(c.PromptIDs)), func(t *testing.T) {
				e := evs[c.Model]
				if e == nil {
					e = evaluatorOf(t, filepath.Join("../weights/testdata/hf", c.Model), w.P, w.attn)
					evs[c.Model] = e
				}
				var streamed []int32
				g, err := e.Generate(context.Background(), c.PromptIDs, GenOptions{MaxNew: len(c.Tokens)}, func(tok int32) { streamed = append(streamed, tok) })
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(g.Tokens, c.Tokens) || !slices.Equal(streamed, c.Tokens) {
					t.Errorf("tokens %v (streamed %v),\nPyTorch  %v (min top-2 margin %.2g)", g.Tokens, streamed, c.Tokens, c.MinMargin)
				}
				if g.Stopped != "length" || g.Decoded != len(c.Tokens)-1 || g.PromptLen != len(c.PromptIDs) {
					t.Errorf("stopped %q after %d steps, prompt %d: want length, %d, %d", g.Stopped, g.Decoded, g.PromptLen, len(c.Tokens)-1, len(c.PromptIDs))
				}
				if w.P == 1 {
					d := model.NewDecoder(e.w.First().Model, nil)
					got := d.Prefill(c.PromptIDs, model.Positions(len(c.PromptIDs)), len(c.PromptIDs), 1)
					var diff, scale float64
					for i, v := range c.FirstLogits {
						diff, scale = max(diff, math.Abs(float64(got[i])-v)), max(scale, math.Abs(v))
					}
					if diff/scale > tolGenLogits {
						t.Errorf("first logits differ from PyTorch's by %.2e of their largest (tol %g)", diff/scale, tolGenLogits)
					}
				}
			})
		}
	}
}

// TestGenerateShardedTraffic: on P ranks each decoded token costs, per layer, one all-gather
// of every rank's partial attention result (output, row maximum and sum: (H·hd + 2H) floats,
// sent to P − 1 ranks), and the token's share; the cache is spread over the ranks.
func TestGenerateShardedTraffic(t *testing.T) {
	const P = 4
	e := evaluatorOf(t, "../weights/testdata/hf/llama-sharded", P, "zigzag")
	c := e.Config
	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32(32 + i)
	}
	g, err := e.Generate(context.Background(), prompt, GenOptions{MaxNew: 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := float64(c.NLayers*(P-1)*(c.QDim()+2*c.NHeads)*4) * float64(g.Decoded) / float64(len(g.Tokens))
	if got := g.BytesPerToken["decode.attn"]; got != want {
		t.Errorf("decode.attn: %.1f bytes per token, want %.1f (%d layers × %d ranks × (%d + 2·%d) floats)", got, want, c.NLayers, P-1, c.QDim(), c.NHeads)
	}
	if g.BytesPerToken["decode.token"] == 0 || len(g.BytesPerToken) != 2 {
		t.Errorf("sites %v: want decode.attn and decode.token only (the prefill's not counted)", g.BytesPerToken)
	}
}

// TestSampler: temperature 0 is the argmax (lowest id of ties); top-k 1 is the argmax at any
// temperature; top-p keeps the smallest set reaching p; sampling follows the softmax (a
// chi-square-free check: frequencies within 4 standard deviations over 20000 draws); the
// same seed gives the same draws.
func TestSampler(t *testing.T) {
	logits := []float32{1, 3, 3, 0, 2}
	if got := newSampler(GenOptions{}).next(logits); got != 1 {
		t.Errorf("greedy: %d, want 1 (the lower of the tied maxima)", got)
	}
	if got := newSampler(GenOptions{Temperature: 5, TopK: 1, Seed: 3}).next(logits); got != 1 {
		t.Errorf("top-k 1: %d, want 1", got)
	}
	// probabilities at temperature 1: e^1, e^3, e^3, e^0, e^2 over their sum
	var sum float64
	p := make([]float64, len(logits))
	for i, l := range logits {
		p[i] = math.Exp(float64(l))
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
	for _, c := range []struct {
		name string
		opt  GenOptions
		want []float64
	}{
		{"softmax", GenOptions{Temperature: 1, Seed: 1}, p},
		{"top-k 2", GenOptions{Temperature: 1, TopK: 2, Seed: 2}, []float64{0, 0.5, 0.5, 0, 0}},
		// sorted: 1, 2 (p 0.4223 each), 4 (0.1554): p = 0.8 needs all three
		{"top-p 0.8", GenOptions{Temperature: 1, TopP: 0.8, Seed: 3}, []float64{0, p[1] / (p[1] + p[2] + p[4]), p[2] / (p[1] + p[2] + p[4]), 0, p[4] / (p[1] + p[2] + p[4])}},
		{"top-p 0.5", GenOptions{Temperature: 1, TopP: 0.5, Seed: 4}, []float64{0, 0.5, 0.5, 0, 0}},
	} {
		const n = 20000
		s := newSampler(c.opt)
		counts := make([]float64, len(logits))
		for range n {
			counts[s.next(logits)]++
		}
		for i, w := range c.want {
			sd := math.Sqrt(n * w * (1 - w))
			if math.Abs(counts[i]-n*w) > 4*sd+1e-9 {
				t.Errorf("%s: token %d drawn %v times of %d, want %.0f ± %.0f", c.name, i, counts[i], n, n*w, 4*sd)
			}
		}
	}
	a, b := newSampler(GenOptions{Temperature: 0.7, Seed: 9}), newSampler(GenOptions{Temperature: 0.7, Seed: 9})
	for range 100 {
		if a.next(logits) != b.next(logits) {
			t.Fatal("the same seed drew different tokens")
		}
	}
}

// TestGenOptionsValidate names each bad option.
func TestGenOptionsValidate(t *testing.T) {
	for _, c := range []struct {
		opt  GenOptions
		want string
	}{
		{GenOptions{MaxNew: 0}, "--max-new-tokens 0"},
		{GenOptions{MaxNew: 1, Temperature: -1}, "--temperature -1"},
		{GenOptions{MaxNew: 1, TopK: -2}, "--top-k -2"},
		{GenOptions{MaxNew: 1, TopP: 1.5}, "--top-p 1.5"},
	} {
		if err := c.opt.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.opt, err, c.want)
		}
	}
}
