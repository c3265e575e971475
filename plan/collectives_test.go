package plan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

// oldWorldSecPerByte is the bandwidth-only model plan priced the GPU collectives with before
// it priced latency and the tree: NCCL's ring at IntraBW on one node, between nodes at the
// slower of IntraBW and a node's whole network.
func oldWorldSecPerByte(cl Cluster, world int) float64 {
	if world <= cl.GPUsPerNode {
		return 1 / cl.GPU.IntraBW
	}
	return 1 / min(cl.GPU.IntraBW, float64(cl.GPUsPerNode)*cl.GPU.InterBW)
}

// TestPlanNCCLAlgorithmChoice: the all-reduce runs as NCCL's ring or tree, whichever NCCL's
// tuning model predicts faster for the call's size: small calls on many nodes take the tree
// (its latency grows with log2 of the nodes, the ring's with the ranks), large ones the ring
// (its bus bandwidth is the higher), and on one node the ring wins every size. The time taken
// is the winner's, bandwidth plus latency.
func TestPlanNCCLAlgorithmChoice(t *testing.T) {
	const KB, MB, GB = 1e3, 1e6, 1e9
	for _, c := range []struct {
		cluster string
		S       float64 // bytes of the call's buffer
		want    string
	}{
		{"16x8xA100-80GB", 64, "tree"},
		{"16x8xA100-80GB", 1 * MB, "tree"},
		{"16x8xA100-80GB", 10 * GB, "ring"},
		{"64x8xH100-80GB", 100 * MB, "tree"}, // 512 ranks: the ring's 1022 steps cost 6.7 ms
		{"64x8xH100-80GB", 10 * GB, "ring"},
		{"2x8xH100-80GB", 4 * MB, "tree"},
		{"2x8xH100-80GB", 1 * GB, "ring"},
		{"4x1xA100-80GB", 1 * KB, "tree"},
		{"4x1xA100-80GB", 1 * GB, "ring"},
		{"1x8xA100-80GB", 64, "ring"},
		{"1x8xA100-80GB", 1 * MB, "ring"},
		{"1x8xH100-80GB", 10 * GB, "ring"},
		{"1x2xH200-141GB", 1 * KB, "ring"},
	} {
		t.Run(fmt.Sprintf("%s/%g", c.cluster, c.S), func(t *testing.T) {
			cl := mustCluster(t, c.cluster)
			P := cl.GPUs()
			wn := worldCollectives(cl, P)
			ct := wn.allReduce(c.S, 2*float64(P-1)/float64(P)*c.S)
			if ct.Algorithm != c.want {
				t.Errorf("all-reduce of %g bytes: %s (ring %g s, tree %g s), want %s", c.S, ct.Algorithm, ct.Ring, ct.Tree, c.want)
			}
			if got := min(ct.Ring, ct.Tree); math.Abs(ct.Seconds-got) > 1e-12*got || ct.Seconds != ct.Bandwidth+ct.Latency {
				t.Errorf("seconds %g = %g + %g, want the faster of ring %g and tree %g", ct.Seconds, ct.Bandwidth, ct.Latency, ct.Ring, ct.Tree)
			}
			t.Logf("%s: ring %.4g s, tree %.4g s: %s", c.cluster, ct.Ring, ct.Tree, ct.Algorithm)
		})
	}
}

// TestPlanNCCLLatencyModel: the latency terms are NCCL's tuning model's for the Simple
// protocol (collectives.go): on one node a ring call pays 8.4 µs and 3.4 µs a step, P−1 steps
// for an all-gather or reduce-scatter and 2(P−1) for an all-reduce, so each rank added adds
// one step (two); between nodes n−1 of the steps (2(n−1)) are network steps of 14 µs and the
// all-reduce's latency is × 1.4; the tree's is 8.4 µs + 2·((g−1)·4 µs + ⌊log2 n⌋·14 µs).
func TestPlanNCCLLatencyModel(t *testing.T) {
	const us = 1e-6
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Abs(b) }
	for P := 2; P <= 8; P++ {
		wn := worldCollectives(mustCluster(t, fmt.Sprintf("1x%dxA100-80GB", P)), P)
		if got, want := wn.ringLatency(false), (8.4+float64(P-1)*3.4)*us; !near(got, want) {
			t.Errorf("1x%d: ring all-gather latency %g, want %g", P, got, want)
		}
		if got, want := wn.ringLatency(true), (8.4+float64(2*(P-1))*3.4)*us; !near(got, want) {
			t.Errorf("1x%d: ring all-reduce latency %g, want %g", P, got, want)
		}
		if P > 2 {
			prev := worldCollectives(mustCluster(t, fmt.Sprintf("1x%dxA100-80GB", P-1)), P-1)
			if d := wn.ringLatency(false) - prev.ringLatency(false); !near(d, 3.4*us) {
				t.Errorf("1x%d: one more rank adds %g s to a gather, want one 3.4 µs step", P, d)
			}
		}
	}
	for _, c := range []struct {
		cluster            string
		gather, ring, tree float64 // µs
	}{
		{"2x8xA100-80GB", 8.4 + 14*3.4 + 14, (8.4 + 28*3.4 + 2*14) * 1.4, 8.4 + 2*(7*4+1*14)},
		{"16x8xH100-80GB", 8.4 + 112*3.4 + 15*14, (8.4 + 224*3.4 + 30*14) * 1.4, 8.4 + 2*(7*4+4*14)},
		{"4x1xA100-80GB", 8.4 + 3*14, (8.4 + 6*14) * 1.4, 8.4 + 2*(2*14)},
		{"3x4xA100-80GB", 8.4 + 9*3.4 + 2*14, (8.4 + 18*3.4 + 4*14) * 1.4, 8.4 + 2*(3*4+1*14)},
	} {
		cl := mustCluster(t, c.cluster)
		wn := worldCollectives(cl, cl.GPUs())
		if got := wn.ringLatency(false); !near(got, c.gather*us) {
			t.Errorf("%s: ring gather latency %g, want %g µs", c.cluster, got/us, c.gather)
		}
		if got := wn.ringLatency(true); !near(got, c.ring*us) {
			t.Errorf("%s: ring all-reduce latency %g, want %g µs", c.cluster, got/us, c.ring)
		}
		if got := wn.treeLatency(); !near(got, c.tree*us) {
			t.Errorf("%s: tree all-reduce latency %g, want %g µs", c.cluster, got/us, c.tree)
		}
	}
	for _, c := range []struct {
		S    float64
		want float64
	}{{1, 1}, {63, 1}, {64, .9}, {8 << 10, .8}, {1 << 20, .5}, {2<<20 - 1, .5}, {2 << 20, .6}, {64 << 20, .8}, {512<<20 - 1, .9}, {512 << 20, 1}, {1e12, 1}} {
		if got := treeCorrection(c.S); got != c.want {
			t.Errorf("treeCorrection(%g) = %g, want %g", c.S, got, c.want)
		}
	}
}

// TestPlanNCCLRingBandwidthUnchanged: the ring's bandwidth term is the bandwidth-only model's
// (bytes at the ring's bus bandwidth), for FSDP's calls and for an all-reduce the ring wins,
// so a large call differs from the old price by its latency alone, which vanishes against the
// bytes; each call adds its latency.
func TestPlanNCCLRingBandwidthUnchanged(t *testing.T) {
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Abs(b) }
	for _, s := range []string{"1x8xA100-80GB", "2x8xA100-80GB", "4x8xH100-80GB", "1x4xH200-141GB", "8x2xA100-40GB"} {
		cl := mustCluster(t, s)
		P := cl.GPUs()
		wn := worldCollectives(cl, P)
		old := oldWorldSecPerByte(cl, P)
		if wn.secPerByte != old {
			t.Errorf("%s: %g s a byte, the old model %g", s, wn.secPerByte, old)
		}
		const S = 20e9 // a 10B model's bf16 gradient
		bytes := 2 * float64(P-1) / float64(P) * S
		ar := wn.allReduce(S, bytes)
		if ar.Algorithm != "ring" || !near(ar.Bandwidth, bytes*old) || !near(ar.Seconds, ar.Bandwidth+ar.Latency) || ar.Latency > 1e-2*ar.Seconds {
			t.Errorf("%s: all-reduce of %g bytes %+v, want the ring at the old %g s plus a small latency", s, S, ar, bytes*old)
		}
		fs := wn.gatherScatter(3*S, 101)
		if fs.Algorithm != "ring" || !near(fs.Bandwidth, 3*S*old) || !near(fs.Latency, 101*wn.ringLatency(false)) {
			t.Errorf("%s: fsdp %+v, want the old bandwidth term %g and 101 calls' latency", s, fs, 3*S*old)
		}
	}
	// CPU ranks keep Open MPI's linear exchanges, with no latency.
	cl := mustCluster(t, "2x2xcpu")
	wn := worldCollectives(cl, 4)
	if ar := wn.allReduce(1e6, 1.5e6); ar.Algorithm != "linear" || ar.Latency != 0 || !near(ar.Seconds, 1.5e6*wn.secPerByte) || !near(wn.cross, 2.0/3) {
		t.Errorf("2x2xcpu all-reduce %+v, cross %g", ar, wn.cross)
	}
}

// TestPlanNCCLOneNodeOnlyLatency: on one node, every shipped config with more than one rank
// plans exactly as the bandwidth-only model did but for the latency of its collectives'
// calls: memory and bytes are untouched, the world's collectives run at IntraBW, and the
// communication time and step grow by at most the calls' latency (FSDP: 3L+5 calls per
// micro-batch, the gradient all-reduce one), a few milliseconds.
func TestPlanNCCLOneNodeOnlyLatency(t *testing.T) {
	files, err := filepath.Glob("../configs/*.toml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no configs: %v", err)
	}
	planned := 0
	for _, f := range files {
		cfg := loadPlanConfig(t, f)
		p := cfg.Parallelism
		if p.WorldSize < 2 {
			continue
		}
		cl := DefaultCluster(8)
		cl.GPUsPerNode = p.WorldSize // one node of world GPUs
		pl := PlanFor(cfg, cl, p.Attention, cfg.Data.SeqLen)
		if pl.Refused != "" {
			t.Fatalf("%s: refused: %s", f, pl.Refused)
		}
		planned++
		c, tm := pl.Comm, pl.Time
		attn := c.AttnInterNode/cl.GPU.InterBW + (c.Attention-c.AttnInterNode)/cl.GPU.IntraBW
		oldFSDP, oldDP := c.FSDP/cl.GPU.IntraBW, c.DataParallel/cl.GPU.IntraBW
		oldComm := attn + oldFSDP + oldDP
		oldStep := oldComm + tm.Compute
		if tm.Overlap {
			oldStep = max(tm.Compute, attn+oldFSDP) + oldDP
		}
		lat := tm.FSDP.Latency + tm.DataParallel.Latency
		calls := 1
		if p.FSDP {
			calls = cfg.Training.GradAccumSteps * (3*cfg.Model.NLayers + 5)
		}
		latCall := (8.4 + 2*float64(p.WorldSize-1)*3.4) * 1e-6
		if tm.FSDP.Calls+tm.DataParallel.Calls != calls || !(lat > 0) || lat > float64(calls)*latCall*(1+1e-9) {
			t.Errorf("%s: %d calls with %g s of latency, want %d calls of at most %g s", f, tm.FSDP.Calls+tm.DataParallel.Calls, lat, calls, latCall)
		}
		near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Abs(b) }
		if tm.WorldLinkBW != cl.GPU.IntraBW || !near(tm.FSDP.Bandwidth, oldFSDP) || !near(tm.DataParallel.Bandwidth, oldDP) {
			t.Errorf("%s: collectives at %g B/s, fsdp %g s, dp %g s; the old model %g B/s, %g s, %g s",
				f, tm.WorldLinkBW, tm.FSDP.Bandwidth, tm.DataParallel.Bandwidth, cl.GPU.IntraBW, oldFSDP, oldDP)
		}
		if math.Abs(tm.Comm-oldComm-lat) > 1e-9*tm.Comm || tm.Step < oldStep || tm.Step-oldStep > lat*(1+1e-9) {
			t.Errorf("%s: comm %g s, step %g s; the old model %g s, %g s; latency %g s", f, tm.Comm, tm.Step, oldComm, oldStep, lat)
		}
		if want := "ring"; (p.FSDP && tm.FSDP.Algorithm != want) || (!p.FSDP && tm.DataParallel.Algorithm != want) {
			t.Errorf("%s: one node: fsdp %q, data-parallel %q, want the ring", f, tm.FSDP.Algorithm, tm.DataParallel.Algorithm)
		}
		t.Logf("%s on %s: %d calls, %.3g ms latency over %.4g s of communication", filepath.Base(f), cl, calls, lat*1e3, tm.Comm)
	}
	if planned < 2 {
		t.Errorf("only %d shipped configs with more than one rank", planned)
	}
}

// TestPlanNCCLDetailNamesAlgorithm: plan says which algorithm runs the gradient all-reduce,
// in WriteDetail and in the JSON report: 32 data-parallel replicas of the tiny model on 4
// nodes of 8 all-reduce 3.2 MB, which NCCL's tree does faster than its 62-step ring, and on
// one node the ring; FSDP's calls are the ring's.
func TestPlanNCCLDetailNamesAlgorithm(t *testing.T) {
	for _, c := range []struct {
		cluster, sets, want string
		fsdp                bool
	}{
		{"4x8xA100-80GB", "", "tree", false},
		{"1x8xA100-80GB", "", "ring", false},
		{"4x8xA100-80GB", "parallelism.fsdp=true", "ring", true},
	} {
		cl := mustCluster(t, c.cluster)
		sets := []string{fmt.Sprintf("parallelism.world_size=%d", cl.GPUs()), "parallelism.sequence_parallel_degree=1"}
		if c.sets != "" {
			sets = append(sets, c.sets)
		}
		cfg := loadPlanConfig(t, "../configs/tiny.toml", sets...)
		pl := PlanFor(cfg, cl, "distflash", cfg.Data.SeqLen)
		if pl.Refused != "" {
			t.Fatal(pl.Refused)
		}
		ct := pl.Time.DataParallel
		if c.fsdp {
			ct = pl.Time.FSDP
		}
		if ct.Algorithm != c.want {
			t.Errorf("%s %s: %+v, want %s", c.cluster, c.sets, ct, c.want)
		}
		rep := Report{Config: "tiny", Summary: cfg.Summary(), Cluster: cl, Plans: []Plan{pl}}
		var out bytes.Buffer
		WriteDetail(&out, rep)
		if !strings.Contains(out.String(), "NCCL "+c.want) {
			t.Errorf("%s: detail lacks %q:\n%s", c.cluster, "NCCL "+c.want, out.String())
		}
		js, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(js), `"algorithm":"`+c.want+`"`) {
			t.Errorf("%s: JSON lacks the algorithm %s: %s", c.cluster, c.want, js)
		}
	}
}
