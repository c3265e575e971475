package kernels

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Single-precision GEMM in the BLIS/GotoBLAS style.
//
// op(A) and op(B) are packed, per block of gemmKC steps of k, into contiguous panels of
// MR rows of op(A) and NR columns of op(B) (packing absorbs the transposes, so one
// microkernel serves all four cases); a microkernel then computes a full MR×NR tile of
// C over the block. Tiles that stick out of C are computed into a scratch tile and the
// valid part is written back with the same arithmetic the microkernel uses.
//
// Reproducibility: every element of C is computed the same way whatever the thread
// count or the way tiles are handed out: its dot product runs over k in order, in blocks
// of exactly gemmKC (fixed), each block being one fused multiply-add chain in the
// microkernel (or the pure-Go equivalent), and the block result r is folded into C as
// c = float32(alpha·r) + float32(beta'·c) with beta' = beta for the first block and 1
// after (beta' == 0: c is not read). k is never split across goroutines; only the
// partition of C into work items depends on GOMAXPROCS, and it cannot change any value.

const (
	gemmKC = 256  // k block: packed panels of op(A) and op(B) cover gemmKC steps of k
	gemmMC = 144  // rows of C per work item (at most); an MC×KC block of packed A stays in L2
	gemmNC = 4096 // columns of op(B) packed at a time (KC×NC floats, shared by all workers)
	gemmMS = 4096 // rows of op(A) packed at a time (MS×KC floats, shared by all workers)

	// gemmSmall: below this many multiply-adds (m·n·k) everything runs on the caller.
	gemmSmall = 32 << 10
)

// gemmKernelFunc computes, for an MR×NR tile, r = Σ_{p<kc} a[p·MR+i]·b[p·NR+j] (in order
// of p) and stores c[i·ldc+j] = float32(alpha·r) + float32(beta·c[i·ldc+j]), not reading c
// when beta == 0. a holds kc·MR packed floats, b kc·NR.
type gemmKernelFunc func(kc int, a, b, c *float32, ldc int, alpha, beta float32)

// gemmImpl is a microkernel with its tile shape.
type gemmImpl struct {
	name   string
	mr, nr int
	kernel gemmKernelFunc
}

// gemmKernel is the microkernel in use; gemm_amd64.go replaces it when the CPU has the
// instructions its assembly needs.
var gemmKernel = gemmImpl{name: "go", mr: 4, nr: 8, kernel: sgemmKernelGo4x8}

// sgemm computes C = alpha·op(A)·op(B) + beta·C; C is m×n with row stride ldc; op(A) is m×k,
// stored m×k (lda ≥ k) or, when transA, k×m (lda ≥ m); op(B) is k×n, stored k×n (ldb ≥ n) or,
// when transB, n×k (ldb ≥ k). beta == 0 means C is not read (NaNs in C are overwritten).
//
// The result is bit-identical whatever GOMAXPROCS is.
func sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	sgemmWith(&gemmKernel, runtime.GOMAXPROCS(0), transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// gemmCheck panics unless a rows×cols matrix with row stride ld fits in s.
func gemmCheck(what string, s []float32, rows, cols, ld int) {
	if ld < max(1, cols) {
		panic(fmt.Sprintf("sgemm: bad leading dimension of %s: %d < %d", what, ld, cols))
	}
	if rows > 0 && cols > 0 && len(s) < (rows-1)*ld+cols {
		panic(fmt.Sprintf("sgemm: %s too short: %d floats for %d×%d with stride %d", what, len(s), rows, cols, ld))
	}
}

func sgemmWith(impl *gemmImpl, threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("sgemm: negative dimension %d×%d×%d", m, n, k))
	}
	if transA {
		gemmCheck("A", a, k, m, lda)
	} else {
		gemmCheck("A", a, m, k, lda)
	}
	if transB {
		gemmCheck("B", b, n, k, ldb)
	} else {
		gemmCheck("B", b, k, n, ldb)
	}
	gemmCheck("C", c, m, n, ldc)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		gemmScaleC(m, n, beta, c, ldc)
		return
	}
	if m*n*k < gemmSmall {
		threads = 1
	}
	threads = max(threads, 1)

	mr, nr := impl.mr, impl.nr
	g := gemmJob{
		impl: impl, transA: transA, transB: transB,
		a: a, lda: lda, b: b, ldb: ldb, c: c, ldc: ldc, alpha: alpha,
	}
	ms0 := min(m, gemmMS)
	nc0 := min(n, gemmNC)
	kc0 := min(k, gemmKC)
	abuf := gemmGetBuf(gemmCeilDiv(ms0, mr) * mr * kc0)
	bbuf := gemmGetBuf(gemmCeilDiv(nc0, nr) * nr * kc0)
	defer gemmPutBuf(abuf)
	defer gemmPutBuf(bbuf)

	for jc := 0; jc < n; jc += gemmNC {
		nc := min(gemmNC, n-jc)
		for ic := 0; ic < m; ic += gemmMS {
			ms := min(gemmMS, m-ic)
			plan := gemmPlan(gemmCeilDiv(ms, mr), gemmCeilDiv(nc, nr), mr, threads)
			for pc := 0; pc < k; pc += gemmKC {
				kc := min(gemmKC, k-pc)
				g.i0, g.j0, g.p0, g.ms, g.nc, g.kc = ic, jc, pc, ms, nc, kc
				g.ap, g.bp = *abuf, *bbuf
				g.beta = beta
				if pc > 0 {
					g.beta = 1
				}
				g.pack(threads)
				g.compute(&plan, threads)
			}
		}
	}
}

// gemmScaleC sets C = beta·C (C = 0 when beta == 0, without reading C).
func gemmScaleC(m, n int, beta float32, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		switch beta {
		case 0:
			clear(row)
		case 1:
		default:
			for j := range row {
				row[j] *= beta
			}
		}
	}
}

func gemmCeilDiv(a, b int) int { return (a + b - 1) / b }

// gemmJob is one call's state for one (row block, column block, k block) step.
type gemmJob struct {
	impl           *gemmImpl
	transA, transB bool
	a, b, c        []float32
	lda, ldb, ldc  int
	alpha, beta    float32

	i0, j0, p0 int // origin of the step in op(A) rows, op(B) columns, k
	ms, nc, kc int // its extent
	ap, bp     []float32
}

// pack packs rows [i0, i0+ms) of op(A) and columns [j0, j0+nc) of op(B) over k in
// [p0, p0+kc), zero-padding partial panels.
func (g *gemmJob) pack(threads int) {
	mr, nr := g.impl.mr, g.impl.nr
	na, nb := gemmCeilDiv(g.ms, mr), gemmCeilDiv(g.nc, nr)
	// Units of work: groups of panels, roughly 16K floats each.
	ga := max(1, (16<<10)/(mr*g.kc))
	gb := max(1, (16<<10)/(nr*g.kc))
	ua, ub := gemmCeilDiv(na, ga), gemmCeilDiv(nb, gb)
	gemmParallel(min(threads, ua+ub), ua+ub, func(u int) {
		if u < ua {
			for q := u * ga; q < min(na, (u+1)*ga); q++ {
				g.packA(q)
			}
			return
		}
		u -= ua
		for q := u * gb; q < min(nb, (u+1)*gb); q++ {
			g.packB(q)
		}
	})
}

// packA packs panel q (rows q·MR.. of the step) as ap[q·MR·kc + p·MR + i].
func (g *gemmJob) packA(q int) {
	mr, kc := g.impl.mr, g.kc
	dst := g.ap[q*mr*kc : (q+1)*mr*kc]
	r0 := q * mr
	rows := min(mr, g.ms-r0)
	i0 := g.i0 + r0
	if g.transA { // element (i, p) at a[(p0+p)·lda + i]
		for p := 0; p < kc; p++ {
			d := dst[p*mr : p*mr+mr]
			src := g.a[(g.p0+p)*g.lda+i0:]
			copy(d, src[:rows])
			clear(d[rows:])
		}
		return
	}
	// element (i, p) at a[i·lda + p0+p]
	if rows == 6 && mr == 6 {
		base := i0*g.lda + g.p0
		s0 := g.a[base : base+kc]
		s1 := g.a[base+g.lda : base+g.lda+kc]
		s2 := g.a[base+2*g.lda : base+2*g.lda+kc]
		s3 := g.a[base+3*g.lda : base+3*g.lda+kc]
		s4 := g.a[base+4*g.lda : base+4*g.lda+kc]
		s5 := g.a[base+5*g.lda : base+5*g.lda+kc]
		for p := range s0 {
			d := dst[p*6 : p*6+6 : p*6+6]
			d[0], d[1], d[2], d[3], d[4], d[5] = s0[p], s1[p], s2[p], s3[p], s4[p], s5[p]
		}
		return
	}
	for i := 0; i < mr; i++ {
		if i >= rows {
			for p := 0; p < kc; p++ {
				dst[p*mr+i] = 0
			}
			continue
		}
		src := g.a[(i0+i)*g.lda+g.p0:]
		src = src[:kc]
		for p, v := range src {
			dst[p*mr+i] = v
		}
	}
}

// packB packs panel q (columns q·NR.. of the step) as bp[q·NR·kc + p·NR + j].
func (g *gemmJob) packB(q int) {
	nr, kc := g.impl.nr, g.kc
	dst := g.bp[q*nr*kc : (q+1)*nr*kc]
	c0 := q * nr
	cols := min(nr, g.nc-c0)
	j0 := g.j0 + c0
	if !g.transB { // element (p, j) at b[(p0+p)·ldb + j]
		for p := 0; p < kc; p++ {
			d := dst[p*nr : p*nr+nr]
			src := g.b[(g.p0+p)*g.ldb+j0:]
			copy(d, src[:cols])
			clear(d[cols:])
		}
		return
	}
	// element (p, j) at b[j·ldb + p0+p]
	if gemmPackBT != nil && cols == nr {
		gemmPackBT(dst, g.b[j0*g.ldb+g.p0:], g.ldb, kc, nr)
		return
	}
	for j := 0; j < nr; j++ {
		if j >= cols {
			for p := 0; p < kc; p++ {
				dst[p*nr+j] = 0
			}
			continue
		}
		src := g.b[(j0+j)*g.ldb+g.p0:]
		src = src[:kc]
		for p, v := range src {
			dst[p*nr+j] = v
		}
	}
}

// gemmPackBT, when set (assembly), packs a full panel of nr columns of a transposed B:
// dst[p·nr + j] = src[j·ld + p] for p < kc, j < nr.
var gemmPackBT func(dst, src []float32, ld, kc, nr int)

// gemmPlanT is the partition of one step's C block into work items: rows in rb blocks of
// MR panels, columns in cb blocks of NR panels.
type gemmPlanT struct {
	pm, pn int // panels of rows and columns
	rb, cb int // blocks
}

// gemmPlan splits pm row panels × pn column panels into work items: row blocks of at most
// gemmMC rows, then enough (and, if possible, a multiple of threads) items to keep every
// worker busy. Any partition gives the same numbers; this one only balances the load.
func gemmPlan(pm, pn, mr, threads int) gemmPlanT {
	p := gemmPlanT{pm: pm, pn: pn, rb: gemmCeilDiv(pm, max(1, gemmMC/mr)), cb: 1}
	if threads <= 1 {
		return p
	}
	for range 64 {
		items := p.rb * p.cb
		if items >= 2*threads && items%threads == 0 {
			break
		}
		// Prefer splitting rows while blocks keep ≥ 4 panels, else columns, else whatever is left.
		switch {
		case p.rb < pm && pm/(p.rb+1) >= 4:
			p.rb++
		case p.cb < pn && pn/(p.cb+1) >= 2:
			p.cb++
		case p.rb < pm:
			p.rb++
		case p.cb < pn:
			p.cb++
		default:
			return p
		}
	}
	return p
}

// gemmSpan returns block t of n units split into parts near-equal blocks.
func gemmSpan(n, parts, t int) (lo, hi int) { return t * n / parts, (t + 1) * n / parts }

// compute runs the microkernel over the step's C block.
func (g *gemmJob) compute(p *gemmPlanT, threads int) {
	items := p.rb * p.cb
	gemmParallel(min(threads, items), items, func(it int) {
		r0, r1 := gemmSpan(p.pm, p.rb, it%p.rb)
		c0, c1 := gemmSpan(p.pn, p.cb, it/p.rb)
		g.computeBlock(r0, r1, c0, c1)
	})
}

// computeBlock computes row panels [r0, r1) × column panels [c0, c1) of the step.
func (g *gemmJob) computeBlock(r0, r1, c0, c1 int) {
	mr, nr, kc := g.impl.mr, g.impl.nr, g.kc
	kern := g.impl.kernel
	var tmp [gemmMaxTile]float32
	for jp := c0; jp < c1; jp++ {
		bp := &g.bp[jp*nr*kc]
		j := jp * nr
		cols := min(nr, g.nc-j)
		for ip := r0; ip < r1; ip++ {
			ap := &g.ap[ip*mr*kc]
			i := ip * mr
			rows := min(mr, g.ms-i)
			off := (g.i0+i)*g.ldc + g.j0 + j
			if rows == mr && cols == nr {
				kern(kc, ap, bp, &g.c[off], g.ldc, g.alpha, g.beta)
				continue
			}
			kern(kc, ap, bp, &tmp[0], nr, 1, 0)
			gemmEpilogue(tmp[:], nr, g.c[off:], g.ldc, rows, cols, g.alpha, g.beta)
		}
	}
}

// gemmMaxTile bounds MR·NR of any microkernel.
const gemmMaxTile = 16 * 32

// gemmEpilogue folds a rows×cols corner of the raw tile r (row stride nr) into c with the
// microkernels' arithmetic: c = float32(alpha·r) + float32(beta·c), c not read if beta == 0.
func gemmEpilogue(r []float32, nr int, c []float32, ldc, rows, cols int, alpha, beta float32) {
	for i := 0; i < rows; i++ {
		ri := r[i*nr : i*nr+cols]
		ci := c[i*ldc : i*ldc+cols]
		if beta == 0 {
			for j, v := range ri {
				ci[j] = float32(alpha * v)
			}
			continue
		}
		for j, v := range ri {
			ci[j] = float32(alpha*v) + float32(beta*ci[j])
		}
	}
}

// gemmParallel runs fn(0..n-1) on up to workers goroutines (the caller being one of them).
func gemmParallel(workers, n int, fn func(i int)) {
	if workers <= 1 || n <= 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	work := func() {
		for {
			i := int(next.Add(1)) - 1
			if i >= n {
				return
			}
			fn(i)
		}
	}
	wg.Add(workers - 1)
	for w := 1; w < workers; w++ {
		go func() {
			defer wg.Done()
			work()
		}()
	}
	work()
	wg.Wait()
}

// Pack buffers are reused across calls; each is 64-byte aligned.
var gemmBufPool sync.Pool

func gemmGetBuf(n int) *[]float32 {
	if v, ok := gemmBufPool.Get().(*[]float32); ok && cap(*v) >= n {
		*v = (*v)[:n]
		return v
	}
	raw := make([]float32, n+16)
	off := 0
	if r := uintptr(unsafe.Pointer(&raw[0])) % 64; r != 0 {
		off = int(64-r) / 4
	}
	s := raw[off : off+n : off+n]
	return &s
}

func gemmPutBuf(b *[]float32) { gemmBufPool.Put(b) }

// sgemmKernelGo4x8 is the portable microkernel (MR=4, NR=8), a gemmKernelFunc.
func sgemmKernelGo4x8(kc int, a, b, c *float32, ldc int, alpha, beta float32) {
	const mr, nr = 4, 8
	as := unsafe.Slice(a, kc*mr)
	bs := unsafe.Slice(b, kc*nr)
	cs := unsafe.Slice(c, 3*ldc+nr)
	for i := 0; i < mr; i += 2 {
		for j := 0; j < nr; j += 4 {
			var r00, r01, r02, r03, r10, r11, r12, r13 float32
			for p := 0; p < kc; p++ {
				ap := as[p*mr+i : p*mr+i+2 : p*mr+i+2]
				bp := bs[p*nr+j : p*nr+j+4 : p*nr+j+4]
				a0, a1 := ap[0], ap[1]
				b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
				r00 += a0 * b0
				r01 += a0 * b1
				r02 += a0 * b2
				r03 += a0 * b3
				r10 += a1 * b0
				r11 += a1 * b1
				r12 += a1 * b2
				r13 += a1 * b3
			}
			c0 := cs[i*ldc+j : i*ldc+j+4 : i*ldc+j+4]
			c1 := cs[(i+1)*ldc+j : (i+1)*ldc+j+4 : (i+1)*ldc+j+4]
			if beta == 0 {
				c0[0], c0[1], c0[2], c0[3] = float32(alpha*r00), float32(alpha*r01), float32(alpha*r02), float32(alpha*r03)
				c1[0], c1[1], c1[2], c1[3] = float32(alpha*r10), float32(alpha*r11), float32(alpha*r12), float32(alpha*r13)
				continue
			}
			c0[0] = float32(alpha*r00) + float32(beta*c0[0])
			c0[1] = float32(alpha*r01) + float32(beta*c0[1])
			c0[2] = float32(alpha*r02) + float32(beta*c0[2])
			c0[3] = float32(alpha*r03) + float32(beta*c0[3])
			c1[0] = float32(alpha*r10) + float32(beta*c1[0])
			c1[1] = float32(alpha*r11) + float32(beta*c1[1])
			c1[2] = float32(alpha*r12) + float32(beta*c1[2])
			c1[3] = float32(alpha*r13) + float32(beta*c1[3])
		}
	}
}
