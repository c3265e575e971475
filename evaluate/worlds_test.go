package evaluate

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"distflash/config"
	"distflash/model"
)

// TestEvaluatorWorlds: the loss, the loss by position (with and without sliding windows), a
// teacher-forced argmax and a greedy generation of one model, on one rank and on worlds of 4
// ranks of every shape: sequence-parallel (two schedules), data-parallel replicas, both, the
// hybrid, FSDP-sharded weights. Every world gives one rank's numbers within 1e-5 relative (the
// schedules merge partial attention in another order, in float32; the loss is summed in
// float64 in sample order on every world), the same argmax and the same tokens. Five samples
// on two replicas leave one replica a round without a sample, which must still take part.
func TestEvaluatorWorlds(t *testing.T) {
	mc := model.Config{Dim: 32, NLayers: 2, NHeads: 4, NKVHeads: 2, FFNDim: 48, VocabSize: 61, MaxSeqLen: 128, NormEps: 1e-5, RopeTheta: 1e4}
	if err := mc.Resolve(); err != nil {
		t.Fatal(err)
	}
	params := model.InitParams(mc, model.NewLayout(mc), 5)
	rng := rand.New(rand.NewPCG(1, 2))
	var samples []Sample
	for _, n := range []int{37, 64, 9, 50, 23} {
		ids := make([]int32, n+1)
		for i := range ids {
			ids[i] = int32(rng.IntN(mc.VocabSize))
		}
		samples = append(samples, Sample{IDs: ids[:n], Targets: ids[1:], Bytes: n})
	}
	prompt := samples[0].IDs[:11]
	type result struct {
		res    Result
		pos    *PositionResult
		win    Result
		argmax []int32
		tokens []int32
	}
	run := func(par config.ParallelismConfig) result {
		t.Helper()
		e, err := Local(mc, par, params)
		if err != nil {
			t.Fatal(err)
		}
		var out result
		if out.res, out.pos, err = e.EvaluateWith(context.Background(), samples, EvalOptions{Positions: true}, nil); err != nil {
			t.Fatal(err)
		}
		if out.win, _, err = e.EvaluateWith(context.Background(), samples, EvalOptions{Window: 16, Stride: 5}, nil); err != nil {
			t.Fatal(err)
		}
		if _, out.argmax, err = e.Forward(samples[1].IDs, samples[1].Targets, []int{0, 17, 63}); err != nil {
			t.Fatal(err)
		}
		g, err := e.Generate(context.Background(), prompt, GenOptions{MaxNew: 12}, nil)
		if err != nil {
			t.Fatal(err)
		}
		out.tokens = g.Tokens
		return out
	}
	par := config.Default().Parallelism
	one := run(par)
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-5*math.Abs(b) }
	for _, tc := range []struct {
		world, sp, u int
		attn         string
		fsdp         bool
	}{
		{4, 4, 1, "ring", false},
		{4, 4, 1, "distflash", false},
		{2, 1, 1, "ring", false},
		{4, 2, 1, "zigzag", false},
		{4, 4, 2, "ring", false},
		{4, 2, 1, "burst", true},
		{3, 1, 1, "ring", true},
	} {
		t.Run(fmt.Sprintf("world%d/sp%d/u%d/%s/fsdp=%v", tc.world, tc.sp, tc.u, tc.attn, tc.fsdp), func(t *testing.T) {
			p := par
			p.WorldSize, p.SequenceParallelDegree, p.UlyssesDegree, p.Attention, p.FSDP = tc.world, tc.sp, tc.u, tc.attn, tc.fsdp
			got := run(p)
			if !near(got.res.Loss, one.res.Loss) || got.res.Tokens != one.res.Tokens || got.res.Bytes != one.res.Bytes {
				t.Errorf("loss %.9f over %d tokens, one rank %.9f over %d", got.res.Loss, got.res.Tokens, one.res.Loss, one.res.Tokens)
			}
			if !near(got.win.Loss, one.win.Loss) || got.win.Tokens != one.win.Tokens {
				t.Errorf("sliding windows: loss %.9f over %d tokens, one rank %.9f over %d", got.win.Loss, got.win.Tokens, one.win.Loss, one.win.Tokens)
			}
			for i := range one.pos.Loss {
				if !near(got.pos.Loss[i], one.pos.Loss[i]) || got.pos.Tokens[i] != one.pos.Tokens[i] {
					t.Errorf("positions [%d, %d): %.9f over %d, one rank %.9f over %d", one.pos.Lo[i], one.pos.Hi[i], got.pos.Loss[i], got.pos.Tokens[i], one.pos.Loss[i], one.pos.Tokens[i])
				}
			}
			if !slices.Equal(got.argmax, one.argmax) {
				t.Errorf("argmax %v, one rank %v", got.argmax, one.argmax)
			}
			if !slices.Equal(got.tokens, one.tokens) {
				t.Errorf("greedy tokens %v, one rank %v", got.tokens, one.tokens)
			}
		})
	}
}
