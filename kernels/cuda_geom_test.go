//go:build cuda

package kernels

// Tests of the CUDA backend's host-side planning (cuda_geom.go). They need no GPU: run them on
// any machine with a C compiler (the package declares the CUDA calls itself and opens the
// driver and cuBLAS at run time, so it needs neither the toolkit nor the libraries) by
//
//	go test -tags cuda -run 'TestCUDAHost' ./kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"distflash/kernels/cuda"
)

// colMajorGemm executes g the way cuBLAS defines it, on column-major float64 matrices:
// C[i + j·ldc] = Σ_p op(A)[i,p]·op(B)[p,j].
func colMajorGemm(g cuda.Gemm, a, b []float32) []float64 {
	c := make([]float64, g.LDC*g.N)
	opA := func(i, p int) float64 {
		if g.TransA {
			return float64(a[p+i*g.LDA])
		}
		return float64(a[i+p*g.LDA])
	}
	opB := func(p, j int) float64 {
		if g.TransB {
			return float64(b[j+p*g.LDB])
		}
		return float64(b[p+j*g.LDB])
	}
	for i := 0; i < g.M; i++ {
		for j := 0; j < g.N; j++ {
			var s float64
			for p := 0; p < g.K; p++ {
				s += opA(i, p) * opB(p, j)
			}
			c[i+j*g.LDC] = s
		}
	}
	return c
}

// TestCUDAHostCublasPlan runs the column-major call that MatMul makes (with MatMul's B as the
// call's A and A as its B) through a column-major GEMM and compares it with the row-major
// product MatMul defines, for every transpose combination and non-square shapes.
func TestCUDAHostCublasPlan(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range []struct{ m, n, k int }{{3, 5, 7}, {1, 9, 4}, {8, 1, 3}, {6, 6, 1}, {17, 11, 13}} {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			a, b := randVec(r, s.m*s.k, 1), randVec(r, s.k*s.n, 1)
			ref := refMatMul(make([]float32, s.m*s.n), a, b, s.m, s.n, s.k, tr[0], tr[1], 0)
			g := cublasPlan(s.m, s.n, s.k, tr[0], tr[1])
			if g.M != s.n || g.N != s.m || g.K != s.k || g.LDC != s.n {
				t.Fatalf("%v trans %v: plan %+v", s, tr, g)
			}
			// cuBLAS requires lda ≥ rows of the stored A, and so on.
			rowsA, rowsB := g.M, g.K
			if g.TransA {
				rowsA = g.K
			}
			if g.TransB {
				rowsB = g.N
			}
			if g.LDA < max(1, rowsA) || g.LDB < max(1, rowsB) {
				t.Fatalf("%v trans %v: leading dimensions %+v below the stored rows %d, %d", s, tr, g, rowsA, rowsB)
			}
			got := colMajorGemm(g, b, a) // the call's A is MatMul's B
			if e := relErr64(got, ref); e > 1e-12 {
				t.Errorf("%v trans %v: column-major call differs from the row-major product by %.2g", s, tr, e)
			}
		}
	}
}

func TestCUDAHostKernelArgs(t *testing.T) {
	view := cudaBuf{mem: &cuda.Mem{Ptr: 0x7000, Bytes: 400}, off: 3, n: 5}
	got := kernelArgs([]any{devPtr(0xdeadbeef00), int32(-2), int64(-3), float32(1.5), float64(-0.25), view, cudaBuf{}})
	want := []uint64{0xdeadbeef00, 0xfffffffe, 0xfffffffffffffffd, uint64(math.Float32bits(1.5)), math.Float64bits(-0.25), 0x700c, 0}
	if !slices.Equal(got, want) {
		t.Fatalf("kernelArgs = %#x, want %#x", got, want)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "parameter 0 has Go type int") {
			t.Fatalf("a Go int parameter: recovered %v, want a panic naming the parameter", r)
		}
	}()
	kernelArgs([]any{7})
}

// TestCUDAHostEmbedGroups checks that the groups partition the tokens, share one id each,
// list their tokens in increasing order (the CPU's order of additions), and are one per id.
func TestCUDAHostEmbedGroups(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 50, 1000} {
		ids := make([]int32, n)
		for i := range ids {
			ids[i] = int32(r.IntN(max(n/3, 1)))
		}
		order, start := embedGroups(ids)
		seen := make([]bool, n)
		uniq := map[int32]bool{}
		for u := 0; u+1 < len(start); u++ {
			grp := order[start[u]:start[u+1]]
			if len(grp) == 0 {
				t.Fatalf("n=%d: empty group %d", n, u)
			}
			id := ids[grp[0]]
			if uniq[id] {
				t.Fatalf("n=%d: id %d in two groups", n, id)
			}
			uniq[id] = true
			for k, tok := range grp {
				if ids[tok] != id || seen[tok] || (k > 0 && tok <= grp[k-1]) {
					t.Fatalf("n=%d: group %d = %v (ids %d) is not the increasing tokens of one id", n, u, grp, id)
				}
				seen[tok] = true
			}
		}
		if start[len(start)-1] != int32(n) || slices.Contains(seen, false) {
			t.Fatalf("n=%d: groups do not cover every token once", n)
		}
	}
}

// TestCUDAHostTileBounds checks the skip rule the attention kernels use against brute force:
// a tile skipped by max(qpos) < min(kpos) holds no visible pair, a tile kept holds at least
// one, and visiblePairs counts exactly the pairs of the kept tiles.
func TestCUDAHostTileBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 31, 64, 100, 257} {
		for name, qpos := range layouts(n, r) {
			for _, nk := range []int{1, 33, n} {
				kpos := make([]int32, nk)
				for j := range kpos {
					kpos[j] = int32(r.IntN(n + 8))
				}
				sh := AttnShape{NQ: n, NK: nk, Causal: true, QPos: qpos, KPos: kpos}
				for _, tiles := range [][2]int{{attnT64, attnT64}, {attnT64, attnT32}, {attnT32, attnT64}} {
					bq, bk := tiles[0], tiles[1]
					_, qmax := tileBounds(qpos, bq)
					kmin, _ := tileBounds(kpos, bk)
					var want int64
					for ti := range qmax {
						for tj := range kmin {
							any := false
							for i := ti * bq; i < min((ti+1)*bq, n); i++ {
								for j := tj * bk; j < min((tj+1)*bk, nk); j++ {
									any = any || qpos[i] >= kpos[j]
								}
							}
							kept := qmax[ti] >= kmin[tj]
							if kept != any {
								t.Fatalf("%s n=%d nk=%d tiles %dx%d: tile (%d,%d) kept=%v but has visible pairs=%v", name, n, nk, bq, bk, ti, tj, kept, any)
							}
							if kept {
								want += int64(min(bq, n-ti*bq)) * int64(min(bk, nk-tj*bk))
							}
						}
					}
					if got := visiblePairs(sh, bq, bk); got != want {
						t.Fatalf("%s n=%d nk=%d tiles %dx%d: visiblePairs = %d, want %d", name, n, nk, bq, bk, got, want)
					}
				}
			}
		}
	}
	sh := AttnShape{NQ: 5, NK: 7}
	if got := visiblePairs(sh, 64, 64); got != 35 {
		t.Fatalf("non-causal: visiblePairs = %d, want 35", got)
	}
}

// TestCUDAHostTileBoundsDocuments checks the skip rule under a document mask, and under
// sliding windows (start tables of the same kind, alone and with documents), against brute
// force: a tile skipped (max qpos < min kpos, or min qstart > max kpos) holds no visible
// pair, a tile wholly visible by the kernels' test (min qpos ≥ max kpos and max qstart ≤
// min kpos) holds only visible pairs, and visiblePairs counts the pairs of the kept tiles;
// with documents it counts fewer than without whenever a tile is hidden by them alone.
func TestCUDAHostTileBoundsDocuments(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	hiddenByDocs := 0
	for _, n := range []int{1, 31, 64, 100, 257} {
		tables := docTables(n, r)
		tables["window5"] = windowTable(n, 5, nil)
		tables["window40+short"] = windowTable(n, 40, tables["short"])
		for name, pos := range layouts(n, r) {
			for dn, doc := range tables {
				for _, nk := range []int{1, 33, n} {
					kpos := pos
					if nk != n {
						kpos = make([]int32, nk)
						for j := range kpos {
							kpos[j] = int32(r.IntN(n))
						}
					}
					sh := AttnShape{NQ: n, NK: nk, Causal: true, QPos: pos, KPos: kpos, QStart: docStarts(pos, doc)}
					for _, tiles := range [][2]int{{attnT64, attnT64}, {attnT64, attnT32}, {attnT32, attnT64}} {
						bq, bk := tiles[0], tiles[1]
						qmin, qmax := tileBounds(pos, bq)
						smin, smax := tileBounds(sh.QStart, bq)
						kmin, kmax := tileBounds(kpos, bk)
						var want int64
						for ti := range qmax {
							for tj := range kmin {
								any, all := false, true
								for i := ti * bq; i < min((ti+1)*bq, n); i++ {
									for j := tj * bk; j < min((tj+1)*bk, nk); j++ {
										vis := pos[i] >= kpos[j] && kpos[j] >= sh.QStart[i]
										any, all = any || vis, all && vis
									}
								}
								kept := qmax[ti] >= kmin[tj] && smin[ti] <= kmax[tj]
								if !kept && any {
									t.Fatalf("%s %s n=%d nk=%d tiles %dx%d: tile (%d,%d) skipped but has visible pairs", name, dn, n, nk, bq, bk, ti, tj)
								}
								if qmin[ti] >= kmax[tj] && smax[ti] <= kmin[tj] && !all {
									t.Fatalf("%s %s n=%d nk=%d tiles %dx%d: tile (%d,%d) taken as all visible but has masked pairs", name, dn, n, nk, bq, bk, ti, tj)
								}
								if kept {
									want += int64(min(bq, n-ti*bq)) * int64(min(bk, nk-tj*bk))
								} else if qmax[ti] >= kmin[tj] {
									hiddenByDocs++
								}
							}
						}
						if got := visiblePairs(sh, bq, bk); got != want {
							t.Fatalf("%s %s n=%d nk=%d tiles %dx%d: visiblePairs = %d, want %d", name, dn, n, nk, bq, bk, got, want)
						}
					}
				}
			}
		}
	}
	if hiddenByDocs == 0 {
		t.Error("no tile was hidden by the document mask alone")
	}
}

// TestCUDAHostPackAttnInts checks the layout of the uploaded positions and bounds.
func TestCUDAHostPackAttnInts(t *testing.T) {
	qpos := []int32{5, 9, 2}
	kpos := make([]int32, 70)
	for j := range kpos {
		kpos[j] = int32(100 - j)
	}
	a := packAttnInts(AttnShape{NQ: 3, NK: 70, Causal: true, QPos: qpos, KPos: kpos})
	part := func(off, n int) []int32 { return a.data[off : off+n] }
	checks := []struct {
		name      string
		got, want []int32
	}{
		{"qpos", part(a.qpos, 3), qpos},
		{"kpos", part(a.kpos, 70), kpos},
		{"q64min", part(a.q64min, 1), []int32{2}},
		{"q64max", part(a.q64max, 1), []int32{9}},
		{"q32max", part(a.q32max, 1), []int32{9}},
		{"k64min", part(a.k64min, 2), []int32{37, 31}},
		{"k64max", part(a.k64max, 2), []int32{100, 36}},
		{"k32min", part(a.k32min, 3), []int32{69, 37, 31}},
		{"k32max", part(a.k32max, 3), []int32{100, 68, 36}},
	}
	for _, c := range checks {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if b := packAttnInts(AttnShape{NQ: 3, NK: 70}); len(b.data) != 0 {
		t.Errorf("non-causal call uploads %d ints, want none", len(b.data))
	}
	// With a document mask the queries' document starts and their bounds follow.
	qstart := make([]int32, 70)
	for i := range qstart {
		qstart[i] = int32(i / 10 * 10)
	}
	qpos70 := make([]int32, 70)
	for i := range qpos70 {
		qpos70[i] = int32(i)
	}
	b := packAttnInts(AttnShape{NQ: 70, NK: 70, Causal: true, QPos: qpos70, KPos: kpos, QStart: qstart})
	if n := 70 + 70 + 2*(2+3) + 2*(2+3); b.qstart != n { // positions, then query and key bounds at 64 and 32
		t.Errorf("qstart at %d, want %d (after the causal parts)", b.qstart, n)
	}
	for _, c := range []struct {
		name      string
		got, want []int32
	}{
		{"qstart", b.data[b.qstart : b.qstart+70], qstart},
		{"qs64min", b.data[b.qs64min : b.qs64min+2], []int32{0, 60}},
		{"qs64max", b.data[b.qs64max : b.qs64max+2], []int32{60, 60}},
		{"qs32min", b.data[b.qs32min : b.qs32min+3], []int32{0, 30, 60}},
		{"qs32max", b.data[b.qs32max : b.qs32max+3], []int32{30, 60, 60}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if len(b.data) != b.qs32max+3 {
		t.Errorf("%d ints uploaded, want %d", len(b.data), b.qs32max+3)
	}
}

// TestCUDAHostPlanAttn checks which kernels run: tensor cores only at 16-bit precision and
// for instantiated head dimensions, and that their shared memory fits the opt-in limit of an
// A100 (163 KiB) and of an H100 (227 KiB) with two blocks per H100 multiprocessor.
func TestCUDAHostPlanAttn(t *testing.T) {
	cases := []struct {
		hd     int
		p      cudaPrec
		mma    bool
		suffix string
	}{
		{128, precBF16, true, "bf16_hd128"}, {64, precFP16, true, "f16_hd64"}, {32, precBF16, true, "bf16_hd32"},
		{128, precFP32, false, ""}, {16, precBF16, false, ""}, {96, precBF16, false, ""}, {6, precFP32, false, ""},
	}
	for _, c := range cases {
		p := planAttn(c.hd, c.p)
		if p.mma != c.mma || p.suffix != c.suffix {
			t.Errorf("hd %d %v: plan %+v, want mma=%v suffix %q", c.hd, c.p, p, c.mma, c.suffix)
		}
		if !p.mma && (p.fwdBK != attnT32 || p.threads != f32Threads || p.smemFwd != 2*attnT32*c.hd*4) {
			t.Errorf("hd %d %v: f32 plan %+v", c.hd, c.p, p)
		}
	}
	const a100, h100 = 166912, 232448
	for _, hd := range mmaHeadDims {
		p := planAttn(hd, precBF16)
		for _, s := range []int{p.smemFwd, p.smemDQ, p.smemDKDV} {
			if s > a100 || 2*s > h100 {
				t.Errorf("hd %d: %d bytes of shared memory per block", hd, s)
			}
		}
	}
}

// TestCUDAHostBadDevice checks that a device number that cannot exist is an error, not a panic
// (on a machine without a GPU the driver's own error comes first; either names the cause).
func TestCUDAHostBadDevice(t *testing.T) {
	for _, d := range []int{-1, 1 << 20} {
		be, err := NewCUDA(d)
		if err == nil || be != nil {
			t.Fatalf("NewCUDA(%d) = %v, %v; want an error", d, be, err)
		}
		if !strings.HasPrefix(err.Error(), "kernels: cuda: ") {
			t.Errorf("NewCUDA(%d): %q does not say where it comes from", d, err)
		}
		t.Logf("NewCUDA(%d): %v", d, err)
	}
}

// TestCUDAHostNoDriver runs the test binary again with DISTFLASH_LIBCUDA naming a library that
// does not exist (as on a machine without the NVIDIA driver): the binary starts, the CPU
// backend works, and device "cuda" fails with an error that names the driver library.
func TestCUDAHostNoDriver(t *testing.T) {
	if os.Getenv("DISTFLASH_NO_DRIVER_CHILD") == "1" {
		if _, err := NewDevice("cpu", 0); err != nil {
			t.Fatalf("NewDevice(cpu): %v", err)
		}
		be, err := NewDevice("cuda", 0)
		if err == nil || be != nil {
			t.Fatalf("NewDevice(cuda) without a driver = %v, %v; want an error", be, err)
		}
		for _, want := range []string{"kernels: cuda: ", "cannot load the NVIDIA driver library /nonexistent/libcuda.so.1", "No such file"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("NewDevice(cuda) without a driver: %q does not contain %q", err, want)
			}
		}
		fmt.Println("child error:", err)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestCUDAHostNoDriver$", "-test.v")
	cmd.Env = append(os.Environ(), "DISTFLASH_NO_DRIVER_CHILD=1", "DISTFLASH_LIBCUDA=/nonexistent/libcuda.so.1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "child error: kernels: cuda: cannot load") {
		t.Fatalf("child test: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

func TestCUDAHostGrids(t *testing.T) {
	if ewGrid(0) != 1 || ewGrid(256) != 1 || ewGrid(257) != 2 || ewGrid(1<<40) != maxGridX {
		t.Errorf("ewGrid: %d %d %d %d", ewGrid(0), ewGrid(256), ewGrid(257), ewGrid(1<<40))
	}
	if warpRowGrid(8) != 1 || warpRowGrid(9) != 2 {
		t.Errorf("warpRowGrid(8), (9) = %d, %d", warpRowGrid(8), warpRowGrid(9))
	}
	if sumsqParts(1) != 1 || sumsqParts(65537) != 2 || sumsqParts(1<<40) != 1024 {
		t.Errorf("sumsqParts: %d %d %d", sumsqParts(1), sumsqParts(65537), sumsqParts(1<<40))
	}
}
