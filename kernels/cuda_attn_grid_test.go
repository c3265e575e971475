//go:build cuda

package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"

	"distflash/kernels/cuda"
)

// GPUs of the dK/dV plan's tests: SMs and the shared memory a block may opt in to.
var (
	h100 = deviceInfo{name: "H100", major: 9, sms: 132, smemOptin: 232448}
	a100 = deviceInfo{name: "A100", major: 8, sms: 108, smemOptin: 166912}
)

// TestCUDAHostDKDVPlan checks the grid of the tensor-core dK/dV kernel (planDKDV) at the
// 0.85B model's attention (configs/llama-1b.toml: 16 heads, 4 kv heads, head dimension 128)
// and at MHA: the rule (the least split that fills dkdvWaves waves of the GPU's resident
// blocks, at most dkdvMaxSplit and the iterations of a block; 1 when the key tiles alone fill
// them) gives the block counts below, every grid fills at least 4 waves unless a cap holds the
// split, and the partials stay under the bound planDKDV states at every length.
func TestCUDAHostDKDVPlan(t *testing.T) {
	for _, c := range []struct {
		name               string
		dev                deviceInfo
		n, heads, kv, hd   int
		old, split, blocks int
	}{
		// the 0.85B at 8K: 128 key tiles × 4 kv heads were 512 blocks, 1.9 waves of 264
		{"llama-1b 8K", h100, 8192, 16, 4, 128, 512, 3, 1536},
		{"llama-1b 8K A100", a100, 8192, 16, 4, 128, 512, 2, 1024},
		{"llama-1b 32K", h100, 32768, 16, 4, 128, 2048, 1, 2048},
		{"llama-1b 64K", h100, 65536, 16, 4, 128, 4096, 1, 4096},
		{"llama-1b 2K (a context-parallel block)", h100, 2048, 16, 4, 128, 128, 9, 1152},
		{"MHA 8K", h100, 8192, 16, 16, 128, 2048, 1, 2048},
		{"MHA 64K", h100, 65536, 16, 16, 128, 16384, 1, 16384},
		{"MHA 1K", h100, 1024, 16, 16, 128, 256, 5, 1280},
		{"hd 64 GQA 8K", h100, 8192, 32, 8, 64, 1024, 2, 2048},
		{"one query tile, no group", h100, 30, 2, 2, 64, 2, 1, 2},
	} {
		g := planDKDV(c.n, c.n, c.heads, c.kv, c.hd, c.dev.sms, c.dev.smemOptin, 0)
		if old := ceilDiv(c.n, attnT64) * c.kv; old != c.old || g.split != c.split || g.blocks != c.blocks || g.tiles*c.kv*g.split != g.blocks {
			t.Errorf("%s: %+v (unsplit %d blocks), want split %d, %d blocks (unsplit %d)", c.name, g, old, c.split, c.blocks, c.old)
		}
		nit := c.heads / c.kv * ceilDiv(c.n, attnT32)
		if g.waves() < dkdvWaves && g.split != dkdvMaxSplit && g.split != nit {
			t.Errorf("%s: %d blocks are %.2f waves of %d resident, want ≥ %d", c.name, g.blocks, g.waves(), g.slots, dkdvWaves)
		}
		t.Logf("%s on %s: %d blocks (%.2f waves of %d resident blocks) → split %d, %d blocks (%.2f waves), partials %.1f MB",
			c.name, c.dev.name, c.old, float64(c.old)/float64(g.slots), g.slots, g.split, g.blocks, g.waves(),
			float64(4*g.partFloats(c.n, c.kv, c.hd))/1e6)
	}
	// The rule over lengths, head shapes and GPUs.
	for _, dev := range []deviceInfo{h100, a100} {
		for _, hd := range mmaHeadDims {
			for _, hk := range [][2]int{{16, 4}, {16, 16}, {32, 8}, {33, 3}, {8, 1}} {
				for n := 1; n <= 1<<17; n = n*2 + 37 {
					g := planDKDV(n, n, hk[0], hk[1], hd, dev.sms, dev.smemOptin, 0)
					target := dkdvWaves * g.slots
					nit := hk[0] / hk[1] * ceilDiv(n, attnT32)
					what := fmt.Sprintf("%s hd %d H %d KV %d n %d: %+v", dev.name, hd, hk[0], hk[1], n, g)
					switch base := g.tiles * hk[1]; {
					case base >= target && g.split != 1:
						t.Errorf("%s: split although %d blocks fill %d", what, base, target)
					case g.split > 1 && (g.split-1)*base >= target:
						t.Errorf("%s: a smaller split fills %d", what, target)
					case g.split < 1 || g.split > dkdvMaxSplit || g.split > nit:
						t.Errorf("%s: split outside [1, min(%d, %d)]", what, dkdvMaxSplit, nit)
					case g.blocks < target && g.split != dkdvMaxSplit && g.split != nit && base < target:
						t.Errorf("%s: %d blocks, under %d", what, g.blocks, target)
					}
					if bound := target * attnT64 * hd * 8; 4*g.partFloats(n, hk[1], hd) >= bound {
						t.Errorf("%s: partials of %d bytes, over the bound %d", what, 4*g.partFloats(n, hk[1], hd), bound)
					}
				}
			}
		}
	}
	if g := planDKDV(8192, 8192, 16, 4, 128, 132, 232448, 7); g.split != 7 || g.blocks != 128*4*7 {
		t.Errorf("forced split 7: %+v", g)
	}
}

// TestCUDAHostDKDVResident holds the register counts the dK/dV plan assumes to the image's
// PTXAS.md (the most of bf16/fp16 and sm_80/sm_90a per head dimension) and checks the blocks an
// H100 and an A100 SM hold: 2 at head dimension 128 (240 registers × 128 threads), 3 at 64,
// 4 at 32.
func TestCUDAHostDKDVResident(t *testing.T) {
	table, err := cuda.Image.ReadFile(cuda.ImageDir + "/PTXAS.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^\| df_attn_bwd_dkdv_(?:bf16|f16)_hd(\d+) \| (\d+) \|[^|]*\|[^|]*\|[^|]*\| (\d+) \|`)
	most := map[int]int{}
	for _, m := range row.FindAllStringSubmatch(string(table), -1) {
		hd, _ := strconv.Atoi(m[1])
		r80, _ := strconv.Atoi(m[2])
		r90, _ := strconv.Atoi(m[3])
		most[hd] = max(most[hd], r80, r90)
	}
	if len(most) != len(mmaHeadDims) {
		t.Fatalf("PTXAS.md: dK/dV kernels of head dimensions %v, want %v", most, mmaHeadDims)
	}
	for hd, regs := range most {
		if mmaDKDVRegisters[hd] != regs {
			t.Errorf("hd %d: the plan assumes %d registers, PTXAS.md says %d", hd, mmaDKDVRegisters[hd], regs)
		}
	}
	for _, c := range []struct{ hd, want int }{{128, 2}, {64, 3}, {32, 4}} {
		for _, dev := range []deviceInfo{h100, a100} {
			if got := dkdvResident(c.hd, planAttn(c.hd, precBF16).smemDKDV, dev.smemOptin); got != c.want {
				t.Errorf("hd %d on %s: %d resident blocks, want %d", c.hd, dev.name, got, c.want)
			}
		}
	}
}

// TestCUDAHostDKDVLaunch drives the tensor-core backward on the fake device (an H100's 132
// SMs) at the 0.85B's attention and at MHA, 8K and 64K, operands packed in bf16 as the
// 16-bit step passes them: the dK/dV kernel is launched on planDKDV's 1-D grid with a
// partials buffer that holds split−1 shares of dK and dV (null without a split), every buffer
// it and the reduction are given lies inside an allocation of the size they address, and the
// reduction runs exactly when the grid is split.
func TestCUDAHostDKDVLaunch(t *testing.T) {
	c, f := newFakeCUDA(t)
	c.setPrecision(precBF16)
	defer c.setPrecision(precFP32)
	for _, tc := range []struct {
		name                string
		n, heads, kv        int
		docs                bool
		wantSplit, wantGrid int
	}{
		{"llama-1b 8K", 8192, 16, 4, false, 3, 1536},
		{"llama-1b 8K, documents", 8192, 16, 4, true, 3, 1536},
		{"llama-1b 64K", 65536, 16, 4, false, 1, 4096},
		{"MHA 8K", 8192, 16, 16, false, 1, 2048},
		{"MHA 64K", 65536, 16, 16, false, 1, 16384},
	} {
		const hd = 128
		n, H, K := tc.n, tc.heads, tc.kv
		sh := AttnShape{NQ: n, NK: n, Heads: H, KVHeads: K, HeadDim: hd, Causal: true, Scale: 0.088, QPos: seqPos(0, n),
			KPos: seqPos(0, n), Operands: BF16}
		if tc.docs {
			sh.QStart = make([]int32, n)
			for i := range sh.QStart {
				sh.QStart[i] = int32(i / 1000 * 1000)
			}
		}
		q, k, v, do := c.Alloc(sh.OperandLen(n*H*hd)), c.Alloc(sh.OperandLen(n*K*hd)), c.Alloc(sh.OperandLen(n*K*hd)), c.Alloc(sh.OperandLen(n*H*hd))
		dq, dk, dv, lse, d := c.Alloc(n*H*hd), c.Alloc(n*K*hd), c.Alloc(n*K*hd), c.Alloc(H*n), c.Alloc(H*n)
		n0 := len(f.launches)
		c.AttnBackward(dq, dk, dv, q, k, v, nil, do, lse, d, sh)
		want := []string{"df_attn_bwd_dq_bf16_hd128", "df_attn_bwd_dkdv_bf16_hd128"}
		if tc.wantSplit > 1 {
			want = append(want, "df_attn_dkdv_reduce")
		}
		if got := f.names(n0); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: launched %v, want %v", tc.name, got, want)
		}
		g := planDKDV(n, n, H, K, hd, c.info.sms, c.info.smemOptin, 0)
		l := f.launches[n0+1]
		plan := planAttn(hd, precBF16)
		if g.split != tc.wantSplit || l.gx != tc.wantGrid || l.gy != 1 || l.bx != attnThread || l.smem != plan.smemDKDV {
			t.Errorf("%s: dK/dV launch %d×%d of %d threads, %d bytes (plan %+v), want %d×1, split %d",
				tc.name, l.gx, l.gy, l.bx, l.smem, g, tc.wantGrid, tc.wantSplit)
		}
		a := l.args
		split, part := int(int32(a[len(a)-1])), a[len(a)-2]
		if split != g.split {
			t.Errorf("%s: the kernel is told split %d, the plan is %d", tc.name, split, g.split)
		}
		// q, k, v, dO (16-bit), lse, D, dK, dV: each within an allocation of the bytes the kernel addresses
		for i, bytes := range []int{2 * n * H * hd, 2 * n * K * hd, 2 * n * K * hd, 2 * n * H * hd, 4 * H * n, 4 * H * n, 4 * n * K * hd, 4 * n * K * hd} {
			if err := f.check(fmt.Sprintf("dK/dV argument %d", i), devPtr(a[i]), bytes); err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
		}
		if a[6] != uint64(dbuf(dk).ptr()) || a[7] != uint64(dbuf(dv).ptr()) {
			t.Errorf("%s: the kernel writes dK at %#x and dV at %#x, not the buffers", tc.name, a[6], a[7])
		}
		if tc.docs != (a[14] != 0) {
			t.Errorf("%s: document starts argument %#x", tc.name, a[14])
		}
		partBytes := 4 * 2 * (split - 1) * n * K * hd
		if split == 1 {
			if part != 0 {
				t.Errorf("%s: no split, but partials at %#x", tc.name, part)
			}
			continue
		}
		if err := f.check("dK/dV partials", devPtr(part), partBytes); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		r := f.launches[n0+2]
		ne := n * K * hd
		if r.gx != ewGrid(ne) || r.gy != 1 || r.bx != ewThreads || r.args[0] != a[6] || r.args[1] != a[7] || r.args[2] != part ||
			int(r.args[3]) != ne || int(int32(r.args[4])) != split {
			t.Errorf("%s: reduction %d×%d of %d, args %v; want dk %#x dv %#x part %#x n %d split %d", tc.name, r.gx, r.gy, r.bx,
				r.args, a[6], a[7], part, ne, split)
		}
		t.Logf("%s: %d dK/dV blocks, split %d, %.1f MB of partials", tc.name, l.gx, split, float64(partBytes)/1e6)
	}
}

// TestCUDAAttnDKDVSplit checks the split dK/dV kernel on the GPU: at the 0.85B's group of 4
// (and MHA), over blocks of several key tiles, every forced split (1: one block per key tile
// and kv head, as before the split; up to 16, more shares than some tiles have visible
// iterations) gives dK and dV within the tensor-core tolerance of the CPU, within 1e-4 of the
// largest |dK| (|dV|) of split 1's (the split only reorders float32 sums; a share lost or
// counted twice moves them by a fraction of that largest value), and the same bits run to run.
func TestCUDAAttnDKDVSplit(t *testing.T) {
	d := newDuo(t)
	d.gpu.setPrecision(precBF16)
	defer d.gpu.setPrecision(precFP32)
	defer func() { d.gpu.dkdvSplit = 0 }()
	for _, c := range []attnCase{
		{name: "gqa4_hd128_300", nq: 300, nk: 300, h: 8, kv: 2, hd: 128, causal: true, qpos: seqPos(0, 300), kpos: seqPos(0, 300)},
		{name: "mha_hd64_200_noncausal", nq: 200, nk: 200, h: 3, kv: 3, hd: 64},
	} {
		var ref [2][]float32 // split 1's dK, dV on the GPU
		for _, split := range []int{1, 2, 3, 7, 16} {
			t.Run(fmt.Sprintf("%s_split%d", c.name, split), func(t *testing.T) {
				d.gpu.dkdvSplit = split
				var runs [2][2][]float32
				for run := range runs {
					_, _, _, dk, dv := attnRun(d, rand.New(rand.NewPCG(41, 9)), c, roundBF16Ref)
					if run == 0 {
						d.close(t, "dk", dk, 2e-2)
						d.close(t, "dv", dv, 2e-2)
					}
					_, runs[run][0] = d.get(dk)
					_, runs[run][1] = d.get(dv)
				}
				for i, name := range []string{"dk", "dv"} {
					if j := firstDiff(runs[0][i], runs[1][i]); j >= 0 {
						t.Errorf("%s[%d] differs between runs: %g, %g", name, j, runs[0][i][j], runs[1][i][j])
					}
					if split == 1 {
						ref[i] = runs[0][i]
						continue
					}
					big, worst := 0.0, 0.0
					for x, v := range ref[i] {
						big = max(big, math.Abs(float64(v)))
						worst = max(worst, math.Abs(float64(runs[0][i][x]-v)))
					}
					if worst > 1e-4*big {
						t.Errorf("%s: split %d differs from split 1 by %g (largest |%s| %g)", name, split, worst, name, big)
					}
				}
			})
		}
	}
}
