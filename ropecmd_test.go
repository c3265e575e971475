package main

import (
	"fmt"
	"testing"

	"distflash/config"
	"distflash/evaluate"
	"distflash/model"
	"distflash/parallel"
)

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
