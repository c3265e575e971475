package kernels

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
)

// CPU is the pure-Go backend. Dense products go through this package's SGEMM (gemm.go:
// packed panels and an AVX-512 / AVX2+FMA micro-kernel in Go assembly, a portable Go kernel
// elsewhere; 10–20× gonum's SGEMM on the development machine); the rest is written out here,
// parallel over rows on GOMAXPROCS goroutines with a fixed partition so that results do not
// depend on the thread count.
type CPU struct {
	counters   Counters
	matmulPrec atomic.Uint32 // Precision of MatMul's operands
	device     bool          // buffers are deviceBufs (NewDeviceCPU)
	half       halfPool      // the 16-bit methods' scratch (cpu_half.go)
}

// NewCPU returns a CPU backend with its own counters.
func NewCPU() *CPU { return &CPU{} }

// NewDeviceCPU returns a CPU backend whose buffers pose as device memory: it computes as
// NewCPU does, bit for bit, but Host panics on its buffers and IsHost is false, so that only
// its Upload and Download can move them, as with a GPU's. Communicators that move host memory
// must then stage them (transport.Staged): the staging path of a GPU run, tested on CPUs
// (device.kind = "cpu-device").
func NewDeviceCPU() *CPU { return &CPU{device: true} }

// HostMemory reports whether the backend's buffers are host memory that a communicator may
// read and write directly (false for NewDeviceCPU's).
func (c *CPU) HostMemory() bool { return !c.device }

// cpuBuf is host memory.
type cpuBuf []float32

func (b cpuBuf) Len() int { return len(b) }

// deviceBuf is NewDeviceCPU's buffer: host memory that only the backend's methods touch.
type deviceBuf struct{ x []float32 }

func (b *deviceBuf) Len() int { return len(b.x) }

// Host returns the host slice behind a CPU buffer (for tests and I/O that must not copy).
// It panics for a buffer of another backend, NewDeviceCPU's included.
func Host(b Buf) []float32 {
	if _, ok := b.(*deviceBuf); ok {
		panic("kernels: a buffer of NewDeviceCPU is device memory: Download it")
	}
	return f(b)
}

// IsHost reports whether b is host memory of the CPU backend (what Host returns without panic).
func IsHost(b Buf) bool {
	_, ok := b.(cpuBuf)
	return b == nil || ok
}

// HostBuf returns x as a CPU buffer, sharing its memory (a staging area for communicators
// that move host memory).
func HostBuf(x []float32) Buf { return cpuBuf(x) }

func f(b Buf) []float32 {
	if b == nil {
		return nil
	}
	switch c := b.(type) {
	case cpuBuf:
		return c
	case *deviceBuf:
		return c.x
	}
	panic(fmt.Sprintf("kernels: %T is not a CPU buffer", b))
}

// buf wraps x as a buffer of this backend.
func (c *CPU) buf(x []float32) Buf {
	if c.device {
		return &deviceBuf{x}
	}
	return cpuBuf(x)
}

func mustLen(what string, b []float32, n int) {
	if len(b) != n {
		panic(fmt.Sprintf("kernels: %s has %d elements, want %d", what, len(b), n))
	}
}

// Name implements Backend.
func (c *CPU) Name() string {
	if c.device {
		return "cpu-device"
	}
	return "cpu"
}

// Counters implements Backend.
func (c *CPU) Counters() *Counters { return &c.counters }

// Alloc implements Backend.
func (c *CPU) Alloc(n int) Buf { return c.buf(make([]float32, n)) }

// Slice implements Backend.
func (c *CPU) Slice(b Buf, off, n int) Buf { return c.buf(f(b)[off : off+n : off+n]) }

// Upload implements Backend.
func (c *CPU) Upload(dst Buf, src []float32) { mustLen("upload", src, dst.Len()); copy(f(dst), src) }

// Download implements Backend.
func (c *CPU) Download(dst []float32, src Buf) {
	mustLen("download", dst, src.Len())
	copy(dst, f(src))
}

// Zero implements Backend.
func (c *CPU) Zero(b Buf) { clear(f(b)) }

// Copy implements Backend.
func (c *CPU) Copy(dst, src Buf) { mustLen("copy", f(src), dst.Len()); copy(f(dst), f(src)) }

// Add implements Backend.
func (c *CPU) Add(dst, a, b Buf) {
	d, x, y := f(dst), f(a), f(b)
	mustLen("add a", x, len(d))
	mustLen("add b", y, len(d))
	chunks(len(d), 1<<14, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			d[i] = x[i] + y[i]
		}
	})
}

// Scale implements Backend.
func (c *CPU) Scale(b Buf, s float32) {
	x := f(b)
	chunks(len(x), 1<<14, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			x[i] *= s
		}
	})
}

// SumSquares implements Backend.
func (c *CPU) SumSquares(b Buf) float64 {
	x := f(b)
	return sumChunks(len(x), func(lo, hi int) float64 {
		var s float64
		for _, v := range x[lo:hi] {
			s += float64(v) * float64(v)
		}
		return s
	})
}

// AllFinite implements Backend.
func (c *CPU) AllFinite(b Buf) bool {
	x := f(b)
	bad := sumChunks(len(x), func(lo, hi int) float64 {
		for _, v := range x[lo:hi] {
			if math.IsInf(float64(v), 0) || v != v {
				return 1
			}
		}
		return 0
	})
	return bad == 0
}

// leadingDims is the row strides of MatMul's row-major operands: A is [m, k] (lda k) or,
// transposed, [k, m] (lda m); B is [k, n] (ldb n) or [n, k] (ldb k).
func leadingDims(m, n, k int, transA, transB bool) (lda, ldb int) {
	lda, ldb = k, n
	if transA {
		lda = m
	}
	if transB {
		ldb = k
	}
	return lda, ldb
}

// MatMul implements Backend.
func (c *CPU) MatMul(cb, ab, bb Buf, m, n, k int, transA, transB bool, beta float32) {
	C, A, B := f(cb), f(ab), f(bb)
	mustLen("matmul C", C, m*n)
	mustLen("matmul A", A, m*k)
	mustLen("matmul B", B, k*n)
	c.counters.MatMulFLOPs.Add(int64(2 * m * n * k))
	if m == 0 || n == 0 {
		return
	}
	if k == 0 { // C = beta·C, and C is not read when beta is 0 (BLAS rule: NaNs are overwritten)
		if beta == 0 {
			c.Zero(cb)
		} else {
			c.Scale(cb, beta)
		}
		return
	}
	lda, ldb := leadingDims(m, n, k, transA, transB)
	sgemmPrec(c.MatMulPrecision(), transA, transB, m, n, k, 1, A, lda, B, ldb, beta, C, n)
}

// SetMatMulPrecision implements Backend. The operands are rounded while the GEMM packs them
// (gemm.go), so A and B themselves are not changed.
func (c *CPU) SetMatMulPrecision(p Precision) {
	if p > FP16 {
		panic(fmt.Sprintf("kernels: matmul precision %v", p))
	}
	c.matmulPrec.Store(uint32(p))
}

// MatMulPrecision implements Backend.
func (c *CPU) MatMulPrecision() Precision { return Precision(c.matmulPrec.Load()) }

// Round implements Backend.
func (c *CPU) Round(b Buf, p Precision) {
	x := f(b)
	if p == FP32 {
		return
	}
	mustHalf("round", p)
	chunks(len(x), 1<<14, func(lo, hi int) { roundSlice(x[lo:hi], p) })
}

// PackHalf implements Backend.
func (c *CPU) PackHalf(dst, src Buf, p Precision) {
	d, s := f(dst), f(src)
	mustHalf("pack", p)
	mustLen("pack dst", d, (len(s)+1)/2)
	// Pieces of an even number of source elements, so each piece owns whole words of dst.
	chunks((len(s)+1)/2, 1<<13, func(lo, hi int) { packHalf(d[lo:hi], s[2*lo:min(2*hi, len(s))], p) })
}

// UnpackHalf implements Backend.
func (c *CPU) UnpackHalf(dst, src Buf, p Precision) {
	d, s := f(dst), f(src)
	mustHalf("unpack", p)
	mustLen("unpack src", s, (len(d)+1)/2)
	chunks(len(s), 1<<13, func(lo, hi int) { unpackHalf(d[2*lo:min(2*hi, len(d))], s[lo:hi], p) })
}

// Embedding implements Backend.
func (c *CPU) Embedding(out, table Buf, ids []int32, dim int) {
	o, t := f(out), f(table)
	mustLen("embedding out", o, len(ids)*dim)
	vocab := len(t) / dim
	for i, id := range ids {
		if id < 0 || int(id) >= vocab {
			panic(fmt.Sprintf("kernels: token id %d outside vocabulary of %d", id, vocab))
		}
		copy(o[i*dim:(i+1)*dim], t[int(id)*dim:(int(id)+1)*dim])
	}
}

// EmbeddingBackward implements Backend. Tokens are visited in order, so repeated ids
// accumulate deterministically.
func (c *CPU) EmbeddingBackward(dtable, dout Buf, ids []int32, dim int) {
	dt, do := f(dtable), f(dout)
	mustLen("embedding dout", do, len(ids)*dim)
	for i, id := range ids {
		row := dt[int(id)*dim : (int(id)+1)*dim]
		for j, g := range do[i*dim : (i+1)*dim] {
			row[j] += g
		}
	}
}

// RMSNorm implements Backend.
func (c *CPU) RMSNorm(out, rstd, x, w Buf, rows, dim int, eps float32) {
	o, r, xs, ws := f(out), f(rstd), f(x), f(w)
	mustLen("rmsnorm x", xs, rows*dim)
	mustLen("rmsnorm out", o, rows*dim)
	mustLen("rmsnorm rstd", r, rows)
	mustLen("rmsnorm w", ws, dim)
	chunks(rows, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			rmsNormRow(o[i*dim:(i+1)*dim], &r[i], xs[i*dim:(i+1)*dim], ws, eps)
		}
	})
}

// rmsNormRow normalises one row: out = x·rs·w with rs = 1/sqrt(mean(x²) + eps), the squares
// summed in float64 in order.
func rmsNormRow(out []float32, rs *float32, x, w []float32, eps float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	r := float32(1 / math.Sqrt(ss/float64(len(x))+float64(eps)))
	*rs = r
	for j, v := range x {
		out[j] = v * r * w[j]
	}
}

// AddRMSNorm implements Backend: each row's sum is made, then normalised as RMSNorm does.
func (c *CPU) AddRMSNorm(sum, out, rstd, a, b, w Buf, rows, dim int, eps float32) {
	s, o, r, xa, xb, ws := f(sum), f(out), f(rstd), f(a), f(b), f(w)
	mustLen("add+rmsnorm sum", s, rows*dim)
	mustLen("add+rmsnorm a", xa, rows*dim)
	mustLen("add+rmsnorm b", xb, rows*dim)
	mustLen("add+rmsnorm out", o, rows*dim)
	mustLen("add+rmsnorm rstd", r, rows)
	mustLen("add+rmsnorm w", ws, dim)
	chunks(rows, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := s[i*dim : (i+1)*dim]
			for j, v := range xa[i*dim : (i+1)*dim] {
				row[j] = v + xb[i*dim+j]
			}
			rmsNormRow(o[i*dim:(i+1)*dim], &r[i], row, ws, eps)
		}
	})
}

// RMSNormBackward implements Backend. With r = rstd and g = w ∘ dout,
// dx = r·g − r³/dim · x · (g·x) and dw = Σ_rows dout ∘ x · r.
func (c *CPU) RMSNormBackward(dx, dw, dout, x, w, rstd Buf, rows, dim int) {
	dxs, dws, dos, xs, ws, r := f(dx), f(dw), f(dout), f(x), f(w), f(rstd)
	mustLen("rmsnorm dx", dxs, rows*dim)
	mustLen("rmsnorm dout", dos, rows*dim)
	mustLen("rmsnorm dw", dws, dim)
	parts := fixedParts(rows)
	partial := make([][]float64, len(parts))
	parallel(len(parts), func(p int) {
		acc := make([]float64, dim)
		for i := parts[p][0]; i < parts[p][1]; i++ {
			xr, dr, dxr := xs[i*dim:(i+1)*dim], dos[i*dim:(i+1)*dim], dxs[i*dim:(i+1)*dim]
			rs := float64(r[i])
			var dot float64
			for j := range xr {
				dot += float64(ws[j]) * float64(dr[j]) * float64(xr[j])
			}
			k := rs * rs * rs * dot / float64(dim)
			for j := range xr {
				dxr[j] += float32(rs*float64(ws[j])*float64(dr[j]) - k*float64(xr[j]))
				acc[j] += float64(dr[j]) * float64(xr[j]) * rs
			}
		}
		partial[p] = acc
	})
	for j := range dws {
		var s float64
		for _, acc := range partial {
			s += acc[j]
		}
		dws[j] += float32(s)
	}
}

// RoPE implements Backend. Angles are computed in float64 from the integer position, which
// keeps them exact at the long positions (512K) this project trains at; cos·Scale and
// sin·Scale are rounded to float32 once.
func (c *CPU) RoPE(x Buf, pos []int32, heads, headDim int, t RoPETable, inverse bool) {
	xs := f(x)
	mustLen("rope x", xs, len(pos)*heads*headDim)
	t.check(headDim)
	half := headDim / 2
	sign := 1.0
	if inverse {
		sign = -1
	}
	chunks(len(pos), 16, func(lo, hi int) {
		cos, sin := make([]float32, half), make([]float32, half)
		for tok := lo; tok < hi; tok++ {
			for i, fr := range t.InvFreq {
				s, c := math.Sincos(float64(pos[tok]) * fr)
				cos[i], sin[i] = float32(c*t.Scale), float32(sign*s*t.Scale)
			}
			for h := 0; h < heads; h++ {
				v := xs[(tok*heads+h)*headDim : (tok*heads+h+1)*headDim]
				for i := 0; i < half; i++ {
					a, b := v[i], v[i+half]
					v[i] = a*cos[i] - b*sin[i]
					v[i+half] = b*cos[i] + a*sin[i]
				}
			}
		}
	})
}

func silu(x float32) float32 { return x / (1 + float32(math.Exp(float64(-x)))) }

// SwiGLU implements Backend.
func (c *CPU) SwiGLU(out, gate, up Buf) {
	o, g, u := f(out), f(gate), f(up)
	mustLen("swiglu gate", g, len(o))
	mustLen("swiglu up", u, len(o))
	chunks(len(o), 1<<12, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			o[i] = silu(g[i]) * u[i]
		}
	})
}

// SwiGLUBackward implements Backend: with s = sigmoid(g), d silu(g)/dg = s·(1 + g·(1−s)).
func (c *CPU) SwiGLUBackward(dgate, dup, dout, gate, up Buf) {
	dg, du, do, g, u := f(dgate), f(dup), f(dout), f(gate), f(up)
	mustLen("swiglu dgate", dg, len(do))
	mustLen("swiglu dup", du, len(do))
	chunks(len(do), 1<<12, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			s := float32(1 / (1 + math.Exp(float64(-g[i]))))
			du[i] = do[i] * g[i] * s
			dg[i] = do[i] * u[i] * s * (1 + g[i]*(1-s))
		}
	})
}

// SwiGLUBackwardAct implements Backend. exp(−g) in float64 is what silu and the sigmoid both
// take, computed once: the same values as SwiGLU and SwiGLUBackward.
func (c *CPU) SwiGLUBackwardAct(act, dgate, dup, dout, gate, up Buf) {
	a, dg, du, do, g, u := f(act), f(dgate), f(dup), f(dout), f(gate), f(up)
	mustLen("swiglu act", a, len(do))
	mustLen("swiglu dgate", dg, len(do))
	mustLen("swiglu dup", du, len(do))
	mustLen("swiglu gate", g, len(do))
	mustLen("swiglu up", u, len(do))
	chunks(len(do), 1<<12, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			gi := g[i]
			e := math.Exp(float64(-gi))
			a[i] = gi / (1 + float32(e)) * u[i]
			s := float32(1 / (1 + e))
			du[i] = do[i] * gi * s
			dg[i] = do[i] * u[i] * s * (1 + gi*(1-s))
		}
	})
}

// CrossEntropy implements Backend.
func (c *CPU) CrossEntropy(losses, dlogits, logits Buf, targets []int32, vocab int, dscale float32) {
	ls, lg := f(losses), f(logits)
	rows := len(targets)
	mustLen("cross-entropy logits", lg, rows*vocab)
	mustLen("cross-entropy losses", ls, rows)
	var dl []float32
	if dlogits != nil {
		dl = f(dlogits)
		mustLen("cross-entropy dlogits", dl, rows*vocab)
	}
	checkTargets(targets, vocab) // here, not in the workers, so the panic is recoverable
	chunks(rows, 4, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			row := lg[i*vocab : (i+1)*vocab]
			t := int(targets[i])
			mx := float32(math.Inf(-1))
			for _, v := range row {
				mx = max(mx, v)
			}
			var sum float64
			for _, v := range row {
				sum += math.Exp(float64(v - mx))
			}
			lse := float64(mx) + math.Log(sum)
			if t < 0 {
				ls[i] = 0
			} else {
				ls[i] = float32(lse - float64(row[t]))
			}
			if dl == nil {
				continue
			}
			drow := dl[i*vocab : (i+1)*vocab]
			if t < 0 {
				clear(drow)
				continue
			}
			for j, v := range row {
				drow[j] = float32(math.Exp(float64(v)-lse)) * dscale
			}
			drow[t] -= dscale
		}
	})
}

// checkTargets panics on a target past the vocabulary (a negative one marks an ignored row).
func checkTargets(targets []int32, vocab int) {
	for _, t := range targets {
		if int(t) >= vocab {
			panic(fmt.Sprintf("kernels: target %d outside vocabulary of %d", t, vocab))
		}
	}
}

// AdamW implements Backend:
// m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²; p ← p − lr·(m̂/(√v̂ + ε) + λ·p),
// with m̂ = m/(1−β1^t), v̂ = v/(1−β2^t) and λ = weight decay (decoupled; 0 when decay is false).
func (c *CPU) AdamW(pb, gb, mb, vb Buf, hp AdamWStep, decay bool) {
	p, g, m, v := f(pb), f(gb), f(mb), f(vb)
	mustLen("adamw g", g, len(p))
	mustLen("adamw m", m, len(p))
	mustLen("adamw v", v, len(p))
	b1, b2 := float32(hp.Beta1), float32(hp.Beta2)
	c1 := float32(1 - math.Pow(hp.Beta1, float64(hp.Step)))
	c2 := float32(1 - math.Pow(hp.Beta2, float64(hp.Step)))
	lr, eps, gs := float32(hp.LR), float32(hp.Eps), hp.GradScale
	wd := float32(0)
	if decay {
		wd = float32(hp.WeightDecay)
	}
	chunks(len(p), 1<<12, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			gi := g[i] * gs
			m[i] = b1*m[i] + (1-b1)*gi
			v[i] = b2*v[i] + (1-b2)*gi*gi
			mh, vh := m[i]/c1, v[i]/c2
			p[i] -= lr * (mh/(float32(math.Sqrt(float64(vh)))+eps) + wd*p[i])
		}
	})
}

// AdamWSegments implements Backend: AdamW on each segment's slices.
func (c *CPU) AdamWSegments(pb, gb, mb, vb Buf, segs []AdamWSegment, hp AdamWStep) {
	n := pb.Len()
	mustLen("adamw g", f(gb), n)
	mustLen("adamw m", f(mb), n)
	mustLen("adamw v", f(vb), n)
	checkSegments(segs, n)
	for _, s := range segs {
		c.AdamW(c.Slice(pb, s.Off, s.N), c.Slice(gb, s.Off, s.N), c.Slice(mb, s.Off, s.N), c.Slice(vb, s.Off, s.N), hp, s.Decay)
	}
}

// checkSegments panics unless segs are in increasing order, disjoint and inside n elements.
func checkSegments(segs []AdamWSegment, n int) {
	end := 0
	for i, s := range segs {
		if s.N < 0 || s.Off < end || s.Off+s.N > n {
			panic(fmt.Sprintf("kernels: adamw segment %d [%d, %d+%d): not after the previous one (ending at %d) and inside %d elements", i, s.Off, s.Off, s.N, end, n))
		}
		end = s.Off + s.N
	}
}

// parallel runs fn(0..n-1) on up to GOMAXPROCS goroutines; each index runs exactly once.
func parallel(n int, fn func(i int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// chunks splits [0, n) into pieces of at least grain elements and runs fn on each in parallel.
func chunks(n, grain int, fn func(lo, hi int)) {
	pieces := min(max(n/grain, 1), 4*runtime.GOMAXPROCS(0))
	parallel(pieces, func(p int) { fn(p*n/pieces, (p+1)*n/pieces) })
}

// fixedParts splits [0, n) into a partition that depends only on n (at most 16 parts), so
// reductions over it are reproducible whatever the thread count.
func fixedParts(n int) [][2]int {
	parts := min(n, 16)
	out := make([][2]int, parts)
	for p := range out {
		out[p] = [2]int{p * n / parts, (p + 1) * n / parts}
	}
	return out
}

// sumChunks reduces fn over a fixed partition of [0, n) in float64, in order.
func sumChunks(n int, fn func(lo, hi int) float64) float64 {
	parts := fixedParts(n)
	vals := make([]float64, len(parts))
	parallel(len(parts), func(p int) { vals[p] = fn(parts[p][0], parts[p][1]) })
	var s float64
	for _, v := range vals {
		s += v
	}
	return s
}
