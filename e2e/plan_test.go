package e2e

import (
	"encoding/json"
	"math"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"distflash/plan"
)

// The tests of this file run plan through the binary: every shipped config (text and JSON), the
// sweep table, the cluster and document flags, and CPU clusters' link classes.

// TestPlanEveryConfig: plan runs on every shipped config, as text and as JSON.
func TestPlanEveryConfig(t *testing.T) {
	files, err := filepath.Glob("configs/*.toml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no configs: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			out, errb, err := cli(t, "plan", "--config", f)
			if err != nil {
				t.Fatalf("text: %v\n%s", err, errb)
			}
			for _, want := range []string{"memory per rank", "peak", "step"} {
				if !strings.Contains(out, want) {
					t.Errorf("text output lacks %q:\n%s", want, out)
				}
			}
			if out, errb, err = cli(t, "plan", "--config", f, "--format", "json"); err != nil {
				t.Fatalf("json: %v\n%s", err, errb)
			}
			var rep plan.Report
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("json output does not decode: %v", err)
			}
			if len(rep.Plans) != 1 || rep.Plans[0].Refused != "" || !(rep.Plans[0].Memory.Peak > 0) || !(rep.Plans[0].Time.Step > 0) {
				t.Errorf("json plan: %+v", rep.Plans)
			}
		})
	}
}

// TestPlanSweepTable: the sweep prints one row per length and schedule, and a refused
// schedule shows its reason (Ulysses cannot split 33 heads over 16 ranks).
func TestPlanSweepTable(t *testing.T) {
	text, errb, err := cli(t, "plan", "--config", "configs/llama-33h.toml", "--cluster", "2x8xA100-80GB", "--sweep", "seq_len=8K..512K", "--attention", "all")
	if err != nil {
		t.Fatalf("%v\n%s", err, errb)
	}
	if n := strings.Count(text, " refused "); n != 7 || !strings.Contains(text, "ulysses refused: ") || !strings.Contains(text, "head") {
		t.Errorf("want ulysses refused on each of 7 lengths, with the reason, got %d:\n%s", n, text)
	}
	if !strings.Contains(text, "512K") || !strings.Contains(text, "distflash") {
		t.Errorf("table lacks rows:\n%s", text)
	}
}

// TestPlanSaysWhatIsMeasured (issue 33, item 10): configs/llama7b-512k.toml, which used to plan
// faster on 2×8 A100 than on 2×8 H100 (A100's efficiency an unmeasured default, H100's fitted),
// plans in the physical order, and the plan says which efficiency figures were measured and
// which assumed; a fit with a thin margin gets a note; a cluster of CPU ranks is spoken of in
// ranks, not GPUs and NVLink.
func TestPlanSaysWhatIsMeasured(t *testing.T) {
	step := func(cluster string) (float64, string) {
		t.Helper()
		out, _, err := cli(t, "plan", "--config", "configs/llama7b-512k.toml", "--cluster", cluster, "--format", "json")
		if err != nil {
			t.Fatal(err)
		}
		var rep plan.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatal(err)
		}
		return rep.Plans[0].Time.Step, rep.Cluster.GPU.Efficiency
	}
	a100, a100Eff := step("2x8xA100-80GB")
	h100, h100Eff := step("2x8xH100-80GB")
	if !(a100 > 2*h100) {
		t.Errorf("a step on 2x8 A100 %.1f s, on 2x8 H100 %.1f s: want the A100 (a third of the H100's bf16 rate) well over twice as slow", a100, h100)
	}
	if !strings.Contains(a100Eff, "not measured on an A100") || !strings.Contains(h100Eff, "measured") {
		t.Errorf("efficiency sources: A100 %q, H100 %q; want the A100's said to be unmeasured and the H100's where it was measured", a100Eff, h100Eff)
	}
	// 512K tokens over 8 A100s leave a 3% margin (with the 16-bit step's packed activations;
	// cuDNN's buffers take 6.5 GB a GPU at 64K tokens)
	out, _, err := cli(t, "plan", "--config", "configs/llama7b-512k.toml", "--cluster", "1x8xA100-80GB", "--set", "data.seq_len=524288")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"not measured on an A100", "fits in 80.00 GB: margin ", "note: a margin under 5% of the memory"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan on 1x8xA100-80GB: no %q in:\n%s", want, out)
		}
	}
	out, _, err = cli(t, "plan", "--config", "configs/tiny-sp4.toml", "--cluster", "2x2xcpu", "--flops", "1e10")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "4 CPU ranks") || !strings.Contains(out, "tokens per rank)") || strings.Contains(out, "GPU") || strings.Contains(out, "NVLink") {
		t.Errorf("plan on 2x2xcpu speaks of GPUs or NVLink, or not of CPU ranks:\n%s", out)
	}
	// docs/training.md's 1.08B over 2 FSDP processes fits at 64 tokens a rank, not at 1K: the
	// longest that fits is under the search's step, not "0 tokens" (under checkpoint.activation
	// = "none": auto takes layer where none does not fit, and layer fits 2K)
	out, _, err = cli(t, "plan", "--config", "configs/tiny.toml", "--cluster", "1x2xcpu", "--flops", "1e10", "--gpu-mem", "12.28e9", "--set", "checkpoint.activation=none",
		"--set", "parallelism.world_size=2", "--set", "parallelism.fsdp=true", "--set", "model.dim=2048", "--set", "model.n_layers=21",
		"--set", "model.n_heads=16", "--set", "model.n_kv_heads=4", "--set", "model.ffn_dim=5632", "--set", "model.vocab_size=32000",
		"--set", "data.seq_len=64", "--set", "data.batch_size=1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "fits in 12.28 GB") || !strings.Contains(out, "longest sequence per rank that fits: under 1K tokens") {
		t.Errorf("a plan that fits below 1K tokens a rank:\n%s", out)
	}
}

// TestPlanCommandFlags: a cluster of 8 GPUs gets the sequence over 8 GPUs; an unknown
// --format is refused by name.
func TestPlanCommandFlags(t *testing.T) {
	out, _, err := cli(t, "plan", "--config", "configs/llama7b-512k.toml", "--cluster", "1x8xA100-80GB", "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rep plan.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Plans[0].TokensPerGPU != 64<<10 {
		t.Errorf("1x8 cluster: want the sequence over 8 GPUs (64K each): %+v, %v", rep.Plans, err)
	}
	if _, _, err := cli(t, "plan", "--config", "configs/tiny.toml", "--format", "xml"); err == nil || !strings.Contains(err.Error(), "xml") {
		t.Errorf("--format xml: %v", err)
	}
}

// TestPlanDocumentFlags: --doc-len plans documents and prints them; data.document_mask
// without --doc-len says what it assumes; bad values are refused naming the flag.
func TestPlanDocumentFlags(t *testing.T) {
	base := []string{"plan", "--config", "configs/tiny-sp4.toml"}
	out, _, err := cli(t, append(base, "--doc-len", "32")...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"visible pairs", "mean 32 tokens", "with balance_documents", "(--doc-len)"} {
		if !strings.Contains(out, want) {
			t.Errorf("--doc-len 32: output lacks %q:\n%s", want, out)
		}
	}
	if out, _, err = cli(t, append(base, "--set", "data.document_mask=true", "--attention", "all")...); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "assumed: data.document_mask = true and no --doc-len") || !strings.Contains(out, "idle balanced") {
		t.Errorf("document_mask without --doc-len: want the assumption said and the documents table:\n%s", out)
	}
	if out, _, err = cli(t, base...); err != nil || strings.Contains(out, "visible pairs") {
		t.Errorf("no documents: %v\n%s", err, out)
	}
	for _, bad := range [][]string{{"--doc-len", "0"}, {"--doc-len", "x"}, {"--doc-len", "2K", "--doc-dist", "zipf"}, {"--doc-dist", "fixed"}} {
		_, _, err := cli(t, append(base, bad...)...)
		if err == nil || !strings.Contains(err.Error(), bad[len(bad)-2]) || !strings.Contains(err.Error(), bad[len(bad)-1]) {
			t.Errorf("%v: %v, want an error naming the flag and value", bad, err)
		}
	}
}

// TestPlanCPUCluster: --cluster NODESxRANKSxcpu (the hosts of scripts/netns-cluster.sh) needs
// --flops, takes mfu 1, and splits the attention bytes by link class: the ring's neighbours
// 1→2 and 3→0 cross between 2 nodes of 2 ranks, 0→1 and 2→3 do not, so half of its bytes
// cross; on one node none do. The gradient all-reduce is priced as Open MPI's linear
// exchanges (worldCollectives), not as a ring.
func TestPlanCPUCluster(t *testing.T) {
	_, _, err := cli(t, "plan", "--config", "configs/tiny-sp4.toml", "--cluster", "2x2xcpu")
	if err == nil || !strings.Contains(err.Error(), "--flops") {
		t.Errorf("2x2xcpu without --flops: %v, want an error naming --flops", err)
	}
	plan := func(cluster, attention string) plan.Plan {
		t.Helper()
		out, _, err := cli(t, "plan", "--config", "configs/tiny-sp4.toml", "--cluster", cluster, "--flops", "2e9",
			"--inter-bw", "6.25e6", "--attention", attention, "--format", "json")
		if err != nil {
			t.Fatalf("plan --cluster %s: %v", cluster, err)
		}
		var rep plan.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
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

// TestPlanSaysTheAutoChoice (issue 41, change 7): for checkpoint.activation = "auto" plan says
// which policy it took for the GPU and why (each candidate's estimate against 90% of the
// memory), the sweep table has the policy of each length, and a GPU's step time is printed
// part by part as a prediction: the 0.85B of configs/llama-1b.toml on one H100 takes none at 8K
// and layer at 256K, and its 8K step is GEMMs, attention, elementwise kernels and the
// optimizer phase.
func TestPlanSaysTheAutoChoice(t *testing.T) {
	out, errb, err := cli(t, "plan", "--config", "configs/llama-1b.toml", "--cluster", "1x1xH100-80GB", "--set", "checkpoint.activation=auto")
	if err != nil {
		t.Fatalf("%v\n%s", err, errb)
	}
	auto := regexp.MustCompile(`auto: +checkpoint\.activation = auto → none: [0-9.]+ GB of 72\.0 GB \(90% of 80\.0 GB\) \(attn_output [0-9.]+ GB, layer [0-9.]+ GB\); training\.mlp_tile = -1 → the MLP whole; training\.loss_chunk = -1 → the logits at once`)
	if !auto.MatchString(out) {
		t.Errorf("plan does not say auto's choice at 8K:\n%s", out)
	}
	for _, want := range []string{"step time (predicted: the rates are assumed", "GEMMs ", "attention kernels ", "elementwise kernels ", "optimizer phase ", "TFLOP at 643 TF/s"} {
		if !strings.Contains(out, want) {
			t.Errorf("the step time lacks %q:\n%s", want, out)
		}
	}
	out, errb, err = cli(t, "plan", "--config", "configs/llama-1b.toml", "--cluster", "1x1xH100-80GB", "--set", "checkpoint.activation=auto", "--sweep", "seq_len=8K..256K")
	if err != nil {
		t.Fatalf("%v\n%s", err, errb)
	}
	rows := regexp.MustCompile(`(?m)^ *distflash +(\S+) +\S+ +(\S+) `).FindAllStringSubmatch(out, -1)
	if len(rows) != 6 || rows[0][1] != "8K" || rows[0][2] != "none" || rows[5][1] != "256K" || rows[5][2] != "layer" || !strings.Contains(out, "checkpoint") {
		t.Errorf("the sweep's policies: %v\n%s", rows, out)
	}
	out, _, err = cli(t, "plan", "--config", "configs/llama-1b.toml", "--cluster", "1x1xH100-80GB", "--set", "checkpoint.activation=auto", "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rep plan.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if c := rep.Plans[0].Choice; c == nil || c.Policy != "none" || !c.Fits || len(c.Others) != 2 || len(rep.Plans[0].Time.Components) != 4 {
		t.Errorf("json: choice %+v, components %+v", c, rep.Plans[0].Time.Components)
	}
}
