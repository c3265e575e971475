package main

import (
	"fmt"
	"io"

	"distflash/config"
	"distflash/internal/cli"
	"distflash/plan"
)

// runPlan is the plan command.
func runPlan(args []string, stdout, stderr io.Writer) error {
	fs := root.Flags("plan", stderr)
	configPath := fs.String("config", "", "TOML config file (default: the built-in defaults, which configs/tiny.toml writes out)")
	var sets cli.Sets
	fs.Var(&sets, "set", "override a config value, e.g. --set data.seq_len=262144 (repeatable)")
	clusterName := fs.String("cluster", "", "NODESxGPUSxTYPE, TYPE one of A100-40GB, A100-80GB, H100-80GB, H200-141GB, or cpu (ranks of the CPU backend; needs --flops) (default: world_size A100-80GB GPUs, 8 a node)")
	format := fs.String("format", "text", "text | json")
	sweep := fs.String("sweep", "", "seq_len=LO..HI: plan every seq_len from LO doubling to HI (K = 1024, M = 1024²)")
	attention := fs.String("attention", "", "all | a schedule name (default: parallelism.attention)")
	mfu := fs.Float64("mfu", 0, "achievable fraction of the GPU's peak FLOP/s in the GEMMs; also the attention's unless --attn-mfu is given (default: the GPU type's: 0.65, as native bf16 cuBLAS runs in torchtitan and llm.c, assumed; 1 for cpu)")
	attnMFU := fs.Float64("attn-mfu", 0, "achievable fraction of the GPU's peak FLOP/s in the attention kernels (default: --mfu when given, else 0.485 for cuDNN's fused attention as PyTorch's SDPA ran on an H100, 0.11 for the own kernels (device.attention = own, or fp32) as their benchmark ran; 1 for cpu)")
	gpuMem := fs.Float64("gpu-mem", 0, "override the GPU memory, bytes (e.g. 80e9)")
	interBW := fs.Float64("inter-bw", 0, "override the inter-node bandwidth per GPU, bytes/s")
	intraBW := fs.Float64("intra-bw", 0, "override the intra-node bandwidth per GPU, bytes/s")
	flops := fs.Float64("flops", 0, "override the FLOP/s one GPU or rank achieves at mfu 1 (a --cluster of type cpu needs it: measure it on the machine)")
	docLen := fs.String("doc-len", "", "plan packed documents under a document mask (as data.document_mask = true) of this average length in tokens, e.g. 2048 or 2K (default with data.document_mask: web-like, mean 931)")
	docDist := fs.String("doc-dist", "lognormal", "the document lengths' distribution with --doc-len: lognormal (σ 1.3, web-like), exponential or fixed")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if *format != "text" && *format != "json" {
		return fmt.Errorf("plan: --format %q: want text or json", *format)
	}
	if err := cli.CheckRanges(fs, "the cluster's own value", []cli.Range{{Flag: "gpu-mem", Want: "bytes, e.g. 80e9", Min: 1e6},
		{Flag: "inter-bw", Want: "bytes/s, e.g. 25e9", Min: 1e3}, {Flag: "intra-bw", Want: "bytes/s, e.g. 450e9", Min: 1e3},
		{Flag: "flops", Want: "FLOP/s, e.g. 5e10", Min: 1e3}, {Flag: "mfu", Want: "a fraction in (0, 1]", Max: 1}, {Flag: "attn-mfu", Want: "a fraction in (0, 1]", Max: 1}}); err != nil {
		return err
	}
	cfg, err := config.Load(*configPath, sets)
	if err != nil {
		return err
	}
	req := plan.Request{Cluster: *clusterName, GPUMem: *gpuMem, InterBW: *interBW, IntraBW: *intraBW, FLOPS: *flops,
		Sweep: *sweep, Attention: *attention, DocLen: *docLen, DocDist: *docDist, DocDistGiven: cli.FlagSet(fs, "doc-dist")}
	if cli.FlagSet(fs, "mfu") {
		req.MFU = mfu
	}
	if cli.FlagSet(fs, "attn-mfu") {
		req.AttnMFU = attnMFU
	}
	rep, err := plan.Make(cfg, req)
	if err != nil {
		return err
	}
	return plan.Write(stdout, rep, *format)
}
