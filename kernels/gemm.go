package kernels

import (
	"fmt"
	"math/bits"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
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
// Microkernels: AVX-512F 6×32 when the CPU has it, else AVX2+FMA 6×16 (gemm_amd64.s),
// else (other architectures, or the noasm build tag) the portable Go 4×6 below.
// Parallelism: persistent helper goroutines join a call and claim packing units and
// compute items (blocks of C) dynamically; see gemmPublish.
//
// Reproducibility: every element of C is computed the same way whatever the thread
// count or the way tiles are handed out: its dot product runs over k in order, in blocks
// of exactly gemmKC (fixed), each block being one fused multiply-add chain in the
// microkernel (or the pure-Go equivalent), and the block result r is folded into C as
// c = float32(alpha·r) + float32(beta'·c) with beta' = beta for the first block and 1
// after (beta' == 0: c is not read). k is never split across goroutines; only the
// partition of C into work items depends on GOMAXPROCS, and it cannot change any value.
// Rounding the operands to bf16 / fp16 (sgemmPrec) is elementwise, done on each packed
// panel, so it keeps this property.

const (
	gemmKC = 256  // k block: packed panels of op(A) and op(B) cover gemmKC steps of k
	gemmMC = 144  // rows of C per work item (at most); an MC×KC block of packed A stays in L2
	gemmNC = 4096 // columns of op(B) packed at a time (KC×NC floats, shared by all workers)
	gemmMS = 4096 // rows of op(A) packed at a time (MS×KC floats, shared by all workers)

	// gemmSmall: below this many multiply-adds (m·n·k) everything runs on the caller.
	// Measured on 2 cores (AVX-512): splitting breaks even around 64×64×128 (2^19) and
	// loses up to 4× below (32×32×32 = 2^15: 15 vs 64 GFLOP/s).
	gemmSmall = 1 << 19
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
var gemmKernel = gemmGo

// gemmGo is the portable microkernel.
var gemmGo = gemmImpl{name: "go", mr: 4, nr: 6, kernel: sgemmKernelGo4x6}

// sgemm computes C = alpha·op(A)·op(B) + beta·C; C is m×n with row stride ldc; op(A) is m×k,
// stored m×k (lda ≥ k) or, when transA, k×m (lda ≥ m); op(B) is k×n, stored k×n (ldb ≥ n) or,
// when transB, n×k (ldb ≥ k). beta == 0 means C is not read (NaNs in C are overwritten).
//
// The result is bit-identical whatever GOMAXPROCS is.
func sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	sgemmPrec(FP32, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// sgemmPrec is sgemm with the elements of op(A) and op(B) rounded to prec as they are packed
// (the product then reads bf16 / fp16 operands, as tensor cores do, and accumulates in
// float32). A and B are not modified; C and beta are not rounded.
func sgemmPrec(prec Precision, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	sgemmRun(&gemmKernel, runtime.GOMAXPROCS(0), prec, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
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
	sgemmRun(impl, threads, FP32, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// sgemmRun is sgemm on microkernel impl with up to threads workers and operands rounded to prec.
func sgemmRun(impl *gemmImpl, threads int, prec Precision, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
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
	g := &gemmCall{
		impl: impl, transA: transA, transB: transB, prec: prec,
		a: a, lda: lda, b: b, ldb: ldb, c: c, ldc: ldc, alpha: alpha,
	}
	// Steps: column blocks × row blocks × k blocks, k innermost (in order).
	for jc := 0; jc < n; jc += gemmNC {
		nc := min(gemmNC, n-jc)
		for ic := 0; ic < m; ic += gemmMS {
			ms := min(gemmMS, m-ic)
			plan := gemmPlan(gemmCeilDiv(ms, mr), gemmCeilDiv(nc, nr), mr, threads)
			for pc := 0; pc < k; pc += gemmKC {
				st := gemmStep{i0: ic, j0: jc, p0: pc, ms: ms, nc: nc, kc: min(gemmKC, k-pc), beta: beta, plan: plan}
				if pc > 0 {
					st.beta = 1
				}
				na, nb := gemmCeilDiv(ms, mr), gemmCeilDiv(nc, nr)
				// Packing units: groups of panels of roughly 16K floats each.
				st.ga = max(1, (16<<10)/(mr*st.kc))
				st.gb = max(1, (16<<10)/(nr*st.kc))
				st.ua = gemmCeilDiv(na, st.ga)
				st.npack = st.ua + gemmCeilDiv(nb, st.gb)
				st.ncomp = plan.rb * plan.cb
				g.steps = append(g.steps, st)
			}
		}
	}
	g.ctr = make([]gemmCounters, len(g.steps))
	asize := gemmCeilDiv(min(m, gemmMS), mr) * mr * min(k, gemmKC)
	bsize := gemmCeilDiv(min(n, gemmNC), nr) * nr * min(k, gemmKC)
	nbuf := min(2, len(g.steps))
	for i := 0; i < nbuf; i++ {
		g.abuf[i] = gemmGetBuf(asize)
		g.bbuf[i] = gemmGetBuf(bsize)
	}

	helpers := 0
	if threads > 1 {
		helpers = min(threads, g.steps[0].ncomp) - 1
	}
	if helpers > 0 {
		gemmPublish(g, helpers)
	}
	g.work()
	if helpers > 0 {
		gemmRetire(g)
	}
	last := len(g.steps) - 1
	gemmWait(&g.ctr[last].compDone, g.steps[last].ncomp)
	// Helpers that joined may still be walking the (finished) steps; they write nothing
	// more, but wait for them before the buffers go back to the pool.
	for i := 0; g.active.Load() != 0; i++ {
		gemmPause(i)
	}
	for i := 0; i < nbuf; i++ {
		gemmPutBuf(g.abuf[i])
		gemmPutBuf(g.bbuf[i])
	}
}

// Helper goroutines.
//
// A call that wants help publishes itself on gemmPool.jobs; persistent helper goroutines take
// it and run work() beside the caller, each claiming packing units and compute items
// until none are left. After a job a helper spins (yielding its P) for up to gemmSpin
// waiting for the next one before it parks: waking a parked thread costs tens to hundreds
// of microseconds on a virtual machine, which would eat much of the gain on mid-sized
// products called back to back. A spinning helper parks early when the Go scheduler
// reports other runnable goroutines, and helpers beyond GOMAXPROCS-1 do not spin.

// gemmSpin is how long an idle helper spins waiting for work before it parks.
var gemmSpin = 200 * time.Microsecond

var gemmPool struct {
	mu       sync.Mutex
	cond     sync.Cond
	jobs     []*gemmCall  // published calls
	open     atomic.Int32 // jobs with free slots, for spinning helpers
	started  int          // helper goroutines
	parked   int          // helpers waiting on cond
	spinning atomic.Int32 // helpers spinning for a job
}

// gemmPublish offers g to up to n helpers, starting helpers as needed.
func gemmPublish(g *gemmCall, n int) {
	p := &gemmPool
	p.mu.Lock()
	if p.cond.L == nil {
		p.cond.L = &p.mu
	}
	g.slots = n
	p.jobs = append(p.jobs, g)
	p.open.Add(1)
	for p.started < n {
		go gemmHelper(p.started)
		p.started++
	}
	// Spinning helpers will see the job; wake parked ones for the rest.
	for i := 0; i < min(n-int(p.spinning.Load()), p.parked); i++ {
		p.cond.Signal()
	}
	p.mu.Unlock()
}

// gemmRetire withdraws g: no helper joins it any more.
func gemmRetire(g *gemmCall) {
	p := &gemmPool
	p.mu.Lock()
	for i, j := range p.jobs {
		if j == g {
			p.jobs = append(p.jobs[:i], p.jobs[i+1:]...)
			if g.slots > 0 {
				g.slots = 0
				p.open.Add(-1)
			}
			break
		}
	}
	p.mu.Unlock()
}

// gemmTake returns a published job with a free slot, marking the caller active in it.
// p.mu must be held.
func gemmTake() *gemmCall {
	for _, g := range gemmPool.jobs {
		if g.slots > 0 {
			if g.slots--; g.slots == 0 {
				gemmPool.open.Add(-1)
			}
			g.active.Add(1)
			return g
		}
	}
	return nil
}

func gemmHelper(id int) {
	p := &gemmPool
	runnable := []metrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}
	for {
		p.mu.Lock()
		g := gemmTake()
		if g == nil && !gemmSpinning(id, runnable) {
			for g == nil {
				p.parked++
				p.cond.Wait()
				p.parked--
				g = gemmTake()
			}
		}
		p.mu.Unlock()
		if g != nil {
			g.work()
			g.active.Add(-1)
		}
	}
}

// gemmSpinning spins (with p.mu released, and held again on return) until a job is
// published, reporting whether one was, or gives up after gemmSpin or when other
// goroutines wait to run.
func gemmSpinning(id int, runnable []metrics.Sample) bool {
	p := &gemmPool
	if id >= runtime.GOMAXPROCS(0)-1 || gemmSpin <= 0 {
		return false
	}
	p.spinning.Add(1)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.spinning.Add(-1)
	}()
	start := time.Now()
	for i := 1; ; i++ {
		if p.open.Load() > 0 {
			return true
		}
		runtime.Gosched()
		if i%32 == 0 {
			if time.Since(start) > gemmSpin {
				return false
			}
			if metrics.Read(runnable); runnable[0].Value.Kind() == metrics.KindUint64 && runnable[0].Value.Uint64() > 0 {
				return false
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

// gemmCall is the state of one sgemm call shared by its workers.
type gemmCall struct {
	impl           *gemmImpl
	transA, transB bool
	prec           Precision // operands are rounded to prec while packed
	a, b, c        []float32
	lda, ldb, ldc  int
	alpha          float32

	steps      []gemmStep
	ctr        []gemmCounters
	abuf, bbuf [2]*[]float32 // packed op(A) and op(B), double-buffered by step parity

	active atomic.Int32 // helpers inside the call
	slots  int          // helpers that may still join (under gemmPool.mu)
}

// gemmStep is one (row block, column block, k block) step: pack, then compute.
type gemmStep struct {
	i0, j0, p0 int // origin in op(A) rows, op(B) columns, k
	ms, nc, kc int // extent
	beta       float32
	plan       gemmPlanT
	ga, gb, ua int // panels per packing unit of A and of B; units of A
	npack      int // packing units (A first, then B)
	ncomp      int // compute items
}

// gemmCounters tracks a step's work: units claimed (next) and finished (done).
type gemmCounters struct {
	packNext, packDone, compNext, compDone atomic.Int32
	_                                      [48]byte // keep steps' counters on separate cache lines
}

// work runs the steps in order, claiming packing units and compute items as they come.
// Step s packs into buffer s%2, so its packing waits until step s-2's items are done;
// its items wait for all of its packing and for step s-1's items (which may cover the
// same C elements, over the previous k block).
func (g *gemmCall) work() {
	for s := range g.steps {
		st, ct := &g.steps[s], &g.ctr[s]
		if s >= 2 {
			gemmWait(&g.ctr[s-2].compDone, g.steps[s-2].ncomp)
		}
		ap, bp := *g.abuf[s%2], *g.bbuf[s%2]
		for {
			u := int(ct.packNext.Add(1)) - 1
			if u >= st.npack {
				break
			}
			g.packUnit(st, ap, bp, u)
			ct.packDone.Add(1)
		}
		gemmWait(&ct.packDone, st.npack)
		if s >= 1 {
			gemmWait(&g.ctr[s-1].compDone, g.steps[s-1].ncomp)
		}
		for {
			it := int(ct.compNext.Add(1)) - 1
			if it >= st.ncomp {
				break
			}
			p := &st.plan
			r0, r1 := gemmSpan(p.pm, p.rb, it%p.rb)
			c0, c1 := gemmSpan(p.pn, p.cb, it/p.rb)
			g.computeBlock(st, ap, bp, r0, r1, c0, c1)
			ct.compDone.Add(1)
		}
	}
}

// gemmWait waits until *v reaches n (other workers finishing their claimed units).
func gemmWait(v *atomic.Int32, n int) {
	for i := 0; int(v.Load()) < n; i++ {
		gemmPause(i)
	}
}

// gemmPause backs off in the i-th round of a wait for another worker.
func gemmPause(i int) {
	switch {
	case i < 100:
	case i < 20000:
		runtime.Gosched()
	default:
		time.Sleep(20 * time.Microsecond)
	}
}

// packUnit packs unit u of a step: a group of panels of op(A) or of op(B), rounded to
// g.prec (elementwise, so the result does not depend on who packs what).
func (g *gemmCall) packUnit(st *gemmStep, ap, bp []float32, u int) {
	mr, nr, kc := g.impl.mr, g.impl.nr, st.kc
	if u < st.ua {
		na := gemmCeilDiv(st.ms, mr)
		for q := u * st.ga; q < min(na, (u+1)*st.ga); q++ {
			g.packA(st, ap, q)
			roundSlice(ap[q*mr*kc:(q+1)*mr*kc], g.prec) // while the panel is in L1
		}
		return
	}
	u -= st.ua
	nb := gemmCeilDiv(st.nc, nr)
	for q := u * st.gb; q < min(nb, (u+1)*st.gb); q++ {
		g.packB(st, bp, q)
		roundSlice(bp[q*nr*kc:(q+1)*nr*kc], g.prec)
	}
}

// packA packs panel q of op(A) (rows q·MR.. of the step, zero-padded) as
// ap[q·MR·kc + p·MR + i].
func (g *gemmCall) packA(st *gemmStep, ap []float32, q int) {
	mr, kc := g.impl.mr, st.kc
	dst := ap[q*mr*kc : (q+1)*mr*kc]
	r0 := q * mr
	rows := min(mr, st.ms-r0)
	i0, p0, lda := st.i0+r0, st.p0, g.lda
	if g.transA { // element (i, p) at a[(p0+p)·lda + i0+i]
		src := g.a[p0*lda+i0:]
		if rows == mr && gemmPackRowsAsm(dst, src, lda, kc, mr) {
			return
		}
		for p := 0; p < kc; p++ {
			d := dst[p*mr : p*mr+mr]
			copy(d, src[p*lda:p*lda+rows])
			clear(d[rows:])
		}
		return
	}
	// element (i, p) at a[(i0+i)·lda + p0+p]
	src := g.a[i0*lda+p0:]
	done := 0
	if rows == mr {
		done = gemmPackTAsm(dst, src, lda, kc, mr, mr)
	}
	for i := 0; i < mr; i++ {
		if i >= rows {
			for p := done; p < kc; p++ {
				dst[p*mr+i] = 0
			}
			continue
		}
		row := src[i*lda+done : i*lda+kc]
		for p, v := range row {
			dst[(done+p)*mr+i] = v
		}
	}
}

// packB packs panel q of op(B) (columns q·NR.. of the step, zero-padded) as
// bp[q·NR·kc + p·NR + j].
func (g *gemmCall) packB(st *gemmStep, bp []float32, q int) {
	nr, kc := g.impl.nr, st.kc
	dst := bp[q*nr*kc : (q+1)*nr*kc]
	c0 := q * nr
	cols := min(nr, st.nc-c0)
	j0, p0, ldb := st.j0+c0, st.p0, g.ldb
	if !g.transB { // element (p, j) at b[(p0+p)·ldb + j0+j]
		src := g.b[p0*ldb+j0:]
		if cols == nr && gemmPackRowsAsm(dst, src, ldb, kc, nr) {
			return
		}
		for p := 0; p < kc; p++ {
			d := dst[p*nr : p*nr+nr]
			copy(d, src[p*ldb:p*ldb+cols])
			clear(d[cols:])
		}
		return
	}
	// element (p, j) at b[(j0+j)·ldb + p0+p]
	src := g.b[j0*ldb+p0:]
	done := 0
	if cols == nr {
		done = gemmPackTAsm(dst, src, ldb, kc, nr, nr)
	}
	for j := 0; j < nr; j++ {
		if j >= cols {
			for p := done; p < kc; p++ {
				dst[p*nr+j] = 0
			}
			continue
		}
		row := src[j*ldb+done : j*ldb+kc]
		for p, v := range row {
			dst[(done+p)*nr+j] = v
		}
	}
}

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

// computeBlock computes row panels [r0, r1) × column panels [c0, c1) of a step.
func (g *gemmCall) computeBlock(st *gemmStep, ap, bp []float32, r0, r1, c0, c1 int) {
	mr, nr, kc := g.impl.mr, g.impl.nr, st.kc
	kern := g.impl.kernel
	var tmp [gemmMaxTile]float32
	for jp := c0; jp < c1; jp++ {
		b := &bp[jp*nr*kc]
		j := jp * nr
		cols := min(nr, st.nc-j)
		for ip := r0; ip < r1; ip++ {
			a := &ap[ip*mr*kc]
			i := ip * mr
			rows := min(mr, st.ms-i)
			off := (st.i0+i)*g.ldc + st.j0 + j
			if rows == mr && cols == nr {
				kern(kc, a, b, &g.c[off], g.ldc, g.alpha, st.beta)
				continue
			}
			kern(kc, a, b, &tmp[0], nr, 1, 0)
			gemmEpilogue(tmp[:], nr, g.c[off:], g.ldc, rows, cols, g.alpha, st.beta)
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

// Pack buffers are reused across calls, pooled by power-of-two size class; each is
// 64-byte aligned.
var gemmBufPools [48]sync.Pool

func gemmGetBuf(n int) *[]float32 {
	class := max(12, bits.Len(uint(n-1)))
	if v, ok := gemmBufPools[class].Get().(*[]float32); ok {
		*v = (*v)[:n]
		return v
	}
	size := 1 << class
	raw := make([]float32, size+16)
	off := 0
	if r := uintptr(unsafe.Pointer(&raw[0])) % 64; r != 0 {
		off = int(64-r) / 4
	}
	s := raw[off : off+n : off+size]
	return &s
}

func gemmPutBuf(b *[]float32) {
	gemmBufPools[bits.Len(uint(cap(*b)-1))].Put(b)
}

// sgemmKernelGo4x6 is the portable microkernel (MR=4, NR=6), a gemmKernelFunc. It walks
// the tile in 2×3 blocks of scalar accumulators (few enough to stay in registers), two
// steps of k at a time.
func sgemmKernelGo4x6(kc int, a, b, c *float32, ldc int, alpha, beta float32) {
	const mr, nr = 4, 6
	pa, pb := unsafe.Pointer(a), unsafe.Pointer(b)
	cs := unsafe.Slice(c, (mr-1)*ldc+nr)
	for i := 0; i < mr; i += 2 {
		for j := 0; j < nr; j += 3 {
			var r00, r01, r02, r10, r11, r12 float32
			p := 0
			for ; p+1 < kc; p += 2 {
				av := (*[2]float32)(unsafe.Add(pa, (p*mr+i)*4))
				bv := (*[3]float32)(unsafe.Add(pb, (p*nr+j)*4))
				a0, a1 := av[0], av[1]
				b0, b1, b2 := bv[0], bv[1], bv[2]
				r00 += a0 * b0
				r01 += a0 * b1
				r02 += a0 * b2
				r10 += a1 * b0
				r11 += a1 * b1
				r12 += a1 * b2
				av = (*[2]float32)(unsafe.Add(pa, ((p+1)*mr+i)*4))
				bv = (*[3]float32)(unsafe.Add(pb, ((p+1)*nr+j)*4))
				a0, a1 = av[0], av[1]
				b0, b1, b2 = bv[0], bv[1], bv[2]
				r00 += a0 * b0
				r01 += a0 * b1
				r02 += a0 * b2
				r10 += a1 * b0
				r11 += a1 * b1
				r12 += a1 * b2
			}
			if p < kc {
				av := (*[2]float32)(unsafe.Add(pa, (p*mr+i)*4))
				bv := (*[3]float32)(unsafe.Add(pb, (p*nr+j)*4))
				a0, a1 := av[0], av[1]
				b0, b1, b2 := bv[0], bv[1], bv[2]
				r00 += a0 * b0
				r01 += a0 * b1
				r02 += a0 * b2
				r10 += a1 * b0
				r11 += a1 * b1
				r12 += a1 * b2
			}
			c0 := (*[3]float32)(cs[i*ldc+j:])
			c1 := (*[3]float32)(cs[(i+1)*ldc+j:])
			if beta == 0 {
				c0[0], c0[1], c0[2] = float32(alpha*r00), float32(alpha*r01), float32(alpha*r02)
				c1[0], c1[1], c1[2] = float32(alpha*r10), float32(alpha*r11), float32(alpha*r12)
				continue
			}
			c0[0] = float32(alpha*r00) + float32(beta*c0[0])
			c0[1] = float32(alpha*r01) + float32(beta*c0[1])
			c0[2] = float32(alpha*r02) + float32(beta*c0[2])
			c1[0] = float32(alpha*r10) + float32(beta*c1[0])
			c1[1] = float32(alpha*r11) + float32(beta*c1[1])
			c1[2] = float32(alpha*r12) + float32(beta*c1[2])
		}
	}
}
