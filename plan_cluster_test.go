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
// cross; on one node none do.
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
	for _, tc := range []struct {
		cluster, attention string
		cross              float64 // fraction of the attention bytes between nodes
	}{
		{"2x2xcpu", "ring", 0.5},
		{"1x4xcpu", "ring", 0},
		{"4x1xcpu", "ring", 1},
	} {
		p := plan(tc.cluster, tc.attention)
		c := p.Comm
		if got := c.AttnInterNode / c.Attention; math.Abs(got-tc.cross) > 1e-9 {
			t.Errorf("%s %s: %.4f of the attention bytes cross between nodes, want %g", tc.cluster, tc.attention, got, tc.cross)
		}
		// The gradient all-reduce as a ring over nodes: Nodes of the 4 edges cross.
		nodes := float64(tc.cluster[0] - '0')
		wantInter := c.AttnInterNode
		if nodes > 1 {
			wantInter += nodes / 4 * c.DataParallel
		}
		if math.Abs(c.InterNode-wantInter) > 1e-6*wantInter+1e-9 {
			t.Errorf("%s: inter-node bytes %g, want %g", tc.cluster, c.InterNode, wantInter)
		}
	}
	// Slower links between nodes slow the 2-node step, not the 1-node one.
	if a, b := plan("2x2xcpu", "distflash").Time.Step, plan("1x4xcpu", "distflash").Time.Step; !(a > b) {
		t.Errorf("step on 2x2 %g s, on 1x4 %g s: want the inter-node links to cost time", a, b)
	}
}
