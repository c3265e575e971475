//go:build mpi

package transport_test

import (
	"bufio"
	"flag"
	"fmt"
	"strings"
	"testing"

	"distflash/kernels"
	"distflash/parallel/transport"
	"distflash/parallel/transport/transporttest"
)

// mpiBenchSizes are the message sizes of BenchmarkMPIPointToPoint, in bytes.
var mpiBenchSizes = []struct {
	name  string
	bytes int
}{{"4KB", 4 << 10}, {"64KB", 64 << 10}, {"1MB", 1 << 20}, {"16MB", 16 << 20}, {"64MB", 64 << 20}}

// mpiExchange is the point-to-point pattern of the ring schedules on two ranks: n times, each
// rank sends send to the other and receives as much into recv, both in flight together.
func mpiExchange(c transport.Comm, send, recv kernels.Buf, n int) {
	peer := 1 - c.Rank()
	for i := 0; i < n; i++ {
		rq := c.Irecv(recv, peer, 1, "bench")
		sq := c.Isend(send, peer, 1, "bench")
		rq.Wait()
		sq.Wait()
	}
}

// BenchmarkMPIPointToPoint measures point-to-point bandwidth between two ranks on this machine
// (Open MPI's shared-memory transport) for messages of 4 KB to 64 MB, beside the in-process
// world's for the same exchange. Each iteration both ranks send one message to the other at
// once; GB/s is the bytes one rank sends per second (10⁹ bytes). Started by go test
// (go test -tags mpi -run '^$' -bench MPIPointToPoint ./parallel/transport), it runs the in-process
// sizes itself and the MPI sizes under mpirun -np 2, printing the MPI ranks' result lines.
func BenchmarkMPIPointToPoint(b *testing.B) {
	c := mpiTest.comm
	if c == nil {
		for _, sz := range mpiBenchSizes {
			bufs := [2][2]kernels.Buf{}
			for r := range bufs {
				be := kernels.NewCPU()
				bufs[r] = [2]kernels.Buf{be.Alloc(sz.bytes / 4), be.Alloc(sz.bytes / 4)}
			}
			b.Run("inproc/"+sz.name, func(b *testing.B) {
				w := transport.NewWorld(2)
				if err := w.Run(func(c transport.Comm) error {
					mpiExchange(c, bufs[c.Rank()][0], bufs[c.Rank()][1], b.N)
					return nil
				}); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(sz.bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
		args := []string{"-test.run=^$", "-test.bench=^BenchmarkMPIPointToPoint$"}
		for _, f := range []string{"test.benchtime", "test.count", "test.cpu"} {
			if v := flag.Lookup(f); v != nil && v.Value.String() != "" {
				args = append(args, "-"+f+"="+v.Value.String())
			}
		}
		out, _, err := transporttest.MPIRunSelf(b, 2, 0, nil, args...)
		if err != nil {
			b.Fatalf("mpirun -np 2: %v\n%s", err, out)
		}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "BenchmarkMPIPointToPoint/mpi/") {
				fmt.Println(sc.Text())
			}
		}
		return
	}
	if c.Size() != 2 {
		b.Skipf("needs 2 ranks, has %d", c.Size())
	}
	be := kernels.NewCPU()
	for _, sz := range mpiBenchSizes {
		send, recv := be.Alloc(sz.bytes/4), be.Alloc(sz.bytes/4) // once: the runs of b.N reuse them
		b.Run("mpi/"+sz.name, func(b *testing.B) {
			mpiBenchCommand(c, sz.bytes/4, b.N)
			mpiExchange(c, send, recv, b.N)
			b.ReportMetric(float64(sz.bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}

// The benchmark ranks other than 0 serve rank 0's benchmark framework, which alone decides
// how many iterations to run: for each run it sends them a command (values per message and
// iterations, each split into two float32s exact up to 2⁴⁴), and a length of −1 to stop.
const mpiBenchTag = 2

func mpiBenchCommand(c transport.Comm, values, n int) {
	be := kernels.NewCPU()
	cmd := commBuf(be, []float32{float32(values >> 20), float32(values & (1<<20 - 1)), float32(n >> 20), float32(n & (1<<20 - 1))})
	if values < 0 {
		kernels.Host(cmd)[0] = -1
	}
	for r := 1; r < c.Size(); r++ {
		c.Isend(cmd, r, mpiBenchTag, "bench.cmd").Wait()
	}
}

func mpiBenchQuit(c transport.Comm) { mpiBenchCommand(c, -1, 0) }

func mpiBenchServe(c transport.Comm) {
	be := kernels.NewCPU()
	cmd := be.Alloc(4)
	var send, recv kernels.Buf
	for {
		c.Irecv(cmd, 0, mpiBenchTag, "bench.cmd").Wait()
		x := kernels.Host(cmd)
		if x[0] < 0 {
			return
		}
		values, n := int(x[0])<<20+int(x[1]), int(x[2])<<20+int(x[3])
		if c.Rank() != 1 {
			continue
		}
		if send == nil || send.Len() != values {
			send, recv = be.Alloc(values), be.Alloc(values)
		}
		mpiExchange(c, send, recv, n)
	}
}
