package model

import (
	"math/rand/v2"
	"testing"

	"distflash/kernels"
)

// BenchmarkForwardBackward times forward + backward of the default (tiny) config on one batch of
// 8 × 128 tokens, the work of one step of configs/tiny.toml less the optimizer update
// (BenchmarkTrainStep in package main is the whole step). Compare with
// `/usr/bin/python3 scripts/reference.py bench --threads 2` in the same session.
func BenchmarkForwardBackward(b *testing.B) {
	for _, policy := range []Checkpoint{CheckpointNone, CheckpointLayer, CheckpointAttnOutput} {
		b.Run(policy.String(), func(b *testing.B) {
			cfg := DefaultConfig()
			if err := cfg.Resolve(); err != nil {
				b.Fatal(err)
			}
			B, T := 8, 128
			m := New(cfg, policy, kernels.NewCPU())
			m.LoadParams(InitParams(cfg, m.Layout, 1))
			r := rand.New(rand.NewPCG(1, 1))
			ids, tg := randomTokens(r, B*T, cfg.VocabSize), randomTokens(r, B*T, cfg.VocabSize)
			pos := Positions(T)
			m.ForwardBackward(Batch{IDs: ids, Targets: tg, B: B, Pos: pos}, 1) // allocate
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				m.ZeroGrads()
				m.ForwardBackward(Batch{IDs: ids, Targets: tg, B: B, Pos: pos}, float32(1.0/float64(B*T)))
			}
			b.ReportMetric(float64(B*T*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
