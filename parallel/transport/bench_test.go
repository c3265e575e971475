package transport

import (
	"testing"

	"distflash/kernels"
)

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
