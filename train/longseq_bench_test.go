package train

import (
	"fmt"
	"io"
	"testing"

	"distflash/config"
)

// BenchmarkLongSeqStep times one training step of a long-sequence model (dim 256, one layer,
// 4 query heads over 2 key/value heads of head_dim 64, batch 1) at sequence 4K, 16K and 32K,
// on one rank and on 2 in-process ranks that split the sequence (the distflash schedule).
// At these lengths attention is most of the step; bench/longseq.sh runs it under the CPU
// profiler and prints the attention share beside tokens/s.
//
//	go test . -run '^$' -bench LongSeqStep -benchtime 1x
func BenchmarkLongSeqStep(b *testing.B) {
	for _, T := range []int{4096, 16384, 32768} {
		for _, P := range []int{1, 2} {
			b.Run(fmt.Sprintf("T%d/P%d", T, P), func(b *testing.B) {
				sets := []string{"model.dim=256", "model.n_layers=1", "model.n_heads=4", "model.n_kv_heads=2",
					"model.ffn_dim=704", fmt.Sprintf("model.max_seq_len=%d", T), fmt.Sprintf("data.seq_len=%d", T),
					"data.batch_size=1", fmt.Sprintf("data.max_bytes=%d", 4*T+4096),
					fmt.Sprintf("parallelism.world_size=%d", P), fmt.Sprintf("parallelism.sequence_parallel_degree=%d", P),
					"parallelism.attention=distflash", "checkpoint.activation=none"}
				cfg, err := config.Load("../configs/tiny.toml", sets)
				if err != nil {
					b.Fatal(err)
				}
				tr, err := newTrainer(cfg, io.Discard)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tr.step(0); err != nil { // allocations, first touch
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, err := tr.step(i + 1); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(cfg.TokensPerStep()*int64(b.N))/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}
