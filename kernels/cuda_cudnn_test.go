//go:build cuda

package kernels

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	// every array at a 16-byte boundary of the upload (B = 4: seq_len 4 values, offsets 5)
	for _, at := range []struct {
		name string
		off  int
	}{{"seq_len_q", r.seqQ}, {"seq_len_kv", r.seqKV}, {"offsets q", r.offQ}, {"offsets k", r.offK}, {"offsets v", r.offV},
		{"offsets o", r.offO}, {"row map", r.rowmap}} {
		if at.off%4 != 0 {
			t.Errorf("%s at value %d of the upload: not on a 16-byte boundary", at.name, at.off)
		}
	}
	if r.offK-r.offQ != 8 {
		t.Errorf("offsets q at %d, k at %d: want the 5 values of q padded to 8", r.offQ, r.offK)
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

// TestCUDAHostNVRTCCandidates checks where LoadCUDNN looks for the NVRTC of cuDNN's CUDA
// major: $DISTFLASH_LIBNVRTC alone; else the wheels' folders beside the cuDNN it loaded
// (nvidia/cuda_nvrtc/lib; nvidia/cu13/lib for CUDA 13), the soname on the loader's path, the
// folders of $LD_LIBRARY_PATH that hold it, then python3's site-packages.
func TestCUDAHostNVRTCCandidates(t *testing.T) {
	t.Setenv("DISTFLASH_LIBNVRTC", "/x/libnvrtc.so.13")
	if got := cuda.NVRTCCandidates("/y/libcudnn.so.9", 13); !slices.Equal(got, []string{"/x/libnvrtc.so.13"}) {
		t.Errorf("with DISTFLASH_LIBNVRTC: %v", got)
	}
	t.Setenv("DISTFLASH_LIBNVRTC", "")
	dir := t.TempDir()
	touch := func(f string) string {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	site := filepath.Join(dir, "site-packages")
	cudnn := touch(filepath.Join(site, "nvidia", "cudnn", "lib", "libcudnn.so.9"))
	wheel12 := touch(filepath.Join(site, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12"))
	wheel13 := touch(filepath.Join(site, "nvidia", "cu13", "lib", "libnvrtc.so.13"))
	ld := touch(filepath.Join(dir, "ld", "libnvrtc.so.13"))
	other := filepath.Join(dir, "other-site")
	py := touch(filepath.Join(other, "nvidia", "cu13", "lib", "libnvrtc.so.13"))
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "python3"), []byte("#!/bin/sh\necho "+other+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	t.Setenv("LD_LIBRARY_PATH", filepath.Dir(ld))
	got := cuda.NVRTCCandidates(cudnn, 13)
	if len(got) < 4 || got[0] != wheel13 || got[1] != "libnvrtc.so.13" || got[2] != ld || got[len(got)-1] != py {
		t.Errorf("CUDA 13: %v: want %s, libnvrtc.so.13, %s, …, %s", got, wheel13, ld, py)
	}
	got = cuda.NVRTCCandidates(cudnn, 12)
	if len(got) < 2 || got[0] != wheel12 || got[1] != "libnvrtc.so.12" || slices.Contains(got, wheel13) {
		t.Errorf("CUDA 12: %v: want %s, libnvrtc.so.12 and no CUDA 13 library", got, wheel12)
	}
}

// TestCUDAHostCUDNNCheck checks SDPA.Check's support table one rule at a time: for each rule a
// graph it refuses (with that rule's reason: no earlier rule takes it) and the nearest graph
// it accepts; then that docs/gpu.md writes out every rule, and DescribeSDPA's workspace
// tensors.
func TestCUDAHostCUDNNCheck(t *testing.T) {
	base := cuda.SDPA{IO: cuda.BFloat16, B: 1, H: 8, KVH: 8, SQ: 128, SKV: 128, D: 64, Scale: 0.125,
		Mask: cuda.Mask{Causal: true}, Version: 91002, SM: 90}
	type edit func(*cuda.SDPA)
	cases := []struct {
		rule     string // the start of the rule's Line
		refused  edit
		accepted edit
	}{
		{"cuDNN older than 9.0.0", func(s *cuda.SDPA) { s.Version = 80907 }, func(s *cuda.SDPA) { s.Version = 90000 }},
		{"cuDNN 9.10.0 and 9.10.1", func(s *cuda.SDPA) { s.Version = 91001 }, func(s *cuda.SDPA) { s.Version = 91002 }},
		{"operands not bf16 or fp16", func(s *cuda.SDPA) { s.IO = cuda.Float32 }, func(s *cuda.SDPA) { s.IO = cuda.Half }},
		{"query heads not a multiple", func(s *cuda.SDPA) { s.KVH = 3 }, func(s *cuda.SDPA) { s.KVH = 2 }},
		{"head dimension not a multiple of 8", func(s *cuda.SDPA) { s.D = 60 }, func(s *cuda.SDPA) { s.D = 56 }},
		{"head dimension above 256", func(s *cuda.SDPA) { s.D = 264 }, func(s *cuda.SDPA) { s.D = 256 }},
		{"GPU older than sm_80", func(s *cuda.SDPA) { s.SM = 75 }, func(s *cuda.SDPA) { s.SM = 80 }},
		{"sm_8x backward, head dimension above 128", func(s *cuda.SDPA) { s.SM, s.Backward, s.D, s.Version = 80, true, 136, 92600 },
			func(s *cuda.SDPA) { s.SM, s.Backward, s.D, s.Version = 80, true, 128, 92600 }},
		{"sm_8x forward, head dimension above 128", func(s *cuda.SDPA) { s.SM, s.D, s.Version = 86, 256, 90900 },
			func(s *cuda.SDPA) { s.SM, s.D, s.Version = 86, 256, 91002 }},
		{"sm_90 forward, head dimension above 128", func(s *cuda.SDPA) { s.D, s.Version = 192, 90000 },
			func(s *cuda.SDPA) { s.D, s.Version = 192, 90100 }},
		{"sm_90 backward, head dimension above 128", func(s *cuda.SDPA) { s.Backward, s.D, s.Version = true, 256, 90401 },
			func(s *cuda.SDPA) { s.Backward, s.D, s.Version = true, 256, 90500 }},
		{"sm_100 and later, head dimension above 128", func(s *cuda.SDPA) { s.SM, s.D, s.Backward = 100, 192, true },
			func(s *cuda.SDPA) { s.SM, s.D = 100, 192 }},
		{"backward with s_q = s_kv = 1", func(s *cuda.SDPA) { s.SM, s.Backward, s.SQ, s.SKV = 80, true, 1, 1 },
			func(s *cuda.SDPA) { s.SM, s.Backward, s.SQ, s.SKV = 80, true, 1, 128 }},
		{"sm_90 backward with s_q = 1", func(s *cuda.SDPA) { s.Backward, s.SQ, s.Mask = true, 1, cuda.Mask{} },
			func(s *cuda.SDPA) { s.Backward, s.SQ, s.Mask = true, 64, cuda.Mask{} }},
		{"sm_90 backward with s_kv % 128 = 64", func(s *cuda.SDPA) { s.Backward, s.SKV, s.Mask = true, 192, cuda.Mask{} },
			func(s *cuda.SDPA) { s.Backward, s.SKV, s.Mask, s.Version = true, 192, cuda.Mask{}, 92600 }},
		{"a negative diagonal shift", func(s *cuda.SDPA) { s.Mask.Shift = -1 }, func(s *cuda.SDPA) { s.Mask.Shift = 0 }},
		{"bottom-right without the padding mask, s_q > s_kv", func(s *cuda.SDPA) { s.SQ, s.SKV, s.Mask.BottomRight = 128, 64, true },
			func(s *cuda.SDPA) { s.SQ, s.SKV, s.Mask.BottomRight = 64, 128, true }},
		{"bottom-right without the padding mask: cuDNN ≥ 9.3", func(s *cuda.SDPA) { s.Version, s.Mask.BottomRight = 90201, true },
			func(s *cuda.SDPA) { s.Version, s.Mask.BottomRight = 90300, true }},
		{"bottom-right with s_q or s_kv not a multiple of 64", func(s *cuda.SDPA) { s.Version, s.SQ, s.Mask.BottomRight = 90501, 100, true },
			func(s *cuda.SDPA) { s.Version, s.SQ, s.Mask.BottomRight = 90600, 100, true }},
		{"shifted diagonal: cuDNN ≥ 9.6", func(s *cuda.SDPA) { s.Version, s.Mask.Shift = 90501, 3 },
			func(s *cuda.SDPA) { s.Version, s.Mask.Shift = 90600, 3 }},
		{"shifted diagonal with s_q > s_kv", func(s *cuda.SDPA) { s.SQ, s.SKV, s.Mask.Shift = 128, 64, 3 },
			func(s *cuda.SDPA) { s.SQ, s.SKV, s.Mask.Shift = 64, 64, 3 }},
		{"sliding window (left bound): cuDNN ≥ 9.2", func(s *cuda.SDPA) { s.Version, s.Mask.Left = 90100, 32 },
			func(s *cuda.SDPA) { s.Version, s.Mask.Left = 90200, 32 }},
		{"left bound without a right bound: cuDNN ≥ 9.10.2", func(s *cuda.SDPA) { s.Version, s.Mask = 90900, cuda.Mask{Left: 32} },
			func(s *cuda.SDPA) { s.Version, s.Mask = 91002, cuda.Mask{Left: 32} }},
		{"cuDNN 9.14.0, left bound without a right bound", func(s *cuda.SDPA) { s.Version, s.SQ, s.SKV, s.Mask = 91400, 2048, 2048, cuda.Mask{Left: 32} },
			func(s *cuda.SDPA) { s.Version, s.SQ, s.SKV, s.Mask = 91400, 1024, 1024, cuda.Mask{Left: 32} }},
		{"sliding window without the padding mask, s_q > s_kv", func(s *cuda.SDPA) { s.SQ, s.SKV, s.Mask.Left = 128, 64, 32 },
			func(s *cuda.SDPA) { s.SQ, s.SKV, s.Mask.Left = 64, 128, 32 }},
		{"bottom-right sliding window with s_q ≠ s_kv", func(s *cuda.SDPA) {
			s.Version, s.SQ, s.Mask = 90501, 64, cuda.Mask{Causal: true, BottomRight: true, Left: 16}
		}, func(s *cuda.SDPA) {
			s.Version, s.SQ, s.Mask = 90600, 64, cuda.Mask{Causal: true, BottomRight: true, Left: 16}
		}},
		{"sm_90, bottom-right sliding window with s_q = s_kv", func(s *cuda.SDPA) {
			s.Version, s.Mask = 90900, cuda.Mask{Causal: true, BottomRight: true, Left: 16}
		}, func(s *cuda.SDPA) {
			s.Version, s.SM, s.Mask = 90900, 80, cuda.Mask{Causal: true, BottomRight: true, Left: 16}
		}},
		{"ragged offsets (packed documents): cuDNN ≥ 9.1", func(s *cuda.SDPA) { s.Version, s.Ragged = 90002, true },
			func(s *cuda.SDPA) { s.Version, s.Ragged = 90100, true }},
		{"ragged offsets on sm_8x", func(s *cuda.SDPA) { s.SM, s.Ragged = 80, true },
			func(s *cuda.SDPA) { s.SM, s.Version, s.Ragged = 80, 91801, true }},
		{"ragged offsets with grouped-query attention", func(s *cuda.SDPA) { s.Version, s.KVH, s.Ragged = 90501, 2, true },
			func(s *cuda.SDPA) { s.Version, s.KVH, s.Ragged = 90600, 2, true }},
		{"ragged offsets with bottom-right", func(s *cuda.SDPA) { s.Version, s.Ragged, s.Mask.BottomRight = 90501, true, true },
			func(s *cuda.SDPA) { s.Version, s.Ragged, s.Mask.BottomRight = 90600, true, true }},
		{"ragged, bottom-right, s_q or s_kv not a multiple of 64", func(s *cuda.SDPA) {
			s.Version, s.SQ, s.Ragged, s.Mask.BottomRight = 90600, 100, true, true
		}, func(s *cuda.SDPA) { s.Version, s.SQ, s.Ragged, s.Mask.BottomRight = 90700, 100, true, true }},
		{"ragged offsets with a sliding window", func(s *cuda.SDPA) { s.Version, s.Ragged, s.Mask.Left = 90501, true, 16 },
			func(s *cuda.SDPA) { s.Version, s.Ragged, s.Mask.Left = 90600, true, 16 }},
		{"sm_90 ragged backward", func(s *cuda.SDPA) { s.Backward, s.Ragged, s.Version = true, true, 91700 },
			func(s *cuda.SDPA) { s.Backward, s.Ragged, s.Version = true, true, 91800 }},
		{"deterministic backward on sm_100", func(s *cuda.SDPA) { s.SM, s.Backward, s.Deterministic, s.Version = 100, true, true, 92600 },
			func(s *cuda.SDPA) { s.SM, s.Backward, s.Version = 100, true, 92600 }},
		{"deterministic ragged backward on sm_8x", func(s *cuda.SDPA) {
			s.SM, s.Backward, s.Deterministic, s.Ragged, s.Version = 80, true, true, true, 92600
		}, func(s *cuda.SDPA) { s.SM, s.Backward, s.Ragged, s.Version = 80, true, true, 92600 }},
	}
	if len(cases) != len(cuda.SupportRules) {
		t.Errorf("%d cases for %d rules: every rule needs its row", len(cases), len(cuda.SupportRules))
	}
	for i, c := range cases {
		if i >= len(cuda.SupportRules) || !strings.HasPrefix(cuda.SupportRules[i].Line, c.rule) {
			t.Errorf("case %d (%q) is not rule %d", i, c.rule, i)
			continue
		}
		// the reason the rule alone gives: the case refused, and only by this rule
		s := base
		c.refused(&s)
		err := s.Check()
		only := cuda.SupportRules[i]
		if err == nil {
			t.Errorf("%s: %+v accepted", c.rule, s)
		} else if want := only.Refuses(s); want == "" || err.Error() != want {
			t.Errorf("%s: Check() = %v, want this rule's %q", c.rule, err, want)
		}
		a := base
		c.accepted(&a)
		if err := a.Check(); err != nil {
			t.Errorf("%s: the neighbouring %+v refused: %v", c.rule, a, err)
		}
	}
	// docs/gpu.md's table has every rule, as its Line says it
	doc, err := os.ReadFile(filepath.Join("..", "docs", "gpu.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range cuda.SupportRules {
		if !strings.Contains(string(doc), "| "+r.Line+" |") {
			t.Errorf("docs/gpu.md has no row %q", "| "+r.Line+" |")
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
		s.Backward, s.Deterministic, s.Version = true, c.det, c.version
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
		// one head dimension everywhere, and an axis on GEN_INDEX only
		for _, op := range g.Ops {
			if (op.Mode == "GEN_INDEX") != (op.Axis >= 0) {
				t.Errorf("%s %s (%s) has axis %d", op.Kind, op.Name, op.Mode, op.Axis)
			}
		}
	}
}

const cudnnWheelChildEnv = "DISTFLASH_CUDNN_WHEEL_CHILD"

// TestCUDAHostCUDNNWheel loads NVIDIA's own cuDNN and NVRTC, from the pip wheels of the
// PyTorch environment CI installs (scripts/install_torch.sh: nvidia-cudnn and the CUDA runtime
// wheels), without a GPU: LoadCUDNN opens the real libcudnn.so.9, asks it which CUDA it was built
// for, and must find and load that CUDA's libnvrtc and libnvrtc-builtins in the wheel's folder
// beside cuDNN's, as a process that has only the wheels has them (no python3, no
// LD_LIBRARY_PATH). Then the same libcudnn.so.9 linked where no NVRTC is beside it: LoadCUDNN
// must refuse it, naming what it tried, rather than let every plan fail later; and copied
// alone, without its sub-libraries: refused too, where its first call would abort the process. (The driver's
// one call it resolves, cuCtxSetCurrent, comes from the stub: no handle is made.) Each load is a
// child process (a process loads cuDNN once).
func TestCUDAHostCUDNNWheel(t *testing.T) {
	if f := os.Getenv(cudnnWheelChildEnv); f != "" {
		v, file, err := cuda.LoadCUDNN()
		n := cuda.LoadedNVRTC()
		fmt.Printf("cuDNN %s (%s) for CUDA %d; NVRTC %+v; error %v\n", cuda.CUDNNVersionString(v), file, cuda.CUDACompiledFor(), n, err)
		switch f {
		case "alone":
			if err == nil || !strings.Contains(err.Error(), "was found, but not the NVRTC it compiles its fused attention kernels with") {
				t.Errorf("cuDNN without NVRTC beside it: %v", err)
			}
			return
		case "no-graph":
			if err == nil || !strings.Contains(err.Error(), "sub-library libcudnn_graph.so.9 is neither beside it nor on the loader's path") {
				t.Errorf("libcudnn.so.9 without its sub-libraries: %v", err)
			}
			return
		}
		dir := filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(file))), fmt.Sprintf("cu%d", cuda.CUDACompiledFor()), "lib")
		if cuda.CUDACompiledFor() < 13 {
			dir = filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(file))), "cuda_nvrtc", "lib")
		}
		if err != nil || v < cuda.MinCUDNN || n.Major != cuda.CUDACompiledFor() || filepath.Dir(n.File) != dir ||
			filepath.Dir(n.Builtins) != dir {
			t.Errorf("the wheels' cuDNN and NVRTC: version %d, %v; NVRTC %+v, want CUDA %d's from %s", v, err, n, cuda.CUDACompiledFor(), dir)
		}
		return
	}
	py := os.Getenv("DISTFLASH_TORCH_PYTHON")
	if py == "" {
		if c, err := os.UserCacheDir(); err == nil {
			py = filepath.Join(c, "distflash", "torch", "bin", "python")
		}
	}
	out, err := exec.Command(py, "-c", "import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))").Output()
	if err != nil {
		msg := fmt.Sprintf("no Python with NVIDIA's wheels (%s: %v): scripts/install_torch.sh installs them", py, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cudnn := filepath.Join(strings.TrimSpace(string(out)), "nvidia", "cudnn", "lib", "libcudnn.so.9")
	stub := buildCUDNNStub(t)
	// libcudnn.so.9 with its sub-libraries (it resolves every call in them through its run
	// path, $ORIGIN: without libcudnn_graph.so.9 beside it, cudnnGetVersion aborts the process)
	// but without the NVRTC wheel's folder beside its own
	alone := filepath.Join(t.TempDir(), "lib", "libcudnn.so.9")
	if err := os.MkdirAll(filepath.Dir(alone), 0o755); err != nil {
		t.Fatal(err)
	}
	libs, err := filepath.Glob(filepath.Join(filepath.Dir(cudnn), "libcudnn*.so*"))
	if err != nil || len(libs) == 0 {
		t.Fatalf("no libcudnn*.so* beside %s (%v)", cudnn, err)
	}
	for _, l := range libs {
		if err := os.Symlink(l, filepath.Join(filepath.Dir(alone), filepath.Base(l))); err != nil {
			t.Fatal(err)
		}
	}
	// and a copy without them: refused before its first call aborts the process
	lone := filepath.Join(t.TempDir(), "libcudnn.so.9")
	b, err := os.ReadFile(cudnn)
	if err == nil {
		err = os.WriteFile(lone, b, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, lib string }{{"wheel", cudnn}, {"alone", alone}, {"no-graph", lone}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCUDAHostCUDNNWheel$", "-test.v")
		cmd.Env = append(os.Environ(), cudnnWheelChildEnv+"="+c.name, "DISTFLASH_LIBCUDNN="+c.lib, "DISTFLASH_LIBCUDA="+stub,
			"DISTFLASH_LIBNVRTC=", "PATH="+t.TempDir(), "LD_LIBRARY_PATH=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%s: %v\n%s", c.name, err, out)
		} else {
			t.Logf("%s: %s", c.name, firstLine(string(out), "cuDNN "))
		}
	}
}

// firstLine is the first line of s that contains sub.
func firstLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
