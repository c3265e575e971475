//go:build cuda

package kernels

// The 16-bit step's elementwise methods on the CUDA backend (cuda_half.go, cuda/half.cu).
//
// TestCUDAHost* run them on the recording fake device (no GPU): every launch's arguments are
// checked against the kernel's parameter types in the PTX (by CUDA.launch) and here against the
// buffers (each pointer the buffer it must be, and every extent the kernel derives from its
// scalar arguments inside one allocation of exactly the buffer's size), for several shapes
// (GQA, odd rows and widths, both 16-bit formats); GradStats queues no copy and no wait; a RoPE
// table travels to the device once.
//
// TestCUDA*Half, TestCUDARoPEQKV and TestCUDAGradStats compare them on a GPU with the CPU
// reference (cpu_half.go), and fail without one, as the other GPU tests do (cuda_test.go).
// Tolerances, per 16-bit value (ulp: a unit in the last place of the 16-bit format):
//
//   - bit-identical: EmbeddingHalf, RMSNormHalf's keep, RoPE's v, GradStats' flag, and on the
//     GPU itself AdamWSegmentsHalf's p, m and v against AdamWSegments and its copy against
//     PackHalf of them;
//   - 1 ulp: RMSNormHalf's out (rstd from a float64 sum in another order), RoPEQKV and its
//     backward (sincos in double from CUDA's libm and Go's math differ by up to an ulp of the
//     double, which can move cos or sin by a float32 ulp), SwiGLU and its backward (exp in
//     double, the same), cross-entropy's dlogits (exp, log and the float64 sum in another
//     order), RMSNormBackwardHalf's dxHalf (the row's float64 dot in another order) and
//     AdamWSegmentsHalf's copy (AdamW at 1e-6, as TestCUDAAdamW): each a float32 that may differ
//     by an ulp of float32 before rounding, which can cross one 16-bit rounding boundary, never
//     two;
//   - float32: rstd 1e-6 elementwise, losses 1e-6 elementwise, dx and dw 1e-6 of the largest
//     (float64 sums in another order, as TestCUDARMSNorm's 1e-5 allows for the float32 inputs),
//     Σg² (hi + lo) 1e-12 relative (SumSquares' bound).
//
// A wrong layout, a missed row, the wrong half of a word or a skipped rounding is off by many
// ulps (or by the value), far outside these bounds.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"distflash/kernels/cuda"
)

// countingDevice is the fake device counting the host's copies to and from the device.
type countingDevice struct {
	*fakeDevice
	htod []int // bytes of each HtoD, in order
	dtoh int
}

func (d *countingDevice) HtoD(dst cuda.Ptr, src unsafe.Pointer, bytes int) error {
	d.htod = append(d.htod, bytes)
	return d.fakeDevice.HtoD(dst, src, bytes)
}

func (d *countingDevice) DtoH(dst unsafe.Pointer, src cuda.Ptr, bytes int) error {
	d.dtoh++
	return d.fakeDevice.DtoH(dst, src, bytes)
}

// newHalfFake is newFakeCUDA whose device also counts copies.
func newHalfFake(t *testing.T) (*CUDA, *fakeDevice, *countingDevice) {
	c, f := newFakeCUDA(t)
	cd := &countingDevice{fakeDevice: f}
	c.dev = cd
	return c, f, cd
}

// packedBytes is the size of a packed buffer of n 16-bit values.
func packedBytes(n int) int { return 4 * ((n + 1) / 2) }

// halfExtents returns, for a launch of the 16-bit step's kernels, the bytes each pointer
// argument (by index) is read or written over, derived from the launch's own scalar arguments;
// optional arguments (may be null) are listed in opt.
func halfExtents(t *testing.T, l fakeLaunch) (ext map[int]int, opt map[int]bool) {
	t.Helper()
	i32 := func(i int) int { return int(int32(uint32(l.args[i]))) }
	i64 := func(i int) int { return int(int64(l.args[i])) }
	switch l.name {
	case "df_embedding16": // out, table, ids, ntok, dim, fp16 (the table's extent: the caller's)
		return map[int]int{0: 4 * i32(3) * i32(4), 2: 4 * i32(3)}, nil
	case "df_rmsnorm16": // out, keep, rstd, x, w, rows, dim, eps, fp16
		n := i32(5) * i32(6)
		return map[int]int{0: packedBytes(n), 1: packedBytes(n), 2: 4 * i32(5), 3: 4 * n, 4: packedBytes(i32(6))}, map[int]bool{1: true}
	case "df_rmsnorm16_bwd": // dx, dxh, part, dout, x, w, rstd, rows, dim, accShared, fp16
		n := i32(7) * i32(8)
		return map[int]int{0: 4 * n, 1: packedBytes(n), 2: 8 * l.gx * i32(8), 3: packedBytes(n), 4: packedBytes(n),
			5: packedBytes(i32(8)), 6: 4 * i32(7)}, map[int]bool{1: true}
	case "df_rmsnorm16_dw": // dw, part, dim, parts, beta
		return map[int]int{0: 4 * i32(2), 1: 8 * i32(2) * i32(3)}, map[int]bool{1: i32(3) == 0}
	case "df_rope_qkv16": // qkv, q, k, v, pos, invfreq, ntok, heads, kvheads, hd, scale, bwd, fp16
		n, Q, KV := i32(6), i32(7)*i32(9), i32(8)*i32(9)
		return map[int]int{0: packedBytes(n * (Q + 2*KV)), 1: packedBytes(n * Q), 2: packedBytes(n * KV), 3: packedBytes(n * KV),
			4: 4 * n, 5: 8 * (i32(9) / 2)}, map[int]bool{5: i32(9) < 2}
	case "df_swiglu16": // act, gu, rows, ffn, fp16
		n := i32(2) * i32(3)
		return map[int]int{0: packedBytes(n), 1: packedBytes(2 * n)}, nil
	case "df_swiglu16_bwd": // dgu, act, dact, gu, rows, ffn, fp16
		n := i32(4) * i32(5)
		return map[int]int{0: packedBytes(2 * n), 1: packedBytes(n), 2: packedBytes(n), 3: packedBytes(2 * n)}, map[int]bool{1: true}
	case "df_xent16": // losses, dlogits, logits, targets, rows, vocab, dscale, fp16
		n := i32(4) * i64(5)
		return map[int]int{0: 4 * i32(4), 1: packedBytes(n), 2: 4 * n, 3: 4 * i32(4)}, nil
	case "df_sumsq_partial": // x, n, part
		return map[int]int{0: 4 * i64(1), 2: 8 * l.gx}, nil
	case "df_gradstats": // dst, part, parts
		return map[int]int{0: 12, 1: 8 * i32(2)}, map[int]bool{1: i32(2) == 0}
	case "df_adamw_multi16": // p, g, m, v, half, seg, nseg, b1, b2, c1, c2, lr, eps, gs, wd, n, fp16
		n := i64(15)
		return map[int]int{0: 4 * n, 1: 4 * n, 2: 4 * n, 3: 4 * n, 4: packedBytes(n), 5: 24 * i32(6)}, nil
	}
	t.Fatalf("launch of %s: not a kernel of the 16-bit step", l.name)
	return nil, nil
}

// checkHalfLaunches checks every launch since launch n0: its pointers inside allocations over
// the extents halfExtents gives, non-null unless optional, its block of ewThreads threads, and
// its format argument (the last, but for the float64 and shared kernels that have none) fp16.
// It returns the launches' names.
func checkHalfLaunches(t *testing.T, f *fakeDevice, n0 int, fp16 int) []string {
	t.Helper()
	for _, l := range f.launches[n0:] {
		ext, opt := halfExtents(t, l)
		for i, bytes := range ext {
			p := cuda.Ptr(l.args[i])
			if p == 0 {
				if !opt[i] {
					t.Errorf("%s: argument %d is null", l.name, i)
				}
				continue
			}
			if err := f.check(fmt.Sprintf("%s argument %d", l.name, i), p, bytes); err != nil {
				t.Error(err)
			}
		}
		if l.bx != ewThreads || l.gy != 1 {
			t.Errorf("%s: %d×%d blocks of %d threads", l.name, l.gx, l.gy, l.bx)
		}
		switch l.name {
		case "df_sumsq_partial", "df_gradstats", "df_rmsnorm16_dw":
		default:
			if got := l.args[len(l.args)-1]; got != uint64(fp16) {
				t.Errorf("%s: format argument %d, want %d", l.name, got, fp16)
			}
		}
	}
	return f.names(n0)
}

// ptrs returns the device addresses of bufs (0 for nil).
func ptrs(bufs ...Buf) []uint64 {
	out := make([]uint64, len(bufs))
	for i, b := range bufs {
		if b != nil {
			out[i] = uint64(dbuf(b).ptr())
		}
	}
	return out
}

// wantArgs fails unless the launch's first arguments are the buffers given.
func wantArgs(t *testing.T, what string, l fakeLaunch, bufs ...Buf) {
	t.Helper()
	if want := ptrs(bufs...); !slices.Equal(l.args[:len(want)], want) {
		t.Errorf("%s: %s pointers %#x, want %#x", what, l.name, l.args[:len(want)], want)
	}
}

// TestCUDAHostHalfLaunches drives every method of the 16-bit step built here on the fake, in
// both formats and several shapes, and checks each launch.
func TestCUDAHostHalfLaunches(t *testing.T) {
	c, f, _ := newHalfFake(t)
	hbuf := func(n int) Buf { return c.Alloc((n + 1) / 2) }
	for _, p := range []Precision{BF16, FP16} {
		fp := int(boolInt(p == FP16))
		run := func(what string, want []string, call func()) []fakeLaunch {
			t.Helper()
			n0 := len(f.launches)
			call()
			if got := checkHalfLaunches(t, f, n0, fp); !slices.Equal(got, want) {
				t.Errorf("%v %s: launched %v, want %v", p, what, got, want)
			}
			return f.launches[n0:]
		}

		for _, s := range []struct{ vocab, dim, ntok int }{{11, 6, 9}, {32000, 2048, 513}, {3, 2, 1}} {
			out, table := c.Alloc(s.ntok*s.dim), hbuf(s.vocab*s.dim)
			ids := make([]int32, s.ntok)
			for i := range ids {
				ids[i] = int32((i * 7) % s.vocab)
			}
			ids[0] = int32(s.vocab - 1)
			l := run(fmt.Sprintf("embedding %+v", s), []string{"df_embedding16"}, func() { c.EmbeddingHalf(out, table, ids, s.dim, p) })[0]
			wantArgs(t, "embedding", l, out, table)
			// the largest id's row ends inside the table
			if err := f.check("embedding table", cuda.Ptr(l.args[1]), 2*s.vocab*s.dim); err != nil || l.gx != rowGrid(s.ntok) {
				t.Errorf("embedding %+v: %v, %d blocks", s, err, l.gx)
			}
		}

		for _, s := range []struct {
			rows, dim int
			keep      bool
		}{{1, 2, true}, {7, 33, true}, {5, 2048, false}, {300, 4097, true}} {
			n := s.rows * s.dim
			out, rstd, x, w := hbuf(n), c.Alloc(s.rows), c.Alloc(n), hbuf(s.dim)
			var keep Buf
			if s.keep {
				keep = hbuf(n)
			}
			l := run(fmt.Sprintf("rmsnorm %+v", s), []string{"df_rmsnorm16"}, func() { c.RMSNormHalf(out, keep, rstd, x, w, s.rows, s.dim, 1e-5, p) })[0]
			wantArgs(t, "rmsnorm", l, out, keep, rstd, x, w)
			if l.gx != rowGrid(s.rows) || l.args[7] != uint64(math.Float32bits(1e-5)) {
				t.Errorf("rmsnorm %+v: %+v", s, l)
			}
		}

		for _, s := range []struct {
			rows, dim int
			beta      float32
			dxHalf    bool
		}{{1, 2, 0, true}, {7, 33, 1, false}, {8192, 2048, 0, true}, {300, 4097, 1, true}, {0, 64, 0, false}} {
			n := s.rows * s.dim
			dx, dw, dout, x, w, rstd := c.Alloc(n), c.Alloc(s.dim), hbuf(n), hbuf(n), hbuf(s.dim), c.Alloc(s.rows)
			var dxh Buf
			if s.dxHalf {
				dxh = hbuf(n)
			}
			want := []string{"df_rmsnorm16_bwd", "df_rmsnorm16_dw"}
			if s.rows == 0 {
				want = want[1:]
			}
			ls := run(fmt.Sprintf("rmsnorm backward %+v", s), want, func() {
				c.RMSNormBackwardHalf(dx, dxh, dw, dout, x, w, rstd, s.rows, s.dim, s.beta, p)
			})
			fin := ls[len(ls)-1]
			wantArgs(t, "rmsnorm backward", fin, dw)
			if fin.gx != ceilDiv(s.dim, warpThreads) || fin.args[4] != uint64(math.Float32bits(s.beta)) {
				t.Errorf("rmsnorm backward %+v: %+v", s, fin)
			}
			if s.rows == 0 {
				if fin.args[3] != 0 {
					t.Errorf("rmsnorm backward with no rows: %d parts", fin.args[3])
				}
				continue
			}
			l := ls[0]
			wantArgs(t, "rmsnorm backward", l, dx, dxh)
			if rest := ptrs(dout, x, w, rstd); !slices.Equal(l.args[3:7], rest) {
				t.Errorf("rmsnorm backward %+v: inputs %#x, want %#x", s, l.args[3:7], rest)
			}
			if l.gx != normParts(s.rows) || l.smem != 8*s.dim || l.args[9] != 1 || fin.args[1] != l.args[2] || fin.args[3] != uint64(l.gx) {
				t.Errorf("rmsnorm backward %+v: pass %d blocks, %d bytes, shared %d; final reads %#x × %d (pass wrote %#x)",
					s, l.gx, l.smem, l.args[9], fin.args[1], fin.args[3], l.args[2])
			}
		}

		for _, s := range []struct{ n, heads, kvHeads, hd int }{{5, 4, 2, 8}, {7, 8, 2, 64}, {3, 3, 1, 6}, {3, 3, 1, 5}, {1025, 32, 8, 128}, {2, 2, 2, 1}} {
			Q, KV := s.heads*s.hd, s.kvHeads*s.hd
			pos := make([]int32, s.n)
			for i := range pos {
				pos[i] = int32(3 * i)
			}
			tab := DefaultRoPE(500000, s.hd)
			qkv, q, k, v := hbuf(s.n*(Q+2*KV)), hbuf(s.n*Q), hbuf(s.n*KV), hbuf(s.n*KV)
			for bwd, call := range []func(){
				func() { c.RoPEQKV(q, k, v, qkv, pos, s.heads, s.kvHeads, s.hd, tab, p) },
				func() { c.RoPEQKVBackward(qkv, q, k, v, pos, s.heads, s.kvHeads, s.hd, tab, p) },
			} {
				l := run(fmt.Sprintf("rope %+v bwd %d", s, bwd), []string{"df_rope_qkv16"}, call)[0]
				wantArgs(t, "rope", l, qkv, q, k, v)
				if l.gx != rowGrid(s.n) || l.smem != 8*(s.hd/2) || l.args[11] != uint64(bwd) || l.args[10] != math.Float64bits(1) {
					t.Errorf("rope %+v bwd %d: %+v", s, bwd, l)
				}
			}
		}

		for _, s := range []struct{ rows, ffn int }{{3, 5}, {4, 5632}, {1, 1}, {33, 64}} {
			n := s.rows * s.ffn
			act, gu, dgu, dact := hbuf(n), hbuf(2*n), hbuf(2*n), hbuf(n)
			l := run(fmt.Sprintf("swiglu %+v", s), []string{"df_swiglu16"}, func() { c.SwiGLUHalf(act, gu, s.rows, s.ffn, p) })[0]
			wantArgs(t, "swiglu", l, act, gu)
			for _, a := range []Buf{act, nil} {
				l = run(fmt.Sprintf("swiglu backward %+v", s), []string{"df_swiglu16_bwd"}, func() { c.SwiGLUBackwardHalf(dgu, a, dact, gu, s.rows, s.ffn, p) })[0]
				wantArgs(t, "swiglu backward", l, dgu, a, dact, gu)
				if l.gx != rowGrid(s.rows) {
					t.Errorf("swiglu backward %+v: %d blocks", s, l.gx)
				}
			}
		}

		for _, s := range []struct{ rows, vocab int }{{3, 7}, {2, 32000}, {9, 32001}} {
			targets := make([]int32, s.rows)
			for i := range targets {
				targets[i] = int32(s.vocab - 1 - i)
			}
			targets[s.rows/2] = -1
			losses, dl, logits := c.Alloc(s.rows), hbuf(s.rows*s.vocab), c.Alloc(s.rows*s.vocab)
			l := run(fmt.Sprintf("cross-entropy %+v", s), []string{"df_xent16"}, func() { c.CrossEntropyHalf(losses, dl, logits, targets, s.vocab, 0.5, p) })[0]
			wantArgs(t, "cross-entropy", l, losses, dl, logits)
			if l.gx != rowGrid(s.rows) || l.args[5] != uint64(s.vocab) || l.args[6] != uint64(math.Float32bits(0.5)) {
				t.Errorf("cross-entropy %+v: %+v", s, l)
			}
		}

		for _, np := range []int{1, 10001, 1 << 20} {
			pb, g, m, v, half := c.Alloc(np), c.Alloc(np), c.Alloc(np), c.Alloc(np), hbuf(np)
			segs := []AdamWSegment{{0, np, true}}
			if np > 1000 {
				segs = []AdamWSegment{{0, 999, false}, {1000, np/2 - 1000, true}, {np / 2, 7, false}, {np/2 + 11, np/2 - 11, true}}
			}
			hp := AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 3, GradScale: 0.5}
			l := run(fmt.Sprintf("adamw %d", np), []string{"df_adamw_multi16"}, func() { c.AdamWSegmentsHalf(pb, g, m, v, half, segs, hp, p) })[0]
			wantArgs(t, "adamw", l, pb, g, m, v, half)
			table, longest := adamwSegTable(segs)
			if l.gx != ewGrid(longest) || l.args[5] != uint64(c.segs.Ptr) || l.args[6] != uint64(len(segs)) || l.args[15] != uint64(np) ||
				l.args[13] != uint64(math.Float32bits(0.5)) || 8*len(table) > c.segs.Bytes {
				t.Errorf("adamw %d: %+v", np, l)
			}
		}
	}
}

// TestCUDAHostGradStats: GradStats queues the partial sums and the final kernel, chained
// through the partials, and nothing else: no copy either way and no wait.
func TestCUDAHostGradStats(t *testing.T) {
	c, f, cd := newHalfFake(t)
	syncs, htod := f.syncs, len(cd.htod)
	for _, n := range []int{0, 1, 1000, 65537, 1<<26 + 5} {
		dst, g := c.Alloc(3), c.Alloc(n)
		n0 := len(f.launches)
		c.GradStats(dst, g)
		names := checkHalfLaunches(t, f, n0, 0)
		fin := f.launches[len(f.launches)-1]
		wantArgs(t, "grad stats", fin, dst)
		if n == 0 {
			if !slices.Equal(names, []string{"df_gradstats"}) || fin.args[2] != 0 {
				t.Errorf("n=0: launched %v, parts %d", names, fin.args[2])
			}
			continue
		}
		part := f.launches[n0]
		if !slices.Equal(names, []string{"df_sumsq_partial", "df_gradstats"}) || part.gx != sumsqParts(n) ||
			part.args[0] != ptrs(g)[0] || fin.args[1] != part.args[2] || fin.args[2] != uint64(part.gx) || fin.gx != 1 {
			t.Errorf("n=%d: launched %v: partials %+v, final %+v", n, names, part, fin)
		}
	}
	if cd.dtoh != 0 || f.syncs != syncs || len(cd.htod) != htod {
		t.Errorf("GradStats copied %d times to the host, %d to the device, waited %d times: want none", cd.dtoh, len(cd.htod)-htod, f.syncs-syncs)
	}
	mustPanic(t, "grad stats has 2 elements, want 3", func() { c.GradStats(c.Alloc(2), c.Alloc(5)) })
}

// TestCUDAHostRoPETableCached: the inverse frequencies travel to the device once per table
// (identified by its values), the positions at every call; the kernels read the cached copy.
func TestCUDAHostRoPETableCached(t *testing.T) {
	c, f, cd := newHalfFake(t)
	const n, H, K, hd = 6, 4, 2, 16
	pos := []int32{0, 5, 1, 9, 2, 3}
	q, k, v, qkv := c.Alloc(n*H*hd/2), c.Alloc(n*K*hd/2), c.Alloc(n*K*hd/2), c.Alloc(n*(H+2*K)*hd/2)
	tableBytes, posBytes := 8*hd/2, 4*n
	calls := func(tab RoPETable, what string, wantUploads []int) uint64 {
		t.Helper()
		h0 := len(cd.htod)
		c.RoPEQKV(q, k, v, qkv, pos, H, K, hd, tab, BF16)
		c.RoPEQKVBackward(qkv, q, k, v, pos, H, K, hd, tab, BF16)
		if got := cd.htod[h0:]; !slices.Equal(got, wantUploads) {
			t.Errorf("%s: uploads of %v bytes, want %v", what, got, wantUploads)
		}
		a, b := f.launches[len(f.launches)-2], f.launches[len(f.launches)-1]
		if a.args[5] != b.args[5] || a.args[5] == 0 {
			t.Errorf("%s: frequencies at %#x then %#x", what, a.args[5], b.args[5])
		}
		return a.args[5]
	}
	tab := DefaultRoPE(500000, hd)
	first := calls(tab, "first table", []int{tableBytes, posBytes, posBytes})
	if calls(tab, "the same table again", []int{posBytes, posBytes}) != first {
		t.Errorf("the same table read from another copy")
	}
	same := DefaultRoPE(500000, hd) // another slice, the same values: the same table
	if calls(same, "equal values in another slice", []int{posBytes, posBytes}) != first {
		t.Errorf("equal values read from another copy")
	}
	tab.InvFreq[3] *= 0.5 // refilled in place: another table
	second := calls(tab, "values changed in place", []int{tableBytes, posBytes, posBytes})
	if second == first {
		t.Errorf("changed values read from the first table's copy")
	}
	scaled := tab
	scaled.Scale = 1.5 // Scale is a launch argument
	calls(scaled, "another scale", []int{posBytes, posBytes})
	if got := f.launches[len(f.launches)-1].args[10]; got != math.Float64bits(1.5) {
		t.Errorf("scale argument %#x", got)
	}
	// More tables than the cache keeps: the oldest is dropped and uploaded again when it returns.
	for i := range ropeCacheTables {
		calls(DefaultRoPE(float64(1000+i), hd), fmt.Sprintf("table %d", i), []int{tableBytes, posBytes, posBytes})
	}
	calls(DefaultRoPE(500000, hd), "the first table after the cache cycled", []int{tableBytes, posBytes, posBytes})
	if len(c.step16.rope) != ropeCacheTables {
		t.Errorf("%d tables kept, want %d", len(c.step16.rope), ropeCacheTables)
	}
}

// TestCUDAHostNormBackwardWide: rows too wide for the dw accumulators in shared memory
// accumulate in the global partial rows (no dynamic shared memory asked).
func TestCUDAHostNormBackwardWide(t *testing.T) {
	c, f, _ := newHalfFake(t)
	const rows, dim = 100, 4097
	if !normAccShared(dim, c.info.smemOptin) || normAccShared(30000, c.info.smemOptin) {
		t.Fatalf("normAccShared: %d columns should fit in %d bytes, 30000 not", dim, c.info.smemOptin)
	}
	c.info.smemOptin = 8 * 1024
	n0 := len(f.launches)
	c.RMSNormBackwardHalf(c.Alloc(rows*dim), nil, c.Alloc(dim), c.Alloc((rows*dim+1)/2), c.Alloc((rows*dim+1)/2), c.Alloc((dim+1)/2),
		c.Alloc(rows), rows, dim, 1, FP16)
	checkHalfLaunches(t, f, n0, 1)
	if l := f.launches[n0]; l.smem != 0 || l.args[9] != 0 || l.gx != normParts(rows) {
		t.Errorf("wide rows: %+v", l)
	}
}

// TestCUDAHostHalfArgs: wrong lengths, formats and arguments are refused before any launch.
func TestCUDAHostHalfArgs(t *testing.T) {
	c, f, _ := newHalfFake(t)
	n0 := len(f.launches)
	mustPanic(t, "embedding needs bf16 or fp16, got fp32", func() { c.EmbeddingHalf(c.Alloc(4), c.Alloc(4), []int32{0}, 4, FP32) })
	mustPanic(t, "packed embedding table needs an even width, got 3", func() { c.EmbeddingHalf(c.Alloc(3), c.Alloc(6), []int32{0}, 3, BF16) })
	mustPanic(t, "token id 4 outside vocabulary of 4", func() { c.EmbeddingHalf(c.Alloc(2), c.Alloc(4), []int32{4}, 2, BF16) })
	mustPanic(t, "rmsnorm out (packed) has 2 elements, want 3", func() {
		c.RMSNormHalf(c.Alloc(2), nil, c.Alloc(1), c.Alloc(5), c.Alloc(3), 1, 5, 1, BF16)
	})
	mustPanic(t, "rmsnorm keep (packed) has 5 elements, want 3", func() {
		c.RMSNormHalf(c.Alloc(3), c.Alloc(5), c.Alloc(1), c.Alloc(5), c.Alloc(3), 1, 5, 1, BF16)
	})
	mustPanic(t, "dw beta 0.5: want 0 or 1", func() {
		c.RMSNormBackwardHalf(c.Alloc(2), nil, c.Alloc(2), c.Alloc(1), c.Alloc(1), c.Alloc(1), c.Alloc(1), 1, 2, 0.5, BF16)
	})
	mustPanic(t, "rmsnorm dx (packed) has 2 elements, want 1", func() {
		c.RMSNormBackwardHalf(c.Alloc(2), c.Alloc(2), c.Alloc(2), c.Alloc(1), c.Alloc(1), c.Alloc(1), c.Alloc(1), 1, 2, 1, FP16)
	})
	mustPanic(t, "rope dk (packed) has 4 elements, want 8", func() {
		c.RoPEQKVBackward(c.Alloc(24), c.Alloc(8), c.Alloc(4), c.Alloc(8), []int32{0, 1}, 1, 1, 8, DefaultRoPE(1e4, 8), BF16)
	})
	mustPanic(t, "rope table of 3 frequencies for head_dim 8", func() {
		c.RoPEQKV(c.Alloc(8), c.Alloc(8), c.Alloc(8), c.Alloc(24), []int32{0, 1}, 1, 1, 8, DefaultRoPE(1e4, 6), BF16)
	})
	mustPanic(t, "swiglu gu (packed) has 3 elements, want 5", func() { c.SwiGLUHalf(c.Alloc(3), c.Alloc(3), 1, 5, BF16) })
	mustPanic(t, "swiglu act (packed) has 2 elements, want 3", func() { c.SwiGLUBackwardHalf(c.Alloc(5), c.Alloc(2), c.Alloc(3), c.Alloc(5), 1, 5, BF16) })
	mustPanic(t, "needs a dlogits buffer", func() { c.CrossEntropyHalf(c.Alloc(1), nil, c.Alloc(4), []int32{0}, 4, 1, BF16) })
	lg := c.Alloc(8)
	mustPanic(t, "dlogits overlaps logits", func() { c.CrossEntropyHalf(c.Alloc(2), c.Slice(lg, 4, 4), lg, []int32{0, 1}, 4, 1, BF16) })
	mustPanic(t, "target 4 outside vocabulary of 4", func() { c.CrossEntropyHalf(c.Alloc(1), c.Alloc(2), c.Alloc(4), []int32{4}, 4, 1, BF16) })
	mustPanic(t, "adamw copy (packed) has 5 elements, want 3", func() {
		c.AdamWSegmentsHalf(c.Alloc(5), c.Alloc(5), c.Alloc(5), c.Alloc(5), c.Alloc(5), []AdamWSegment{{0, 5, true}}, AdamWStep{Step: 1}, BF16)
	})
	mustPanic(t, "adamw copy needs bf16 or fp16, got fp32", func() {
		c.AdamWSegmentsHalf(c.Alloc(5), c.Alloc(5), c.Alloc(5), c.Alloc(5), c.Alloc(3), nil, AdamWStep{Step: 1}, FP32)
	})
	if len(f.launches) != n0 {
		t.Errorf("refused calls launched %v", f.names(n0))
	}
	// Empty inputs launch nothing (but RMSNormBackwardHalf with no rows, which still sets dw).
	c.EmbeddingHalf(c.Alloc(0), c.Alloc(4), nil, 2, BF16)
	c.RMSNormHalf(c.Alloc(0), nil, c.Alloc(0), c.Alloc(0), c.Alloc(2), 0, 4, 1, BF16)
	c.RoPEQKV(c.Alloc(0), c.Alloc(0), c.Alloc(0), c.Alloc(0), nil, 2, 1, 8, DefaultRoPE(1e4, 8), BF16)
	c.SwiGLUHalf(c.Alloc(0), c.Alloc(0), 0, 8, BF16)
	c.CrossEntropyHalf(c.Alloc(0), c.Alloc(0), c.Alloc(0), nil, 8, 1, BF16)
	c.AdamWSegmentsHalf(c.Alloc(4), c.Alloc(4), c.Alloc(4), c.Alloc(4), c.Alloc(2), []AdamWSegment{{2, 0, true}}, AdamWStep{Step: 1}, BF16)
	if len(f.launches) != n0 {
		t.Errorf("empty calls launched %v", f.names(n0))
	}
}

// ordered16 maps a 16-bit encoding to an integer that counts ulps (both zeros 0).
func ordered16(b uint16) int {
	if b&0x8000 != 0 {
		return -int(b & 0x7fff)
	}
	return int(b)
}

// within16 fails unless every 16-bit value of the two packed copies of b (the pad half of an
// odd length included) is within ulps units in the last place (two NaNs agree).
func (d duo) within16(t *testing.T, what string, b [2]Buf, h half, ulps int) {
	t.Helper()
	c, g := d.get(b)
	cw, gw := words(c), words(g)
	worst, at := 0, -1
	for i := range 2 * len(cw) {
		x, y := uint16(cw[i/2]>>(16*(i%2))), uint16(gw[i/2]>>(16*(i%2)))
		if isNaN16(x, h.p) && isNaN16(y, h.p) {
			continue
		}
		e := ordered16(x) - ordered16(y)
		if isNaN16(x, h.p) || isNaN16(y, h.p) {
			e = math.MaxInt32
		}
		if e < 0 {
			e = -e
		}
		if e > worst {
			worst, at = e, i
		}
	}
	if worst > ulps {
		t.Errorf("%s: value %d: cuda %#04x, cpu %#04x: %d ulps apart, want ≤ %d", what, at,
			uint16(gw[at/2]>>(16*(at%2))), uint16(cw[at/2]>>(16*(at%2))), worst, ulps)
	} else if worst > 0 {
		t.Logf("%s: %d ulp at most", what, worst)
	}
}

// noise uploads n random values to both backends: an output buffer whose every element the
// call must write (the pad half of a packed buffer included).
func noise(d duo, r *rand.Rand, n int) [2]Buf { return d.buf(randVec(r, n, 1)) }

// gpuSameWords fails unless each pair of GPU buffers holds the same bits (packed 16-bit
// values, which gpuSame's float32 comparison would let pass as two NaNs).
func gpuSameWords(t *testing.T, g *CUDA, what string, pairs ...[2]Buf) {
	t.Helper()
	for _, pair := range pairs {
		x, y := make([]float32, pair[0].Len()), make([]float32, pair[1].Len())
		g.Download(x, pair[0])
		g.Download(y, pair[1])
		if !slices.Equal(words(x), words(y)) {
			t.Errorf("%s: the words differ", what)
		}
	}
}

func TestCUDAEmbeddingHalf(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(41, 11))
	for _, h := range halves {
		const vocab, dim = 300, 130
		table := d.buf(packed16(randVec(r, vocab*dim, 1), h))
		ids := make([]int32, 517)
		for i := range ids {
			ids[i] = int32(r.IntN(vocab))
		}
		out := noise(d, r, len(ids)*dim)
		d.each(func(be Backend, i int) { be.EmbeddingHalf(out[i], table[i], ids, dim, h.p) })
		d.exact(t, fmt.Sprintf("%v embedding", h.p), out)
	}
}

func TestCUDARMSNormHalf(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(41, 12))
	for _, h := range halves {
		for _, s := range []struct{ rows, dim int }{{1, 1}, {7, 64}, {301, 4097}, {64, 2048}} {
			name := fmt.Sprintf("%v %dx%d", h.p, s.rows, s.dim)
			n := s.rows * s.dim
			x, w := d.buf(randVec(r, n, 2)), d.buf(packed16(randVec(r, s.dim, 1), h))
			out, keep, rstd := noise(d, r, (n+1)/2), noise(d, r, (n+1)/2), noise(d, r, s.rows)
			d.each(func(be Backend, i int) {
				be.RMSNormHalf(out[i], keep[i], rstd[i], x[i], w[i], s.rows, s.dim, 1e-5, h.p)
			})
			d.within16(t, name+" out", out, h, 1)
			d.within16(t, name+" keep", keep, h, 0)
			d.closeElem(t, name+" rstd", rstd, 1e-6, 0)
		}
	}
}

func TestCUDARMSNormBackwardHalf(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(41, 13))
	optin := d.gpu.info.smemOptin
	defer func() { d.gpu.info.smemOptin = optin }()
	for _, h := range halves {
		for _, s := range []struct {
			rows, dim int
			beta      float32
			smemOptin int // 0: the device's; small: the dw accumulators in global memory
		}{{1, 1, 0, 0}, {7, 64, 1, 0}, {301, 4097, 0, 0}, {1000, 2048, 1, 0}, {77, 1536, 0, 1024}, {3, 5, 1, 1024}} {
			name := fmt.Sprintf("%v %dx%d beta %g optin %d", h.p, s.rows, s.dim, s.beta, s.smemOptin)
			d.gpu.info.smemOptin = optin
			if s.smemOptin != 0 {
				d.gpu.info.smemOptin = s.smemOptin
			}
			n := s.rows * s.dim
			dout, x := d.buf(packed16(randVec(r, n, 1), h)), d.buf(packed16(randVec(r, n, 2), h))
			w := d.buf(packed16(randVec(r, s.dim, 1), h))
			rs := randVec(r, s.rows, 1)
			for i := range rs {
				rs[i] = float32(math.Abs(float64(rs[i]))) + 0.1
			}
			rstd := d.buf(rs)
			dx, dw := d.buf(randVec(r, n, 1)), d.buf(randVec(r, s.dim, 1))
			if s.beta == 0 {
				d.each(func(be Backend, i int) { be.Upload(dw[i], slices.Repeat([]float32{float32(math.NaN())}, s.dim)) })
			}
			dxh := noise(d, r, (n+1)/2)
			d.each(func(be Backend, i int) {
				be.RMSNormBackwardHalf(dx[i], dxh[i], dw[i], dout[i], x[i], w[i], rstd[i], s.rows, s.dim, s.beta, h.p)
			})
			d.close(t, name+" dx", dx, 1e-6)
			d.close(t, name+" dw", dw, 1e-6)
			d.within16(t, name+" dxHalf", dxh, h, 1)
			// bit-reproducible on the device: the same call again on fresh copies
			dx2, dw2 := d.gpu.Alloc(n), d.gpu.Alloc(s.dim)
			d.gpu.Copy(dx2, dx[1])
			d.gpu.Copy(dw2, dw[1])
			d.gpu.RMSNormBackwardHalf(dx[1], nil, dw[1], dout[1], x[1], w[1], rstd[1], s.rows, s.dim, 1, h.p)
			d.gpu.RMSNormBackwardHalf(dx2, nil, dw2, dout[1], x[1], w[1], rstd[1], s.rows, s.dim, 1, h.p)
			gpuSame(t, d.gpu, name+" run twice", [2]Buf{dx[1], dx2}, [2]Buf{dw[1], dw2})
		}
	}
}

func TestCUDARoPEQKV(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(41, 14))
	for _, h := range halves {
		for _, c := range append(slices.Clone(ropeCases), ropeCase{300, 32, 8, 128}) {
			Q, KV := c.heads*c.hd, c.kvHeads*c.hd
			pos := make([]int32, c.n)
			for i := range pos {
				pos[i] = int32(r.IntN(524288))
			}
			pos[0] = 524287
			for ti, tab := range []RoPETable{DefaultRoPE(500000, c.hd), ropeTable(c.hd)} {
				name := fmt.Sprintf("%v %+v table %d", h.p, c, ti)
				qkv := d.buf(packed16(randVec(r, c.n*(Q+2*KV), 1), h))
				q, k, v := noise(d, r, (c.n*Q+1)/2), noise(d, r, (c.n*KV+1)/2), noise(d, r, (c.n*KV+1)/2)
				d.each(func(be Backend, i int) { be.RoPEQKV(q[i], k[i], v[i], qkv[i], pos, c.heads, c.kvHeads, c.hd, tab, h.p) })
				d.within16(t, name+" q", q, h, 1)
				d.within16(t, name+" k", k, h, 1)
				d.within16(t, name+" v", v, h, 0)
				// the backward from the same inputs on both
				dq, dk := d.buf(packed16(randVec(r, c.n*Q, 1), h)), d.buf(packed16(randVec(r, c.n*KV, 1), h))
				dv, dqkv := d.buf(packed16(randVec(r, c.n*KV, 1), h)), noise(d, r, (c.n*(Q+2*KV)+1)/2)
				d.each(func(be Backend, i int) {
					be.RoPEQKVBackward(dqkv[i], dq[i], dk[i], dv[i], pos, c.heads, c.kvHeads, c.hd, tab, h.p)
				})
				d.within16(t, name+" dqkv", dqkv, h, 1)
			}
		}
	}
}

func TestCUDASwiGLUHalf(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(41, 15))
	for _, h := range halves {
		for _, s := range []struct{ rows, ffn int }{{3, 5}, {1, 1}, {65, 5632}, {17, 1001}} {
			name := fmt.Sprintf("%v %dx%d", h.p, s.rows, s.ffn)
			n := s.rows * s.ffn
			guv := randVec(r, 2*n, 4)
			guv[0], guv[1] = 90, -90 // exp(−g) under- and overflowing in float32
			gu, dact := d.buf(packed16(guv, h)), d.buf(packed16(randVec(r, n, 1), h))
			act := noise(d, r, (n+1)/2)
			d.each(func(be Backend, i int) { be.SwiGLUHalf(act[i], gu[i], s.rows, s.ffn, h.p) })
			d.within16(t, name+" act", act, h, 1)
			dgu, act2 := noise(d, r, n), noise(d, r, (n+1)/2)
			d.each(func(be Backend, i int) { be.SwiGLUBackwardHalf(dgu[i], act2[i], dact[i], gu[i], s.rows, s.ffn, h.p) })
			d.within16(t, name+" dgu", dgu, h, 1)
			d.within16(t, name+" backward's act", act2, h, 1)
			gpuSameWords(t, d.gpu, name+" backward's act against the forward's", [2]Buf{act[1], act2[1]})
		}
	}
}

func TestCUDACrossEntropyHalf(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(41, 16))
	for _, h := range halves {
		for _, s := range []struct{ rows, vocab int }{{5, 7}, {9, 32000}, {4, 32001}} {
			name := fmt.Sprintf("%v %dx%d", h.p, s.rows, s.vocab)
			targets := make([]int32, s.rows)
			for i := range targets {
				targets[i] = int32(r.IntN(s.vocab))
			}
			targets[1] = -1
			logits := d.buf(randVec(r, s.rows*s.vocab, 4))
			losses, dl := noise(d, r, s.rows), noise(d, r, (s.rows*s.vocab+1)/2)
			d.each(func(be Backend, i int) { be.CrossEntropyHalf(losses[i], dl[i], logits[i], targets, s.vocab, 0.25, h.p) })
			d.closeElem(t, name+" losses", losses, 1e-6, 1e-6)
			d.within16(t, name+" dlogits", dl, h, 1)
		}
	}
}

func TestCUDAGradStats(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(41, 17))
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, c := range []struct {
		name string
		n    int
		set  map[int]float32
	}{
		{"empty", 0, nil}, {"one", 1, nil}, {"finite", 3000017, nil}, {"NaN", 3000017, map[int]float32{2999999: nan}},
		{"+Inf", 100, map[int]float32{0: inf}}, {"-Inf", 100001, map[int]float32{65536: -inf}},
	} {
		x := randVec(r, c.n, 1e-2)
		for i, v := range c.set {
			x[i] = v
		}
		g, dst := d.buf(x), noise(d, r, 3)
		d.each(func(be Backend, i int) { be.GradStats(dst[i], g[i]) })
		cs, gs := d.get(dst)
		if gs[2] != cs[2] || gs[2] != 0 && gs[1] != 0 {
			t.Errorf("%s: cuda %v, cpu %v", c.name, gs, cs)
		}
		if cs[2] == 0 {
			want, got := float64(cs[0])+float64(cs[1]), float64(gs[0])+float64(gs[1])
			if math.Abs(got-want) > 1e-12*want {
				t.Errorf("%s: Σg² cuda %v, cpu %v", c.name, got, want)
			}
		} else if !(isNaN32(gs[0]) && isNaN32(cs[0])) && gs[0] != cs[0] {
			t.Errorf("%s: hi cuda %v, cpu %v", c.name, gs[0], cs[0])
		}
		again := d.gpu.Alloc(3)
		d.gpu.GradStats(again, g[1])
		gpuSame(t, d.gpu, c.name+" run twice", [2]Buf{dst[1], again})
	}
}

func TestCUDAAdamWSegmentsHalf(t *testing.T) {
	d := newDuo(t)
	r := rand.New(rand.NewPCG(41, 18))
	for _, h := range halves {
		const n = 300001
		segs := []AdamWSegment{{0, 2048, false}, {2048, 200000, true}, {202049, 7, false}, {250000, 50001, true}}
		p0 := randVec(r, n, 1)
		p, m, v := d.buf(p0), d.zeros(n), d.zeros(n)
		half := d.zeros((n + 1) / 2)
		d.each(func(be Backend, i int) {
			be.PackHalf(half[i], p[i], h.p) // the copy outside the segments
			// a last word of noise: its low half is the last parameter's (in a segment), its high
			// half the pad, which the update must zero
			be.Upload(be.Slice(half[i], n/2, 1), []float32{math.Float32frombits(0x3c003c00)})
		})
		g := d.gpu
		p2, m2, v2 := g.Alloc(n), g.Alloc(n), g.Alloc(n)
		g.Upload(p2, p0)
		for step := int64(1); step <= 3; step++ {
			gr := d.buf(randVec(r, n, 1e-2))
			hp := AdamWStep{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: step, GradScale: 0.7}
			d.each(func(be Backend, i int) { be.AdamWSegmentsHalf(p[i], gr[i], m[i], v[i], half[i], segs, hp, h.p) })
			g.AdamWSegments(p2, gr[1], m2, v2, segs, hp)
		}
		name := h.p.String()
		d.closeElem(t, name+" p", p, 1e-6, 1e-12)
		d.within16(t, name+" 16-bit copy", half, h, 1)
		packed := g.Alloc((n + 1) / 2)
		g.PackHalf(packed, p[1], h.p)
		gpuSame(t, g, name+" against AdamWSegments on the GPU", [2]Buf{p[1], p2}, [2]Buf{m[1], m2}, [2]Buf{v[1], v2})
		gpuSameWords(t, g, name+" 16-bit copy against PackHalf on the GPU", [2]Buf{half[1], packed})
	}
}
