package transporttest

import (
	"math"

	"distflash/kernels"
	"distflash/parallel/transport"
)

// Exercise runs every Comm call once on c (collectives, a ring exchange, a split group's
// all-gather) with values that depend on the rank and returns what this rank received; buf
// makes a buffer of c's kind from values and read reads one back.
func Exercise(c transport.Comm, buf func([]float32) kernels.Buf, read func(kernels.Buf) []float32) []float32 {
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
