package kernels

import (
	"encoding/json"
	"math"
	"path/filepath"
	"testing"

	"distflash/weights/safetensors"
)

// TestAttnGolden checks the attention primitive against PyTorch's autograd on the vectors of
// scripts/reference.py (testdata/attn: contiguous, zig-zag and cyclic positions, MHA, GQA,
// 33 heads, a non-causal cross block). The keys are folded in two blocks and merged, so the
// merge is checked too. Reference values are fp64; bounds as in attn_test.go.
func TestAttnGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/attn/*.safetensors")
	if err != nil || len(files) < 4 {
		t.Fatalf("want 4 attention vectors in testdata/attn, found %d (%v)", len(files), err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			st, err := safetensors.Read(path)
			if err != nil {
				t.Fatal(err)
			}
			var c struct {
				Heads   int  `json:"n_heads"`
				KVHeads int  `json:"n_kv_heads"`
				HeadDim int  `json:"head_dim"`
				Causal  bool `json:"causal"`
			}
			if err := json.Unmarshal([]byte(st.Metadata["config"]), &c); err != nil {
				t.Fatal(err)
			}
			get := func(name string) []float32 {
				x, _, err := st.Float32(name)
				if err != nil {
					t.Fatal(err)
				}
				return x
			}
			geti := func(name string) []int32 {
				x, _, err := st.Int32(name)
				if err != nil {
					t.Fatal(err)
				}
				return x
			}
			be := NewCPU()
			up := func(x []float32) Buf { b := be.Alloc(len(x)); be.Upload(b, x); return b }
			q, k, v, do := up(get("q")), up(get("k")), up(get("v")), up(get("do"))
			qpos, kpos := geti("q_pos"), geti("k_pos")
			nq, nk := len(qpos), len(kpos)
			H, K, hd := c.Heads, c.KVHeads, c.HeadDim
			sh := AttnShape{NQ: nq, NK: nk, Heads: H, KVHeads: K, HeadDim: hd, Causal: c.Causal,
				Scale: float32(1 / math.Sqrt(float64(hd))), QPos: qpos, KPos: kpos}
			// two key blocks: [0, half) into a, [half, nk) into b, then merge
			half := nk / 2
			part := func(lo, hi int) (Buf, Buf, AttnShape) {
				s := sh
				s.NK, s.KPos = hi-lo, kpos[lo:hi]
				return be.Slice(k, lo*K*hd, (hi-lo)*K*hd), be.Slice(v, lo*K*hd, (hi-lo)*K*hd), s
			}
			a := AttnState{O: be.Alloc(nq * H * hd), M: be.Alloc(H * nq), L: be.Alloc(H * nq)}
			b := AttnState{O: be.Alloc(nq * H * hd), M: be.Alloc(H * nq), L: be.Alloc(H * nq)}
			be.AttnInit(a)
			be.AttnInit(b)
			k1, v1, s1 := part(0, half)
			k2, v2, s2 := part(half, nk)
			be.AttnForward(b, q, k2, v2, s2)
			be.AttnForward(a, q, k1, v1, s1)
			be.AttnMerge(a, b, nq, H, hd)
			o, lse := be.Alloc(nq*H*hd), be.Alloc(H*nq)
			be.AttnFinish(o, lse, a, nq, H, hd)
			D := be.Alloc(H * nq)
			be.AttnBackwardPrep(D, o, do, nq, H, hd, FP32)
			dq, dk, dv := be.Alloc(nq*H*hd), be.Alloc(nk*K*hd), be.Alloc(nk*K*hd)
			for _, p := range [][2]int{{0, half}, {half, nk}} {
				kb, vb, s := part(p[0], p[1])
				be.AttnBackward(dq, be.Slice(dk, p[0]*K*hd, (p[1]-p[0])*K*hd), be.Slice(dv, p[0]*K*hd, (p[1]-p[0])*K*hd),
					q, kb, vb, o, do, lse, D, s)
			}
			for _, c := range []struct {
				name string
				got  Buf
				tol  float64
			}{{"o", o, 2e-6}, {"lse", lse, 2e-6}, {"dq", dq, 1e-5}, {"dk", dk, 1e-5}, {"dv", dv, 1e-5}} {
				want := get(c.name)
				w64 := make([]float64, len(want))
				for i, x := range want {
					w64[i] = float64(x)
				}
				if e := maxRelErr(Host(c.got), w64); e > c.tol {
					t.Errorf("%s: rel err %.3g > %g", c.name, e, c.tol)
				} else {
					t.Logf("%s: rel err %.2e", c.name, e)
				}
			}
		})
	}
}
