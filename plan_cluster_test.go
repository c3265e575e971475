package main

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// TestPlanCPUCluster: --cluster NODESxRANKSxcpu (the hosts of scripts/netns-cluster.sh) needs
// --flops, takes mfu 1, and splits the attention bytes by link class: the ring's neighbours
// 1→2 and 3→0 cross between 2 nodes of 2 ranks, 0→1 and 2→3 do not, so half of its bytes
// cross; on one node none do. The gradient all-reduce is priced as Open MPI's linear
// exchanges (worldCollectives), not as a ring.
func TestPlanCPUCluster(t *testing.T) {
	var out, errb bytes.Buffer
	err := runPlan([]string{"--config", "configs/tiny-sp4.toml", "--cluster", "2x2xcpu"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "--flops") {
		t.Errorf("2x2xcpu without --flops: %v, want an error naming --flops", err)
	}
	plan := func(cluster, attention string) Plan {
		t.Helper()
		out.Reset()
		if err := runPlan([]string{"--config", "configs/tiny-sp4.toml", "--cluster", cluster, "--flops", "2e9",
			"--inter-bw", "6.25e6", "--attention", attention, "--format", "json"}, &out, &errb); err != nil {
			t.Fatalf("plan --cluster %s: %v", cluster, err)
		}
		var rep Report
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Cluster.MFU != 1 || rep.Cluster.GPU.FLOPS != 2e9 {
			t.Errorf("cluster %+v: want mfu 1 and FLOP/s 2e9", rep.Cluster)
		}
		return rep.Plans[0]
	}
	// tiny-sp4's gradient: 803968 fp32 values; the all-reduce sends 2·(P−1)/P of it per rank.
	const gradBytes = 803968 * 4
	for _, tc := range []struct {
		cluster, attention string
		cross              float64 // fraction of the attention bytes between nodes
		// dpCross is the fraction of the gradient all-reduce's bytes between nodes: Open
		// MPI's linear exchanges send each other rank its chunk, so 2 of 3 peers are across
		// on 2 nodes of 2 (a ring would cross on 2 of its 4 edges: 1/2), all on 4 nodes of 1.
		dpCross float64
		dpTime  float64 // seconds of the all-reduce: crossing bytes at 6.25e6 B/s, the rest at 2e9
	}{
		{"2x2xcpu", "ring", 0.5, 2.0 / 3, 1.5 * gradBytes * (2.0/3/6.25e6 + 1.0/3/2e9)},
		{"1x4xcpu", "ring", 0, 0, 1.5 * gradBytes / 2e9},
		{"4x1xcpu", "ring", 1, 1, 1.5 * gradBytes / 6.25e6},
	} {
		p := plan(tc.cluster, tc.attention)
		c := p.Comm
		if got := c.AttnInterNode / c.Attention; math.Abs(got-tc.cross) > 1e-9 {
			t.Errorf("%s %s: %.4f of the attention bytes cross between nodes, want %g", tc.cluster, tc.attention, got, tc.cross)
		}
		if c.DataParallel != 1.5*gradBytes {
			t.Errorf("%s: data-parallel bytes %g per rank, want 2·3/4 × %d", tc.cluster, c.DataParallel, gradBytes)
		}
		if got := (c.InterNode - c.AttnInterNode) / c.DataParallel; math.Abs(got-tc.dpCross) > 1e-9 {
			t.Errorf("%s: %.4f of the all-reduce's bytes cross between nodes, want %.4f", tc.cluster, got, tc.dpCross)
		}
		if got := c.DataParallel / p.Time.WorldLinkBW; math.Abs(got-tc.dpTime) > 1e-9*tc.dpTime {
			t.Errorf("%s: all-reduce takes %g s, want %g s", tc.cluster, got, tc.dpTime)
		}
	}
	// Slower links between nodes slow the 2-node step, not the 1-node one.
	if a, b := plan("2x2xcpu", "distflash").Time.Step, plan("1x4xcpu", "distflash").Time.Step; !(a > b) {
		t.Errorf("step on 2x2 %g s, on 1x4 %g s: want the inter-node links to cost time", a, b)
	}
}
