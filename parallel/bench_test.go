package parallel

import (
	"fmt"
	"testing"

	"distflash/kernels"
	"distflash/model"
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
					w := NewWorld(4)
					w.SimulateLink(20e6, 0)
					if _, err := in.runOn(w, name, Options{Overlap: overlap}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// inprocBenchSizes are the message sizes of BenchmarkInprocPointToPoint, in bytes.
var inprocBenchSizes = []struct {
	name  string
	bytes int
}{{"4KB", 4 << 10}, {"64KB", 64 << 10}, {"1MB", 1 << 20}, {"16MB", 16 << 20}, {"64MB", 64 << 20}}

// BenchmarkInprocPointToPoint measures the in-process world's point-to-point bandwidth for
// messages of 4 KB to 64 MB in the ring schedules' pattern on two ranks: each iteration both
// ranks post a receive from the other, send to it, and wait for both, so two messages are in
// flight at once. GB/s is the bytes one rank sends per second (10⁹ bytes).
func BenchmarkInprocPointToPoint(b *testing.B) {
	for _, sz := range inprocBenchSizes {
		b.Run(sz.name, func(b *testing.B) {
			var bufs [2][2]kernels.Buf
			for r := range bufs {
				be := kernels.NewCPU()
				bufs[r] = [2]kernels.Buf{be.Alloc(sz.bytes / 4), be.Alloc(sz.bytes / 4)}
				for _, buf := range bufs[r] { // touch every page before the clock starts
					for i, h := 0, kernels.Host(buf); i < len(h); i++ {
						h[i] = float32(r + 1)
					}
				}
			}
			w := NewWorld(2)
			b.ResetTimer()
			if err := w.Run(func(c Comm) error {
				send, recv, peer := bufs[c.Rank()][0], bufs[c.Rank()][1], 1-c.Rank()
				for i := 0; i < b.N; i++ {
					rq := c.Irecv(recv, peer, 1, "bench")
					sq := c.Isend(send, peer, 1, "bench")
					rq.Wait()
					sq.Wait()
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(sz.bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}
