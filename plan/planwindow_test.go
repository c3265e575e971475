package plan

import (
	"fmt"
	"math"
	"testing"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel"
)

// TestPlanWindowTraffic: the bytes plan predicts for a windowed layer (measured at chunks of
// 2 and 4 tokens with the window reachWindow gives, extrapolated to T) are the bytes the
// schedule sends when it runs at T with the real window, for every schedule and windows from
// one token to past T; with W ≤ T/P a ring sends one neighbour's blocks, not P − 1.
func TestPlanWindowTraffic(t *testing.T) {
	const P = 4
	h := model.Heads{N: 4, KV: 2, Dim: 8}
	for _, name := range parallel.Names() {
		l, err := parallel.LayoutOf(name)
		if err != nil {
			t.Fatal(err)
		}
		T := 6 * l.Divisor(P) * 2 // chunks of 12 tokens: neither of the fit's lengths
		for _, W := range []int{1, 2, 7, 12, 13, 25, T / P, T/P + 1, T / 2, T - 1, 2 * T} {
			t.Run(fmt.Sprintf("%s/W%d", name, W), func(t *testing.T) {
				tr, err := measureTraffic(name, h, P, T, W, kernels.FP32)
				if err != nil {
					t.Fatal(err)
				}
				f, b, _, err := runScheduleOnce(name, h, P, T, W, kernels.FP32)
				if err != nil {
					t.Fatal(err)
				}
				var sum float64
				for r := range P {
					sum += f[r] + b[r]
					for _, c := range []struct {
						what      string
						plan, ran float64
					}{{"forward", tr.fwd[r].at(float64(T)), f[r]}, {"backward", tr.bwd[r].at(float64(T)), b[r]}} {
						if math.Abs(c.plan-c.ran) > 1e-6*max(c.ran, 1) {
							t.Errorf("rank %d %s: plan %.0f bytes, the schedule sent %.0f", r, c.what, c.plan, c.ran)
						}
					}
				}
				if _, _, total := tr.at(float64(T), 1); math.Abs(total-sum) > 1e-6*sum {
					t.Errorf("all ranks: plan %.0f bytes, the schedules sent %.0f", total, sum)
				}
			})
		}
	}
	// the ring's one hop: 1/(P−1) of the forward bytes without a window
	T := 48
	plain, _ := measureTraffic("ring", h, P, T, 0, kernels.FP32)
	win, _ := measureTraffic("ring", h, P, T, T/P, kernels.FP32)
	f0, _, _ := plain.at(float64(T), 1)
	f1, _, _ := win.at(float64(T), 1)
	if r := f1 / f0; math.Abs(r-1.0/(P-1)) > 1e-9 {
		t.Errorf("ring forward bytes with W = T/P: %.4f of those without, want 1/(P−1) = %.4f", r, 1.0/(P-1))
	}
}

// TestPlanWindowVisible: windowVisible is the share of the causal pairs the window's start
// table leaves (counted), and documents far longer than the sequence under a window leave what
// the window alone does.
func TestPlanWindowVisible(t *testing.T) {
	for _, c := range []struct{ T, W int }{{100, 1}, {100, 7}, {100, 99}, {100, 100}, {100, 500}, {4096, 1024}, {1, 1}} {
		var pairs float64
		for i, s := range windowStarts(c.T, c.W, nil) {
			pairs += float64(i - int(s) + 1)
		}
		want := pairs / (float64(c.T) * float64(c.T+1) / 2)
		if got := windowVisible(c.T, c.W); math.Abs(got-want) > 1e-12 {
			t.Errorf("T %d W %d: windowVisible %.6f, counted %.6f", c.T, c.W, got, want)
		}
		long := DocLengths{Dist: "fixed", Mean: 1e15}
		if got := long.VisibleFraction(c.T, c.W); math.Abs(got-want) > 1e-9 {
			t.Errorf("T %d W %d: one endless document under the window %.6f, the window alone %.6f", c.T, c.W, got, want)
		}
	}
	if v := windowVisible(16384, 1024); math.Abs(v-0.1216) > 1e-3 {
		t.Errorf("T 16K, W 1K: %.4f of the causal pairs, want ≈ 2W/T − (W/T)² = 0.1211 plus the diagonal", v)
	}
}

// TestPlanWindow: a plan of a windowed model. Attention FLOPs scale by the visible fraction
// on the windowed layers only; attention bytes are the windowed layers' (ring with W ≤ T/P:
// 1/(P−1) forward); the idle of a contiguous ring is small once W ≤ T/P (only the first rank,
// whose window starts as a triangle, has less work) and zigzag's, 0
// without a window, is not; memory and the longest sequence are the causal plan's.
func TestPlanWindow(t *testing.T) {
	const T = 8192
	cl := mustCluster(t, "1x4xA100-80GB")
	base := loadPlanConfig(t, "../configs/tiny-sp4.toml", "data.seq_len=8192", "model.max_seq_len=8192")
	for _, c := range []struct {
		name   string
		sets   []string
		layers float64 // fraction of the layers windowed
	}{
		{"every layer", []string{"model.sliding_window=1024"}, 1},
		{"layer 0", []string{"model.sliding_window=1024", "model.sliding_window_layers=[0]"}, 0},
	} {
		cfg := loadPlanConfig(t, "../configs/tiny-sp4.toml", append([]string{"data.seq_len=8192", "model.max_seq_len=8192"}, c.sets...)...)
		if c.layers == 0 {
			c.layers = 1 / float64(cfg.Model.NLayers)
		}
		for _, name := range []string{"ring", "zigzag", "distflash", "burst", "ulysses", "attn2d"} {
			causal := PlanFor(base, cl, name, T)
			win := PlanFor(cfg, cl, name, T)
			if causal.Refused != "" || win.Refused != "" {
				t.Fatalf("%s %s: refused %q %q", c.name, name, causal.Refused, win.Refused)
			}
			w := win.Window
			if w == nil || w.Window != 1024 || w.Visible != windowVisible(T, 1024) {
				t.Fatalf("%s %s: window plan %+v", c.name, name, w)
			}
			wantFLOPs := 1 - c.layers + c.layers*w.Visible
			if r := win.Time.AttnFLOPs / causal.Time.AttnFLOPs; math.Abs(r/wantFLOPs-1) > 1e-12 {
				t.Errorf("%s %s: attention FLOPs ×%.4f, want ×%.4f", c.name, name, r, wantFLOPs)
			}
			wantBytes := 1 - c.layers + c.layers*w.BytesRatio
			if r := win.Comm.Attention / causal.Comm.Attention; math.Abs(r/wantBytes-1) > 1e-9 {
				t.Errorf("%s %s: attention bytes ×%.4f, want ×%.4f (window ratio %.4f)", c.name, name, r, wantBytes, w.BytesRatio)
			}
			if win.Memory.Peak != causal.Memory.Peak || win.MaxSeqPerGPU != causal.MaxSeqPerGPU {
				t.Errorf("%s %s: memory %g / longest %d, causal %g / %d", c.name, name, win.Memory.Peak, win.MaxSeqPerGPU, causal.Memory.Peak, causal.MaxSeqPerGPU)
			}
			if !(win.Time.Step < causal.Time.Step) {
				t.Errorf("%s %s: step %g s with the window, %g s without", c.name, name, win.Time.Step, causal.Time.Step)
			}
			switch name {
			case "ring", "burst", "distflash":
				if !(w.BytesRatio < 0.6) {
					t.Errorf("%s %s: a windowed layer sends %.3f of the bytes", c.name, name, w.BytesRatio)
				}
			case "zigzag", "ulysses", "attn2d":
				if math.Abs(w.BytesRatio-1) > 1e-9 {
					t.Errorf("%s %s: bytes ratio %.4f, want 1 (this schedule sends what it sends without a window)", c.name, name, w.BytesRatio)
				}
			}
			if name == "ring" && !(w.Idle < 0.07 && w.CausalIdle > 0.3) { // rank 0's triangle: W/(2n)/P = 1/16
				t.Errorf("%s ring: idle %.3f under W ≤ T/P, causal %.3f", c.name, w.Idle, w.CausalIdle)
			}
			if name == "zigzag" && !(w.Idle > 0.1 && w.CausalIdle == 0) {
				t.Errorf("%s zigzag: idle %.3f under W ≤ T/P, causal %.3f: want it unbalanced", c.name, w.Idle, w.CausalIdle)
			}
			t.Logf("%s %-9s: FLOPs ×%.4f, bytes of a windowed layer ×%.3f, idle %.3f (causal %.3f), step %.3g s vs %.3g s",
				c.name, name, win.Time.AttnFLOPs/causal.Time.AttnFLOPs, w.BytesRatio, w.Idle, w.CausalIdle, win.Time.Step, causal.Time.Step)
		}
	}
}
