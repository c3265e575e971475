package transport_test

import (
	"fmt"
	"math"
	"sync"
	"testing"

	"distflash/kernels"
	"distflash/parallel/transport"
	"distflash/parallel/transport/transporttest"
)

// devBuf is a buffer that is not host memory: only a Stager can move it, as with the CUDA
// backend's device buffers.
type devBuf struct{ x []float32 }

func (b *devBuf) Len() int { return len(b.x) }

// fakeDevice stages devBufs and counts the copies.
type fakeDevice struct {
	mu       sync.Mutex
	up, down int
}

func (d *fakeDevice) Upload(dst kernels.Buf, src []float32) {
	d.mu.Lock()
	d.up++
	d.mu.Unlock()
	copy(dst.(*devBuf).x, src)
}

func (d *fakeDevice) Download(dst []float32, src kernels.Buf) {
	d.mu.Lock()
	d.down++
	d.mu.Unlock()
	copy(dst, src.(*devBuf).x)
}

// TestStagedMatchesHost runs every transport.Comm call on host buffers and, through transport.Staged, on buffers
// that only a Stager can read, on in-process worlds of 1 to 4 ranks (and a Split group), and
// checks the same bits arrive and the same bytes are counted per call site.
func TestStagedMatchesHost(t *testing.T) {
	for _, P := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint("P", P), func(t *testing.T) {
			run := func(staged bool) ([][]float32, []transport.Traffic) {
				outs, traffic := make([][]float32, P), make([]transport.Traffic, P)
				dev := &fakeDevice{}
				err := transport.NewWorld(P).Run(func(c transport.Comm) error {
					r := c.Rank()
					buf := func(x []float32) kernels.Buf {
						if staged {
							return &devBuf{x}
						}
						return kernels.HostBuf(x)
					}
					read := func(b kernels.Buf) []float32 {
						if staged {
							return b.(*devBuf).x
						}
						return kernels.Host(b)
					}
					if staged {
						c = transport.Staged(c, dev)
					}
					out := transporttest.Exercise(c, buf, read)
					c.Barrier()
					outs[r], traffic[r] = out, c.Traffic()
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if staged && (dev.up == 0 || dev.down == 0) {
					t.Fatalf("staged run made %d uploads and %d downloads: the device buffers were not staged", dev.up, dev.down)
				}
				return outs, traffic
			}
			hostOut, hostTraffic := run(false)
			devOut, devTraffic := run(true)
			for r := range P {
				if len(hostOut[r]) != len(devOut[r]) {
					t.Fatalf("rank %d: %d values staged, %d on the host", r, len(devOut[r]), len(hostOut[r]))
				}
				for i := range hostOut[r] {
					if math.Float32bits(hostOut[r][i]) != math.Float32bits(devOut[r][i]) {
						t.Fatalf("rank %d value %d: staged %g, host %g", r, i, devOut[r][i], hostOut[r][i])
					}
				}
				if hostTraffic[r].String() != devTraffic[r].String() {
					t.Errorf("rank %d traffic: staged %v, host %v", r, devTraffic[r], hostTraffic[r])
				}
			}
		})
	}
}

// pinnedDevice is a fakeDevice that allocates the host copies itself, as a GPU's page-locked
// memory.
type pinnedDevice struct {
	fakeDevice
	mu     sync.Mutex
	pinned int
}

func (d *pinnedDevice) AllocHost(n int) []float32 {
	d.mu.Lock()
	d.pinned++
	d.mu.Unlock()
	return make([]float32, n)
}

// TestStagedPoolReuses: the host copies of staged calls come from a pool: repeating a step's
// calls (a ring exchange, an all-reduce, an all-gather in a Split group) allocates nothing after
// the first step, and a Stager that allocates host memory (HostAllocator) provides every copy.
func TestStagedPoolReuses(t *testing.T) {
	const P, n, steps = 4, 6, 5
	dev := &pinnedDevice{}
	allocs := make([][]int, P)
	err := transport.NewWorld(P).Run(func(inner transport.Comm) error {
		c := transport.Staged(inner, dev)
		sub := c.Split(c.Rank()%2, c.Rank(), "split")
		r := c.Rank()
		for range steps {
			send, recv, ar := &devBuf{make([]float32, n)}, &devBuf{make([]float32, n)}, &devBuf{make([]float32, n)}
			rq := c.Irecv(recv, (r+P-1)%P, 1, "p2p")
			sq := c.Isend(send, (r+1)%P, 1, "p2p")
			sq.Wait()
			rq.Wait()
			c.AllReduce(ar, "ar")
			sub.AllGather(&devBuf{make([]float32, sub.Size()*n)}, &devBuf{make([]float32, n)}, "sub.ag")
			c.Barrier()
			allocs[r] = append(allocs[r], transport.PoolAllocs(c))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// the pool is one per rank's communicator (and its Splits): its count after each step
	for r := range P {
		if first, last := allocs[r][0], allocs[r][steps-1]; first == 0 || last != first {
			t.Errorf("rank %d: %d host buffers after the first step, %d after the last: want the same, above 0", r, first, last)
		}
	}
	total := 0
	for r := range P {
		total += allocs[r][steps-1]
	}
	if dev.pinned != total {
		t.Errorf("the HostAllocator made %d of the %d host buffers", dev.pinned, total)
	}
}
