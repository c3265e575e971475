package parallel

import (
	"fmt"
	"math"
	"sync"
	"testing"

	"distflash/kernels"
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

// TestStagedMatchesHost runs every Comm call on host buffers and, through Staged, on buffers
// that only a Stager can read, on in-process worlds of 1 to 4 ranks (and a Split group), and
// checks the same bits arrive and the same bytes are counted per call site.
func TestStagedMatchesHost(t *testing.T) {
	for _, P := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint("P", P), func(t *testing.T) {
			run := func(staged bool) ([][]float32, []Traffic) {
				outs, traffic := make([][]float32, P), make([]Traffic, P)
				dev := &fakeDevice{}
				err := NewWorld(P).Run(func(c Comm) error {
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
						c = Staged(c, dev)
					}
					out := exerciseComm(c, buf, read)
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
	err := NewWorld(P).Run(func(inner Comm) error {
		c := Staged(inner, dev)
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
			allocs[r] = append(allocs[r], c.(*stagedComm).pool.allocs)
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

// exerciseComm runs every Comm call once on c (collectives, a ring exchange, a split group's
// all-gather) with values that depend on the rank and returns what this rank received; buf
// makes a buffer of c's kind from values and read reads one back.
func exerciseComm(c Comm, buf func([]float32) kernels.Buf, read func(kernels.Buf) []float32) []float32 {
	r, P := c.Rank(), c.Size()
	vals := func(n, salt int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(math.Sin(float64(1000*r + 37*salt + i)))
		}
		return x
	}
	const n = 5
	var out []float32
	g := buf(make([]float32, P*n))
	c.AllGather(g, buf(vals(n, 1)), "ag")
	out = append(out, read(g)...)
	rs := buf(make([]float32, n))
	c.ReduceScatter(rs, buf(vals(P*n, 2)), "rs")
	out = append(out, read(rs)...)
	ar := buf(vals(n, 3))
	c.AllReduce(ar, "ar")
	out = append(out, read(ar)...)
	a2a := buf(make([]float32, P*n))
	c.AllToAll(a2a, buf(vals(P*n, 4)), "a2a")
	out = append(out, read(a2a)...)
	// a ring exchange: send to the next rank, receive from the previous one
	recv := buf(make([]float32, n))
	src := buf(vals(n, 5))
	rq := c.Irecv(recv, (r+P-1)%P, 7, "p2p")
	sq := c.Isend(src, (r+1)%P, 7, "p2p")
	sq.Wait()
	rq.Wait()
	rq.Wait() // a second Wait changes nothing
	out = append(out, read(recv)...)
	// a split group: even and odd ranks
	sub := c.Split(r%2, r, "split")
	sg := buf(make([]float32, sub.Size()*n))
	sub.AllGather(sg, buf(vals(n, 6)), "sub.ag")
	out = append(out, read(sg)...)
	return out
}
