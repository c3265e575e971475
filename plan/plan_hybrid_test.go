package plan

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"distflash/kernels"
	"distflash/model"
	"distflash/parallel"
	"distflash/parallel/transport"
)

// hybridRunTraffic runs one forward and backward of schedule name between Ulysses groups of U
// on P in-process ranks over T tokens and returns each rank's bytes by call site, less the
// one-time communicator splits, and each rank's forward bytes.
func hybridRunTraffic(t *testing.T, name string, h model.Heads, P, U, T int) (out []transport.Traffic, fwd []int64) {
	t.Helper()
	out, fwd = make([]transport.Traffic, P), make([]int64, P)
	pass := schedulePass{Name: name, Opt: parallel.Options{Overlap: true, UlyssesDegree: U}, Heads: h, P: P, T: T,
		Forward: func(c transport.Comm, _ kernels.Backend) {
			fwd[c.Rank()] = c.Traffic().Total() - c.Traffic()["hybrid.split"]
		},
		Backward: func(c transport.Comm, _ kernels.Backend) {
			tr := c.Traffic()
			delete(tr, "hybrid.split")
			out[c.Rank()] = tr
		}}
	if err := pass.run(); err != nil {
		t.Fatal(err)
	}
	return out, fwd
}

// TestPlanHybridLinkClasses: plan's attention bytes for parallelism.ulysses_degree = U equal
// what the hybrid sends when run (fp32, one layer, batch 1), and on a cluster whose nodes hold
// one Ulysses group each (U GPUs per node) the bytes between nodes are exactly the outer
// schedule's (every call site but hybrid.*), those inside a node the all-to-alls'. With two
// groups per node, a ring of 4 groups crosses between nodes on half its edges, so half the
// ring's bytes.
func TestPlanHybridLinkClasses(t *testing.T) {
	const T = 256
	h := model.Heads{N: 4, KV: 2, Dim: 32} // the tiny model's
	for _, c := range []struct {
		name    string
		P, U    int
		cluster string
	}{
		{"zigzag", 8, 4, "2x4xA100-80GB"}, {"distflash", 8, 2, "4x2xA100-80GB"}, {"ring", 8, 4, "2x4xA100-80GB"},
		{"burst", 4, 2, "2x2xA100-80GB"}, {"ring", 8, 2, "2x4xA100-80GB"},
	} {
		t.Run(fmt.Sprintf("%s/P%d/U%d/%s", c.name, c.P, c.U, c.cluster), func(t *testing.T) {
			cfg := loadPlanConfig(t, "../configs/tiny.toml", "data.batch_size=1", "checkpoint.activation=attn_output",
				fmt.Sprintf("parallelism.world_size=%d", c.P), fmt.Sprintf("parallelism.sequence_parallel_degree=%d", c.P),
				fmt.Sprintf("parallelism.ulysses_degree=%d", c.U), "parallelism.attention="+c.name)
			cl := mustCluster(t, c.cluster)
			pl := PlanFor(cfg, cl, c.name, T)
			if pl.Refused != "" {
				t.Fatal(pl.Refused)
			}
			got, fwd := hybridRunTraffic(t, c.name, h, c.P, c.U, T)
			// plan's busiest rank: the one that sends the most in the forward and backward
			var busiest, all, inner, outerCross float64
			for _, tr := range got {
				busiest = math.Max(busiest, float64(tr.Total()))
				all += float64(tr.Total())
				inner += float64(tr.Sum("hybrid."))
				if strings.Contains(c.cluster, fmt.Sprintf("x%dx", c.U)) {
					outerCross += float64(tr.Total() - tr.Sum("hybrid."))
				}
			}
			if inner == 0 || inner == all {
				t.Fatalf("inner %v of %v bytes: both link classes should carry traffic", inner, all)
			}
			L := float64(cfg.Model.NLayers)
			near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }
			if !near(pl.Comm.AttnPerLayer, busiest) || !near(pl.Comm.AttnTotalLayer, all) || !near(pl.Comm.Attention, L*busiest) {
				t.Errorf("plan: per layer %v per rank, %v all ranks, %v per step; run: %v, %v, %v",
					pl.Comm.AttnPerLayer, pl.Comm.AttnTotalLayer, pl.Comm.Attention, busiest, all, L*busiest)
			}
			// under checkpoint.activation = "layer" the forward runs twice: the busiest rank is the
			// one that sends the most in two forwards and a backward
			var busiest2 float64
			for r, tr := range got {
				busiest2 = math.Max(busiest2, float64(tr.Total()+fwd[r]))
			}
			cfg.Checkpoint.Activation = "layer"
			if pl2 := PlanFor(cfg, cl, c.name, T); !near(pl2.Comm.Attention, L*busiest2) {
				t.Errorf("layer policy: plan %v bytes per step, run %v", pl2.Comm.Attention, L*busiest2)
			}
			// AttnInterNode is the busiest rank's step bytes times the fraction crossing over all ranks
			wantCross := outerCross / all
			if cl.GPUsPerNode == 2*c.U { // a ring of 4 groups, 2 a node: half its edges cross
				wantCross = (all - inner) / all / 2
			}
			if !near(pl.Comm.AttnInterNode, pl.Comm.Attention*wantCross) {
				t.Errorf("between nodes: plan %v, run %v (share %.4f)", pl.Comm.AttnInterNode, pl.Comm.Attention*wantCross, wantCross)
			}
			t.Logf("per layer per rank %.0f bytes (all-to-all inside groups %.0f, %s between groups %.0f, over all ranks); between nodes per step %.0f of %.0f",
				pl.Comm.AttnPerLayer, inner/float64(c.P), c.name, (all-inner)/float64(c.P), pl.Comm.AttnInterNode, pl.Comm.Attention)
		})
	}
}

// TestPlanHybridRefusals: plan refuses what the hybrid cannot run, with the reason, and
// ulysses_degree leaves plain ulysses as it is.
func TestPlanHybridRefusals(t *testing.T) {
	cfg := loadPlanConfig(t, "../configs/llama-33h.toml") // config.Load itself refuses ulysses_degree = 2 for 33 heads
	cfg.Parallelism.UlyssesDegree = 2
	cl := mustCluster(t, "2x8xA100-80GB")
	if pl := PlanFor(cfg, cl, "zigzag", cfg.Data.SeqLen); !strings.Contains(pl.Refused, "n_heads (33)") || !strings.Contains(pl.Refused, "ulysses_degree = 2") {
		t.Errorf("33 heads, ulysses_degree 2: refused = %q", pl.Refused)
	}
	if pl := PlanFor(cfg, cl, "attn2d", cfg.Data.SeqLen); !strings.Contains(pl.Refused, "attn2d") {
		t.Errorf("attn2d with ulysses_degree 2: refused = %q", pl.Refused)
	}
	cfg = loadPlanConfig(t, "../configs/llama7b-512k.toml", "parallelism.ulysses_degree=8")
	plain := loadPlanConfig(t, "../configs/llama7b-512k.toml")
	a, b := PlanFor(cfg, cl, "ulysses", cfg.Data.SeqLen), PlanFor(plain, cl, "ulysses", cfg.Data.SeqLen)
	if a.Refused != "" || a.Comm != b.Comm {
		t.Errorf("ulysses with ulysses_degree 8: %+v, plain %+v", a.Comm, b.Comm)
	}
}
