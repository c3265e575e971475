package parallel

import (
	"fmt"
	"testing"

	"distflash/model"
	"distflash/parallel/transport"
)

// BenchmarkSchedules times attention forward + backward of one sequence of T tokens on P
// in-process ranks, for every schedule, overlap on and off, beside the single-worker primitive
// on the same sequence (the "P1/local" row). On one machine the ranks share the cores, so the
// total work is the same and the ratio of a schedule's time to the local one is its overhead
// (copies, merges, idle waiting). bench/compare.sh prints the ratios.
func BenchmarkSchedules(b *testing.B) {
	const T = 2048
	h := model.Heads{N: 4, KV: 2, Dim: 32}
	in := newInputs(T, h, 1)
	b.Run("P1/local", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			in.reference()
		}
		b.ReportMetric(float64(T*b.N)/b.Elapsed().Seconds(), "tokens/s")
	})
	for _, P := range []int{2, 4} {
		for _, name := range Names() {
			if Check(name, h, P) != nil {
				continue
			}
			for _, overlap := range []bool{true, false} {
				b.Run(fmt.Sprintf("P%d/%s/overlap=%v", P, name, overlap), func(b *testing.B) {
					for i := 0; i < b.N; i++ {
						if _, err := in.run(name, P, Options{Overlap: overlap}); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(T*b.N)/b.Elapsed().Seconds(), "tokens/s")
				})
			}
		}
	}
}

// BenchmarkOverlap shows that prefetching hides transfer time. The in-process world copies a
// message at once, so there is nothing to hide there; here every message instead takes
// bytes / 20 MB/s on a simulated link (World.SimulateLink), about the time one block of this
// shape takes to compute on this machine. With overlap a rank posts the next block before
// computing the current one and the wait overlaps the compute; without it, every transfer
// adds to the step. Compare the two ms/op of each schedule (and P1/local in
// BenchmarkSchedules for the compute alone).
func BenchmarkOverlap(b *testing.B) {
	const T = 2048
	h := model.Heads{N: 4, KV: 2, Dim: 32}
	in := newInputs(T, h, 1)
	for _, name := range []string{"ring", "zigzag", "distflash", "burst", "attn2d"} {
		for _, overlap := range []bool{true, false} {
			b.Run(fmt.Sprintf("P4/%s/overlap=%v", name, overlap), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					w := transport.NewWorld(4)
					w.SimulateLink(20e6, 0)
					if _, err := in.runOn(w, name, Options{Overlap: overlap}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
