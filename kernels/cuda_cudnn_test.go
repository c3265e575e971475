//go:build cuda

package kernels

import (
	"bytes"
	"debug/elf"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"distflash/kernels/cuda"
)

// visibleRef is the reference mask of the attention primitive (AttnShape's doc comment).
func visibleRef(sh AttnShape, i, j int) bool {
	if !sh.Causal {
		return true
	}
	if sh.KPos[j] > sh.QPos[i] {
		return false
	}
	return sh.QStart == nil || sh.QStart[i] <= sh.KPos[j]
}

// visibleCUDNN is what cuDNN's graph for block b hides, in cuDNN's terms: rows and columns of
// each batch, the right bound (top-left, shifted, or bottom-right from the batch's lengths),
// the left bound, the padding.
func visibleCUDNN(b cudnnBlock, i, j int) bool {
	q0, sq, k0, skv := 0, int(b.sq), 0, int(b.skv)
	if b.ragged {
		found := false
		for _, s := range b.segs {
			if i >= s.q0 && i < s.q0+s.nq {
				q0, sq, k0, skv, found = s.q0, s.nq, s.k0, s.nk, true
			}
		}
		if !found || j < k0 || j >= k0+skv {
			return false
		}
	}
	r, c := i-q0, j-k0
	m := b.mask
	diag := int(m.Shift)
	if m.BottomRight {
		diag = skv - sq
	}
	if m.Causal && c > r+diag {
		return false
	}
	if m.Left > 0 {
		if m.BottomRight {
			return c > r+diag-int(m.Left)
		}
		return c > r-int(m.Left)
	}
	return true
}

// TestCUDAHostCUDNNClassify checks classifyCUDNN on every kind of block the schedules make and
// on random ones: wherever it gives a cuDNN form, cuDNN's mask (visibleCUDNN) hides exactly what
// the positions hide; and the kinds it must find it finds.
func TestCUDAHostCUDNNClassify(t *testing.T) {
	shape := func(qp, kp, qs []int32) AttnShape {
		return AttnShape{NQ: len(qp), NK: len(kp), Heads: 4, KVHeads: 2, HeadDim: 64, Causal: true, QPos: qp, KPos: kp, QStart: qs}
	}
	diag := seqPos(0, 100)
	cases := []struct {
		name string
		sh   AttnShape
		kind string // "" : the own kernel
		mask cuda.Mask
	}{
		{"not causal", AttnShape{NQ: 3, NK: 5, Heads: 1, KVHeads: 1, HeadDim: 8}, "full", cuda.Mask{}},
		{"diagonal", shape(diag, diag, nil), "causal", cuda.Mask{Causal: true}},
		{"past", shape(seqPos(100, 50), seqPos(0, 100), nil), "full", cuda.Mask{}},
		{"past, touching", shape(seqPos(99, 50), seqPos(0, 100), nil), "full", cuda.Mask{}},
		{"bottom-right", shape(seqPos(60, 40), seqPos(0, 100), nil), "causal bottom-right", cuda.Mask{Causal: true, BottomRight: true}},
		{"shifted", shape(seqPos(10, 100), seqPos(0, 100), nil), "causal shifted", cuda.Mask{Causal: true, Shift: 10}},
		{"band", shape(diag, diag, stubStarts(diag, nil, 7)), "band", cuda.Mask{Causal: true, Left: 7}},
		{"band bottom-right", shape(seqPos(60, 40), seqPos(0, 100), stubStarts(seqPos(60, 40), nil, 30)), "band",
			cuda.Mask{Causal: true, BottomRight: true, Left: 30}},
		{"band shifted", shape(seqPos(10, 100), seqPos(0, 100), stubStarts(seqPos(10, 100), nil, 30)), "band",
			cuda.Mask{Causal: true, Shift: 10, Left: 20}},
		{"past, window hides all but the last keys", shape(seqPos(100, 20), seqPos(0, 100), stubStarts(seqPos(100, 20), nil, 50)), "band",
			cuda.Mask{Causal: true, Shift: 100, Left: -50}},
		{"documents on the diagonal", shape(diag, diag, stubStarts(diag, []int32{0, 30, 31, 77}, 0)), "documents causal",
			cuda.Mask{Causal: true, BottomRight: true}},
		{"documents and a window", shape(diag, diag, stubStarts(diag, []int32{0, 30, 77}, 9)), "documents band",
			cuda.Mask{Causal: true, BottomRight: true, Left: 9}},
		{"a document across a past block", shape(seqPos(100, 50), seqPos(0, 100), stubStarts(seqPos(100, 50), []int32{0, 40, 120}, 0)),
			"documents", cuda.Mask{}},
		{"a document starting in the query block", shape(seqPos(100, 50), seqPos(0, 100), stubStarts(seqPos(100, 50), []int32{0, 120}, 0)),
			"documents", cuda.Mask{}},
		{"the first queries see nothing", shape(seqPos(0, 100), seqPos(20, 100), nil), "documents causal", cuda.Mask{Causal: true, BottomRight: true}},
		{"striped keys", shape(diag, []int32{0, 2, 4, 6}, nil), "", cuda.Mask{}},
		{"zigzag pair of chunks", shape(append(seqPos(0, 10), seqPos(90, 10)...), append(seqPos(0, 10), seqPos(90, 10)...), nil), "", cuda.Mask{}},
	}
	for _, c := range cases {
		b, why := classifyCUDNN(c.sh)
		if c.name == "past, window hides all but the last keys" {
			// left = L − shift < 1: cuDNN's top-left left bound cannot place this band
			if why == "" && b.kind == "band" {
				t.Errorf("%s: classified as %s %+v, a band cuDNN cannot express", c.name, b.kind, b.mask)
			}
			continue
		}
		if c.kind == "" {
			if why == "" {
				t.Errorf("%s: classified as %s, want the own kernel", c.name, b.kind)
			}
			continue
		}
		if why != "" || b.kind != c.kind || b.mask != c.mask {
			t.Errorf("%s: %q %+v (%s), want %q %+v", c.name, b.kind, b.mask, why, c.kind, c.mask)
			continue
		}
		checkMaskEqual(t, c.name, c.sh, b)
	}
	// random blocks of the layouts the schedules make: contiguous chunks, documents, windows
	rng := rand.New(rand.NewPCG(3, 5))
	found := map[string]int{}
	for n := range 3000 {
		nq, nk := 1+rng.IntN(70), 1+rng.IntN(70)
		q0 := rng.IntN(150)
		k0 := max(0, q0+rng.IntN(120)-100)
		qp, kp := seqPos(q0, nq), seqPos(k0, nk)
		var starts []int32
		for p := 0; p < 300; p += 1 + rng.IntN(60) {
			starts = append(starts, int32(p))
		}
		window := 0
		if rng.IntN(3) == 0 {
			window = 1 + rng.IntN(40)
		}
		var qs []int32
		if rng.IntN(2) == 0 || window > 0 {
			if rng.IntN(2) == 0 {
				starts = nil
			}
			qs = stubStarts(qp, starts, window)
		}
		sh := shape(qp, kp, qs)
		if visiblePairs(sh, 1, 1) == 0 {
			continue
		}
		b, why := classifyCUDNN(sh)
		if why != "" {
			found["own: "+why]++
			continue
		}
		found[b.kind]++
		checkMaskEqual(t, fmt.Sprintf("random block %d (q %d+%d, k %d+%d, window %d, starts %v)", n, q0, nq, k0, nk, window, starts), sh, b)
	}
	for _, kind := range []string{"full", "causal", "causal bottom-right", "causal shifted", "band", "documents", "documents causal", "documents band"} {
		if found[kind] == 0 {
			t.Errorf("no random block classified %q: %v", kind, found)
		}
	}
	t.Logf("random blocks: %v", found)
}

// checkMaskEqual checks that cuDNN's form b of block sh hides exactly what sh hides, and that
// a ragged block's segments are disjoint, ordered and within the bucketed maxima.
func checkMaskEqual(t *testing.T, what string, sh AttnShape, b cudnnBlock) {
	t.Helper()
	bad := 0
	for i := range sh.NQ {
		for j := range sh.NK {
			if visibleRef(sh, i, j) != visibleCUDNN(b, i, j) && bad < 3 {
				t.Errorf("%s (%s %+v): query %d key %d visible %v, cuDNN's mask says %v", what, b.kind, b.mask, i, j,
					visibleRef(sh, i, j), visibleCUDNN(b, i, j))
				bad++
			}
		}
	}
	if !b.ragged {
		if b.b != 1 || b.sq != int64(sh.NQ) || b.skv != int64(sh.NK) {
			t.Errorf("%s: batch %d × %d × %d, want 1 × %d × %d", what, b.b, b.sq, b.skv, sh.NQ, sh.NK)
		}
		return
	}
	if int(b.b) < len(b.segs) || b.b&(b.b-1) != 0 {
		t.Errorf("%s: %d batches for %d segments", what, b.b, len(b.segs))
	}
	for i, s := range b.segs {
		if s.nq > int(b.sq) || s.nk > int(b.skv) || (i > 0 && (s.q0 < b.segs[i-1].q0+b.segs[i-1].nq || s.k0 < b.segs[i-1].k0+b.segs[i-1].nk)) {
			t.Errorf("%s: segment %d %+v (maxima %d, %d; segments %+v)", what, i, s, b.sq, b.skv, b.segs)
		}
	}
}

// TestCUDAHostCUDNNRagged checks packRagged: the sequence lengths, the ragged offsets of each
// operand (rows × row width), the empty batches past the segments, the row map.
func TestCUDAHostCUDNNRagged(t *testing.T) {
	diag := seqPos(0, 100)
	sh := AttnShape{NQ: 100, NK: 100, Heads: 4, KVHeads: 2, HeadDim: 8, Causal: true, QPos: diag, KPos: diag,
		QStart: stubStarts(diag, []int32{0, 30, 77}, 0)}
	b, why := classifyCUDNN(sh)
	if why != "" || !b.ragged || len(b.segs) != 3 || b.b != 4 || b.sq != 64 || b.skv != 64 {
		t.Fatalf("classify: %+v %s", b, why)
	}
	r, err := packRagged(b, sh.NQ, 4, 32, 16, 32, 64)
	if err != nil {
		t.Fatal(err)
	}
	part := func(off, n int) []int32 { return r.data[off : off+n] }
	checks := []struct {
		name string
		got  []int32
		want []int32
	}{
		{"seq_len_q", part(r.seqQ, 4), []int32{30, 47, 23, 0}},
		{"seq_len_kv", part(r.seqKV, 4), []int32{30, 47, 23, 0}},
		{"offsets q", part(r.offQ, 5), []int32{0, 30 * 32, 77 * 32, 100 * 32, 100 * 32}},
		{"offsets k", part(r.offK, 5), []int32{0, 30 * 16, 77 * 16, 100 * 16, 100 * 16}},
		{"offsets v", part(r.offV, 5), []int32{0, 30 * 32, 77 * 32, 100 * 32, 100 * 32}},
		{"offsets o", part(r.offO, 5), []int32{0, 30 * 64, 77 * 64, 100 * 64, 100 * 64}},
	}
	for _, c := range checks {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
	rm := part(r.rowmap, 100)
	for i, v := range rm {
		s, j := 0, i
		switch {
		case i >= 77:
			s, j = 2, i-77
		case i >= 30:
			s, j = 1, i-30
		}
		if want := int32(s*4*64 + j); v != want {
			t.Fatalf("row map of query %d: %d, want %d", i, v, want)
		}
	}
	// queries no key is visible to map to −1
	sh2 := AttnShape{NQ: 50, NK: 100, Heads: 1, KVHeads: 1, HeadDim: 8, Causal: true, QPos: seqPos(100, 50), KPos: seqPos(0, 100),
		QStart: stubStarts(seqPos(100, 50), []int32{0, 40, 120}, 0)}
	b2, why := classifyCUDNN(sh2)
	if why != "" {
		t.Fatal(why)
	}
	r2, err := packRagged(b2, 50, 1, 8, 8, 8, 8)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range r2.data[r2.rowmap : r2.rowmap+50] {
		if (i < 20) != (v >= 0) {
			t.Errorf("query %d (position %d, document from 40 or 120): row map %d", i, 100+i, v)
		}
	}
	// offsets past int32
	big := cudnnBlock{b: 1, sq: 64, skv: 64, segs: []cudnnSeg{{q0: 1 << 20, nq: 1, k0: 0, nk: 1}}}
	if _, err := packRagged(big, 1<<20+1, 64, 64*128, 128, 128, 64*128); err == nil || !strings.Contains(err.Error(), "does not fit int32") {
		t.Errorf("offsets past int32: %v", err)
	}
}

// TestCUDAHostCUDNNDSplit checks the exactness claim of the backward (cuda_cudnn.go,
// df_cudnn_dsplit): with the kernel's split of D into three truncated 16-bit pieces and a
// power-of-two scale, rowsum(dO′ ∘ O′) summed in float32 in any order is D: every float32 D (subnormals
// included) in bf16, 2^−25 ≤ |D| < 2^31 in fp16.
func TestCUDAHostCUDNNDSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, fp16 := range []bool{false, true} {
		round, lo, hi, emin, emax := truncBF16, -149, 127, -126, 127
		if fp16 {
			round, lo, hi, emin, emax = truncFP16, -25, 30, -24, 15
		}
		for n := range 200000 {
			e := lo + rng.IntN(hi-lo)
			d := float32(math.Ldexp(1+rng.Float64(), e))
			if d == 0 || math.IsInf(float64(d), 0) {
				continue
			}
			if n%2 == 1 {
				d = -d
			}
			if n < 4 {
				d = []float32{0, 1, -1.5, math.SmallestNonzeroFloat32 * 1e6}[n] // the last a subnormal
				if fp16 && n == 3 {
					d = -0x1.fffffep-25 // the bottom of fp16's exact range, every bit set
				}
			}
			// the kernel's arithmetic (float32 throughout)
			exp := 0
			if d != 0 {
				_, exp = math.Frexp(float64(d))
				exp = max(emin, min(emax, exp))
			}
			x := float32(math.Ldexp(float64(d), -exp))
			p1 := round(x)
			r1 := x - p1
			p2 := round(r1)
			p3 := round(r1 - p2)
			if r1-p2 != p3 {
				t.Fatalf("fp16=%v: D = %g: the third piece %g is not the rest %g", fp16, d, p3, r1-p2)
			}
			s := round(float32(math.Ldexp(1, exp)))
			if float64(s) != math.Ldexp(1, exp) {
				t.Fatalf("fp16=%v: the scale 2^%d is not a 16-bit value", fp16, exp)
			}
			prods := []float32{p1 * s, p2 * s, p3 * s}
			for _, perm := range [][3]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}} {
				sum := float32(0)
				for _, k := range perm {
					sum += prods[k]
				}
				sum += 0 // the zero products of dO's columns with O′'s zeros
				if sum != d {
					t.Fatalf("fp16=%v: D = %g (%#x) split %g + %g + %g (scale %g) sums to %g in order %v", fp16, d, math.Float32bits(d),
						p1, p2, p3, s, sum, perm)
				}
			}
		}
	}
}

// truncBF16 and truncFP16 round x toward zero to bfloat16 and binary16 (for |x| < 65504), as
// CUDA's __float2bfloat16_rz and __float2half_rz do.
func truncBF16(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ 0xffff) }

func truncFP16(x float32) float32 {
	if math.Abs(float64(x)) >= 1.0/(1<<14) {
		return math.Float32frombits(math.Float32bits(x) &^ (1<<13 - 1))
	}
	return float32(math.Trunc(float64(x)*(1<<24)) / (1 << 24)) // subnormal: multiples of 2^−24
}

// TestCUDAHostCubins checks the embedded device code: every module has PTX of an ISA a CUDA
// 13.0 driver loads (≤ 9.0) for compute_80 and compute_90, and cubins for sm_80 and sm_90a
// (ELF for NVIDIA CUDA, the architecture in e_flags) that define every kernel the backend loads.
func TestCUDAHostCubins(t *testing.T) {
	version := regexp.MustCompile(`(?m)^\.version (\d+)\.(\d+)$`)
	for mod, names := range ptxKernels {
		for _, arch := range []string{"sm80", "sm90"} {
			ptx, err := cuda.PTX.ReadFile(mod + "_" + arch + ".ptx")
			if err != nil {
				t.Fatal(err)
			}
			m := version.FindSubmatch(ptx)
			if m == nil {
				t.Fatalf("%s_%s.ptx: no .version", mod, arch)
			}
			major, _ := strconv.Atoi(string(m[1]))
			minor, _ := strconv.Atoi(string(m[2]))
			if major*10+minor > 90 {
				t.Errorf("%s_%s.ptx: PTX ISA %d.%d, newer than a CUDA 13.0 driver (580) loads (9.0)", mod, arch, major, minor)
			}
		}
		for _, c := range []struct {
			arch string
			sm   uint32
		}{{"sm80", 80}, {"sm90a", 90}} {
			file := mod + "_" + c.arch + ".cubin"
			img, err := cuda.Cubins.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			f, err := elf.NewFile(bytes.NewReader(img))
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if f.Machine != elf.EM_CUDA {
				t.Errorf("%s: ELF machine %v, want EM_CUDA", file, f.Machine)
			}
			// e_flags: the SM in bits 8-15 (ELF ABI version 1) or 0-7 (earlier); sm_90a also
			// sets its architecture-specific bit
			flags := binary32(img[48:52])
			if sm := (flags >> 8) & 0xff; sm != c.sm && flags&0xff != c.sm {
				t.Errorf("%s: e_flags %#x does not name sm_%d", file, flags, c.sm)
			}
			syms, err := f.Symbols()
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			have := map[string]bool{}
			for _, s := range syms {
				have[s.Name] = true
			}
			for _, k := range names {
				if !have[k] {
					t.Errorf("%s: no kernel %s", file, k)
				}
			}
		}
	}
	for _, c := range []struct {
		major, minor int
		want         string
	}{{8, 0, "x_sm80.cubin"}, {8, 9, "x_sm80.cubin"}, {9, 0, "x_sm90a.cubin"}, {9, 1, ""}, {10, 0, ""}, {12, 0, ""}} {
		if got := cubinFile("x", c.major, c.minor); got != c.want {
			t.Errorf("cubinFile(x, %d, %d) = %q, want %q", c.major, c.minor, got, c.want)
		}
	}
}

func binary32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// TestCUDAHostCUDNNCandidates checks where LoadCUDNN looks for cuDNN: $DISTFLASH_LIBCUDNN alone;
// else the loader's path first, then the nvidia/cudnn/lib of python3's site-packages (a fake
// python3 on PATH here names a temporary site-packages holding one).
func TestCUDAHostCUDNNCandidates(t *testing.T) {
	t.Setenv("DISTFLASH_LIBCUDNN", "/x/libcudnn.so.9")
	if got := cuda.CUDNNCandidates(); !slices.Equal(got, []string{"/x/libcudnn.so.9"}) {
		t.Errorf("with DISTFLASH_LIBCUDNN: %v", got)
	}
	t.Setenv("DISTFLASH_LIBCUDNN", "")
	dir := t.TempDir()
	site := filepath.Join(dir, "site-packages")
	lib := filepath.Join(site, "nvidia", "cudnn", "lib", "libcudnn.so.9")
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho " + filepath.Join(dir, "elsewhere") + "\necho " + site + "\n"
	if err := os.WriteFile(filepath.Join(bin, "python3"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	got := cuda.CUDNNCandidates()
	if len(got) < 2 || got[0] != "libcudnn.so.9" || got[len(got)-1] != lib {
		t.Errorf("candidates %v: want libcudnn.so.9 first and %s last", got, lib)
	}
}

// TestCUDAHostCUDNNCheck checks SDPA.Check's version and hardware gates against
// cudnn-frontend's support surface, and DescribeSDPA's workspace tensors.
func TestCUDAHostCUDNNCheck(t *testing.T) {
	base := cuda.SDPA{IO: cuda.BFloat16, B: 1, H: 8, KVH: 8, SQ: 128, SKV: 128, D: 64, DV: 64, Scale: 0.125,
		Mask: cuda.Mask{Causal: true}, Version: 91002, SM: 90}
	cases := []struct {
		name string
		edit func(*cuda.SDPA)
		want string // "" : accepted
	}{
		{"causal", func(*cuda.SDPA) {}, ""},
		{"fp32", func(s *cuda.SDPA) { s.IO = cuda.Float32 }, "bf16/fp16"},
		{"9.10.0", func(s *cuda.SDPA) { s.Version = 91000 }, "known SDPA bugs"},
		{"8.9", func(s *cuda.SDPA) { s.Version = 80907 }, "older than 9.0.0"},
		{"head dim 60", func(s *cuda.SDPA) { s.D, s.DV = 60, 60 }, "multiples of 8"},
		{"hd 136 on A100 with 9.5", func(s *cuda.SDPA) { s.SM, s.Version, s.DV = 80, 90501, 136 }, "> 128 on sm_80"},
		{"hd 136 on H100 with 9.5", func(s *cuda.SDPA) { s.Version, s.DV = 90501, 136 }, ""},
		{"V100", func(s *cuda.SDPA) { s.SM = 70 }, "needs 8.0"},
		{"bottom-right 100 rows on 9.5", func(s *cuda.SDPA) { s.Version, s.SQ, s.Mask.BottomRight = 90501, 100, true }, "multiples of 64"},
		{"bottom-right more queries than keys", func(s *cuda.SDPA) { s.SQ, s.SKV, s.Mask.BottomRight = 128, 64, true }, "query rows >"},
		{"window on 9.1", func(s *cuda.SDPA) { s.Version, s.Mask.Left = 90100, 32 }, "≥ 9.2"},
		{"shift on 9.5", func(s *cuda.SDPA) { s.Version, s.Mask.Shift = 90501, 3 }, "shifted diagonal"},
		{"ragged on A100 with 9.10", func(s *cuda.SDPA) { s.SM, s.Ragged = 80, true }, "ragged offsets on sm_80"},
		{"ragged on A100 with 9.18.1", func(s *cuda.SDPA) { s.SM, s.Version, s.Ragged = 80, 91801, true }, ""},
		{"ragged GQA on 9.5", func(s *cuda.SDPA) { s.Version, s.KVH, s.Ragged = 90501, 2, true }, "grouped-query"},
		{"backward 1×1", func(s *cuda.SDPA) { s.Backward, s.SQ, s.SKV = true, 1, 1 }, "s_q = s_kv = 1"},
	}
	for _, c := range cases {
		s := base
		c.edit(&s)
		err := s.Check()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: Check() = %v, want %q", c.name, err, c.want)
		}
	}
	// the backward's workspace tensors: softmax_sum always, the float dQ accumulator without
	// determinism (zeroed by the caller before cuDNN 9.6)
	for _, c := range []struct {
		det       bool
		version   int
		want      []int64
		zeroAccum bool
	}{{true, 91002, []int64{cuda.UIDSoftmaxSum}, false}, {false, 91002, []int64{cuda.UIDSoftmaxSum, cuda.UIDdQAccum}, false},
		{false, 90501, []int64{cuda.UIDSoftmaxSum, cuda.UIDdQAccum}, true}} {
		s := base
		s.Backward, s.DV, s.Deterministic, s.Version = true, 72, c.det, c.version
		g, lay := cuda.DescribeSDPA(s)
		if g.Err() != nil {
			t.Fatal(g.Err())
		}
		var got []int64
		for _, x := range lay.Extra {
			got = append(got, x.UID)
			if x.UID == cuda.UIDdQAccum && x.Zero != c.zeroAccum {
				t.Errorf("deterministic %v, cuDNN %d: dQ accumulator zeroed %v", c.det, c.version, x.Zero)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("deterministic %v: workspace tensors %v, want %v", c.det, got, c.want)
		}
	}
}
