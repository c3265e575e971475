package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"

	"distflash/config"
	"distflash/parallel"
	"distflash/plan"
)

// runPlan is the plan command.
func runPlan(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "TOML config file (default: the built-in defaults, which configs/tiny.toml writes out)")
	var sets setFlags
	fs.Var(&sets, "set", "override a config value, e.g. --set data.seq_len=262144 (repeatable)")
	clusterName := fs.String("cluster", "", "NODESxGPUSxTYPE, TYPE one of A100-40GB, A100-80GB, H100-80GB, H200-141GB, or cpu (ranks of the CPU backend; needs --flops) (default: world_size A100-80GB GPUs, 8 a node)")
	format := fs.String("format", "text", "text | json")
	sweep := fs.String("sweep", "", "seq_len=LO..HI: plan every seq_len from LO doubling to HI (K = 1024, M = 1024²)")
	attention := fs.String("attention", "", "all | a schedule name (default: parallelism.attention)")
	mfu := fs.Float64("mfu", 0, "achievable fraction of the GPU's peak FLOP/s in the dense products; also the attention's unless --attn-mfu is given (default: the GPU type's, measured for H100/H200: 0.22; 0.5 for A100, not measured; 1 for cpu)")
	attnMFU := fs.Float64("attn-mfu", 0, "achievable fraction of the GPU's peak FLOP/s in the attention kernels (default: --mfu when given, else the GPU type's, measured for H100/H200: 0.15; 0.5 for A100, not measured; 1 for cpu)")
	gpuMem := fs.Float64("gpu-mem", 0, "override the GPU memory, bytes (e.g. 80e9)")
	interBW := fs.Float64("inter-bw", 0, "override the inter-node bandwidth per GPU, bytes/s")
	intraBW := fs.Float64("intra-bw", 0, "override the intra-node bandwidth per GPU, bytes/s")
	flops := fs.Float64("flops", 0, "override the FLOP/s one GPU or rank achieves at mfu 1 (a --cluster of type cpu needs it: measure it on the machine)")
	docLen := fs.String("doc-len", "", "plan packed documents under a document mask (as data.document_mask = true) of this average length in tokens, e.g. 2048 or 2K (default with data.document_mask: web-like, mean 931)")
	docDist := fs.String("doc-dist", "lognormal", "the document lengths' distribution with --doc-len: lognormal (σ 1.3, web-like), exponential or fixed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("plan: unexpected arguments %q", fs.Args())
	}
	if *format != "text" && *format != "json" {
		return fmt.Errorf("plan: --format %q: want text or json", *format)
	}
	cfg, err := config.Load(*configPath, sets)
	if err != nil {
		return err
	}
	var cl plan.Cluster
	if *clusterName == "" {
		cl = plan.DefaultCluster(cfg.Parallelism.WorldSize)
	} else if cl, err = plan.ParseCluster(*clusterName); err != nil {
		return err
	}
	for _, o := range []struct {
		name string
		v    float64
		dst  []*float64
	}{{"mfu", *mfu, []*float64{&cl.MFU, &cl.AttnMFU}}, {"attn-mfu", *attnMFU, []*float64{&cl.AttnMFU}}} {
		if !flagSet(fs, o.name) {
			continue
		}
		if !(o.v > 0 && o.v <= 1) {
			return fmt.Errorf("plan: --%s %g: must be in (0, 1]", o.name, o.v)
		}
		for _, d := range o.dst {
			*d = o.v
		}
	}
	for _, o := range []struct {
		name string
		v    float64
		dst  *float64
	}{{"--gpu-mem", *gpuMem, &cl.GPU.MemBytes}, {"--inter-bw", *interBW, &cl.GPU.InterBW}, {"--intra-bw", *intraBW, &cl.GPU.IntraBW}, {"--flops", *flops, &cl.GPU.FLOPS}} {
		if o.v < 0 || math.IsNaN(o.v) || math.IsInf(o.v, 0) {
			return fmt.Errorf("plan: %s %g: must be a positive number", o.name, o.v)
		}
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	if cl.GPU.FLOPS == 0 {
		return fmt.Errorf("plan: --cluster %s: the cpu type has no datasheet FLOP/s: give --flops, the rate one rank achieves on the machine (bench/netns_overlap.sh measures it)", cl)
	}
	if *clusterName != "" {
		if cfg, err = plan.FitToCluster(cfg, cl); err != nil {
			return err
		}
	}
	var docs *plan.DocLengths
	switch {
	case *docLen != "":
		d, err := plan.ParseDocLengths(*docLen, *docDist)
		if err != nil {
			return err
		}
		docs = &d
	case flagSet(fs, "doc-dist"):
		return fmt.Errorf("plan: --doc-dist %q needs --doc-len, the average document length", *docDist)
	case cfg.Data.DocumentMask:
		docs = &plan.DocLengths{Dist: "lognormal", Mean: plan.DefaultDocLen, Assumed: true}
	}
	var seqs []int
	if *sweep != "" {
		if seqs, err = plan.ParseSweep(*sweep); err != nil {
			return err
		}
	} else {
		seqs = []int{cfg.Data.SeqLen}
	}
	names := []string{cfg.Parallelism.Attention}
	switch *attention {
	case "":
	case "all":
		names = parallel.Names()
	default:
		if _, err := parallel.LayoutOf(*attention); err != nil {
			return fmt.Errorf("plan: --attention %q: want all or one of %s", *attention, strings.Join(parallel.Names(), ", "))
		}
		names = []string{*attention}
	}
	rep := plan.Report{Config: cfg.Path, Summary: cfg.Summary(), Cluster: cl}
	for _, s := range seqs {
		for _, n := range names {
			rep.Plans = append(rep.Plans, plan.PlanWithDocs(cfg, cl, n, s, docs))
		}
	}
	if *format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	if len(rep.Plans) == 1 {
		plan.WriteDetail(stdout, rep)
	} else {
		plan.WriteTable(stdout, rep)
	}
	return nil
}

// flagSet reports whether flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
