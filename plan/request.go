package plan

import (
	"fmt"
	"math"
	"strings"

	"distflash/config"
	"distflash/parallel"
	"distflash/sysmem"
)

// Request is what the plan command is asked: the cluster and how to override its preset, the
// sequence lengths and schedules to plan, and the documents. Zero values mean the defaults.
type Request struct {
	Cluster      string   // NODESxGPUSxTYPE; "" = DefaultCluster of parallelism.world_size
	MFU, AttnMFU *float64 // fractions of the peak (nil = the GPU type's); MFU sets AttnMFU too unless it is given
	GPUMem       float64  // overrides of the preset (0 = keep): bytes, bytes/s, FLOP/s
	InterBW      float64
	IntraBW      float64
	FLOPS        float64
	Sweep        string // seq_len=LO..HI; "" = data.seq_len
	Attention    string // all, a schedule name, or "" = parallelism.attention
	DocLen       string // average document length under a document mask; "" = none (or assumed)
	DocDist      string // its distribution; "" = lognormal
	DocDistGiven bool   // DocDist was asked for (it needs DocLen)
}

// Make plans cfg as req asks: one Plan per sequence length and schedule.
func Make(cfg config.Config, req Request) (Report, error) {
	var cl Cluster
	var err error
	if req.Cluster == "" {
		cl = DefaultCluster(dims(cfg).World)
	} else if cl, err = ParseCluster(req.Cluster); err != nil {
		return Report{}, err
	}
	for _, o := range []struct {
		name string
		v    *float64
		dst  []*float64
	}{{"mfu", req.MFU, []*float64{&cl.MFU, &cl.AttnMFU}}, {"attn-mfu", req.AttnMFU, []*float64{&cl.AttnMFU}}} {
		if o.v == nil {
			continue
		}
		if !(*o.v > 0 && *o.v <= 1) {
			return Report{}, fmt.Errorf("plan: --%s %g: must be in (0, 1]", o.name, *o.v)
		}
		for _, d := range o.dst {
			*d = *o.v
		}
	}
	for _, o := range []struct {
		name string
		v    float64
		dst  *float64
	}{{"--gpu-mem", req.GPUMem, &cl.GPU.MemBytes}, {"--inter-bw", req.InterBW, &cl.GPU.InterBW}, {"--intra-bw", req.IntraBW, &cl.GPU.IntraBW}, {"--flops", req.FLOPS, &cl.GPU.FLOPS}} {
		if o.v < 0 || math.IsNaN(o.v) || math.IsInf(o.v, 0) {
			return Report{}, fmt.Errorf("plan: %s %g: must be a positive number", o.name, o.v)
		}
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	if cl.GPU.Name == cpuType.Name && req.GPUMem == 0 {
		cl.MemSource = "assumed: this machine's memory cannot be read; --gpu-mem to set it"
		if avail, _, ok := sysmem.Available(); ok {
			cl.GPU.MemBytes = float64(avail) / float64(cl.GPUsPerNode)
			cl.MemSource = fmt.Sprintf("this machine's available %.1f GB over %d ranks per host; --gpu-mem to set it", float64(avail)/1e9, cl.GPUsPerNode)
		}
	}
	if cl.GPU.FLOPS == 0 {
		return Report{}, fmt.Errorf("plan: --cluster %s: the cpu type has no datasheet FLOP/s: give --flops, the rate one rank achieves on the machine (bench/netns_overlap.sh measures it)", cl)
	}
	if req.Cluster != "" {
		if cfg, err = FitToCluster(cfg, cl); err != nil {
			return Report{}, err
		}
	}
	dist := req.DocDist
	if dist == "" {
		dist = "lognormal"
	}
	var docs *DocLengths
	switch {
	case req.DocLen != "":
		d, err := ParseDocLengths(req.DocLen, dist)
		if err != nil {
			return Report{}, err
		}
		docs = &d
	case req.DocDistGiven:
		return Report{}, fmt.Errorf("plan: --doc-dist %q needs --doc-len, the average document length", dist)
	case cfg.Data.DocumentMask:
		docs = &DocLengths{Dist: "lognormal", Mean: DefaultDocLen, Assumed: true}
	}
	seqs := []int{cfg.Data.SeqLen}
	if req.Sweep != "" {
		if seqs, err = ParseSweep(req.Sweep); err != nil {
			return Report{}, err
		}
	}
	names := []string{cfg.Parallelism.Attention}
	switch req.Attention {
	case "":
	case "all":
		names = parallel.Names()
	default:
		if _, err := parallel.LayoutOf(req.Attention); err != nil {
			return Report{}, fmt.Errorf("plan: --attention %q: want all or one of %s", req.Attention, strings.Join(parallel.Names(), ", "))
		}
		names = []string{req.Attention}
	}
	rep := Report{Config: cfg.Path, Summary: cfg.Summary(), Layers: cfg.Model.NLayers, Cluster: cl}
	for _, s := range seqs {
		for _, n := range names {
			rep.Plans = append(rep.Plans, PlanWithDocs(cfg, cl, n, s, docs))
		}
	}
	return rep, nil
}
