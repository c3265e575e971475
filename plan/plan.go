// Package plan predicts, for a config on a cluster, the memory of one rank, the bytes one
// rank communicates in a step and the step time, per attention schedule: what the plan
// command prints (Make; Write: WriteDetail, WriteTable or JSON).
//
// Layer: plan imports config, kernels, model and parallel (it runs the schedules' own code
// to count their bytes); train and evaluate import it for their memory checks, and the command.
//
// Cluster presets (--cluster NODESxGPUSxTYPE, e.g. 2x8xA100-80GB):
//
//	TYPE        memory   dense bf16 FLOP/s   float32 FLOP/s   HBM B/s    intra-node (NVLink) B/s per GPU   inter-node B/s per GPU
//	A100-40GB   40 GB    312e12              19.5e12          1.555e12   300e9                             25e9 (200 Gb/s IB)
//	A100-80GB   80 GB    312e12              19.5e12          2.039e12   300e9                             25e9
//	H100-80GB   80 GB    989e12              67e12            3.35e12    450e9                             25e9
//	H200-141GB  141 GB   989e12              67e12            4.8e12     450e9                             25e9
//	cpu         16 GB    --flops (measured)  -                -          2e9 (shared memory)               62.5e6 (1 Gbit/s a host of 2)
//
// TYPE cpu is a rank of the CPU backend, e.g. on the hosts of scripts/netns-cluster.sh: its
// FLOP/s must be measured on the machine (bench/netns_overlap.sh does) and its mfu is 1.
// GB here is 10^9 bytes (the vendors' figures). --mfu and --attn-mfu are the fractions of the
// peak rate the GEMMs and the attention kernels achieve (the GPU type's: steptime.go, assumed
// for issue 41's 16-bit step); --gpu-mem, --intra-bw and --inter-bw override the preset.
//
// What a config leaves to the device (checkpoint.activation = "auto", training.mlp_tile and
// training.loss_chunk -1) is decided for the GPU's memory first (choice.go: the least
// recomputation whose step fits 90% of it), and the plan is of that choice; the detail says
// which and why, the table has the policy of each row.
//
// The model (every number is per rank and per optimizer step unless stated):
//
//   - Memory. Parameters: fp32 master weights (4 B) plus a low-precision copy (2 B) under bf16
//     or fp16; gradients fp32 (4 B); AdamW two fp32 moments (8 B); all divided by world_size
//     with fsdp. Activations for the n = batch_size × seq_len / sequence_parallel_degree
//     tokens of a micro-batch, counted buffer by buffer as the model allocates them
//     (ActivationBytes, checked against model.Model.ActivationBytes): in fp32 every field of
//     model.LayerActs in float32 (fp32Activations: none keeps every field of every block,
//     layer X of every block, attn_output X, AttnOut and Lse of every block, each recomputing
//     policy one block's full set besides; the MLP in tiles keeps one tile of Gate, Up and Act
//     instead), one loss chunk of float32 logits, the backward's scratch; in bf16 or fp16 the
//     16-bit step's packed buffers (halfActivations: two bytes a value but the residual
//     stream, the statistics and the logits).
//     Attention working set (an
//     estimate, not measured): two K/V receive buffers, the partial output, its statistics
//     and the dQ/dK/dV being accumulated: n × (2·qdim + 4·kvdim) elements + 2·heads fp32 per
//     token. Communication buffers with fsdp: two gathered blocks of weights (current and
//     prefetched) and one block's fp32 gradients. On the CPU (device.kind = "cpu") the Go
//     collector's headroom: train runs it at GOGC=10, and it holds freed pages a while, so 15%
//     of the rest (gcHeadroom, measured); and the process
//     outside its tensors (ProcessBase: the binary and the Go runtime; the training data's
//     tokens, 4 bytes each and at most one a byte of data.max_bytes; the checkpoint writer's
//     ckpt.ProcessWorkers workers), shared by the process's ranks. Peak = the sum; allocator
//     fragmentation and the CUDA context are not modelled, so keep a margin. With
//     eval.interval > 0, train's held-out evaluation besides (TrainEvalMemoryFor): the
//     training state beside a forward of eval.seq_len tokens.
//   - Communication. Attention: measured by running the schedule's own code (package parallel)
//     on sequence_parallel_degree in-process ranks with the model's heads at two short
//     sequence lengths and extrapolating linearly in the length (traffic is linear in the
//     tokens per rank: K/V/Q/dO blocks ∝ tokens·head_dim, statistics ∝ tokens·heads), so plan
//     and schedules cannot drift apart. The measuring ranks run at the run's precision, so the
//     bytes are the real ones: in bf16 or fp16 the schedules send q, k, v and dO packed in 16
//     bits, the statistics and gradients in float32 (model/operands.go). Per layer
//     forward + backward, × n_layers, with a second forward under checkpoint layer, for the
//     rank that sends the most in them (train's metrics attn_bytes is the same count). Under
//     a sliding window the windowed layers' bytes are measured with the window (planwindow.go). FSDP:
//     all-gather of the parameters twice (forward, backward) in the compute precision and a
//     reduce-scatter of the float32 gradients, each (P−1)/P × their bytes per micro-batch,
//     P = world_size. Without fsdp on more than one rank: one all-reduce of the float32
//     gradients, 2(P−1)/P × 4 bytes per parameter.
//   - Time. Dense FLOPs 6 × params × tokens per rank, plus 2 × block params × tokens of
//     recomputation under layer and attn_output. Causal attention forward 4·T²·qdim/2 per layer
//     and sequence, backward 2.5× forward (3.5× for both), one more forward under layer;
//     divided over the sequence-parallel ranks and stretched by 1/(1 − idle) with the schedule's
//     idle fraction (DistFlashAttn §3.2): ring and burst (P²−P)/(2P²), distflash 1/(2P) for even
//     P and 0 for odd P, zigzag, attn2d and ulysses 0; under document masking
//     (data.document_mask, --doc-len) the attention FLOPs scale by the visible fraction of the
//     pairs and the idle fraction is the documents' (plandocs.go in this package); under a
//     sliding window (model.sliding_window) a windowed layer's FLOPs scale by the pairs the
//     window leaves and its idle is the schedule's under the window (planwindow.go), each
//     class of layers stretched by its own idle. Compute time on a GPU: its parts as issue
//     41's 16-bit step runs them (steptime.go: the GEMMs' FLOPs at the rate native bf16 cuBLAS
//     reaches, the attention at cuDNN's or the own kernels', the other kernels' bytes and the
//     fused optimizer phase's at a fraction of HBM), printed part by part as a prediction; on
//     CPU ranks dense FLOPs / (--flops × mfu) + attention FLOPs / (--flops × attn_mfu).
//     Communication time: the attention bytes that cross between nodes (counted per peer in
//     the same in-process run, ranks placed on nodes in order) at the inter-node rate, the
//     others at the intra-node rate. The world's collectives on GPUs as NCCL's tuning model
//     prices them (collectives.go; NCCL v2.23.4-1, src/graph/tuning.cc, Simple protocol), call
//     by call: a latency plus the bytes at a bus bandwidth. The ring's bus bandwidth is the
//     intra-node rate, and between nodes that capped by its crossing edges' share, their
//     node's whole network (GPUs per node × inter-node rate); its latency 8.4 µs a call plus
//     one step per hop of its path, P−1 hops for an all-gather or reduce-scatter and 2(P−1)
//     for an all-reduce, 3.4 µs over NVLink and 14 µs for the n−1 (2(n−1)) between n nodes
//     (× 1.4 for an all-reduce between nodes). The all-reduce may instead run as NCCL's double
//     binary tree between nodes with a chain inside each: 2 × its buffer at 0.92 of the bus
//     bandwidth (NCCL's size correction on top), latency 8.4 µs + 2·((g−1)·4 µs + ⌊log2 n⌋·14
//     µs) for g GPUs a node; like NCCL, plan takes whichever it predicts faster for the call's
//     size (small calls on many nodes: the tree; large ones and one node: the ring) and says
//     which. Train all-reduces the gradient in one call a step; FSDP runs 3L+5 ring calls a
//     micro-batch (every unit gathered in the forward, all but the embedding in the backward,
//     every unit's gradient reduce-scattered). On CPU ranks the collectives run as Open MPI's
//     non-blocking collectives do, linear exchanges where every rank sends each other rank its
//     chunk directly, so (P − g)/(P − 1) of the bytes cross between nodes of g ranks, with no
//     latency priced (worldCollectives). With overlap_comm each layer takes max(compute,
//     attention + fsdp communication), else their sum; the work is spread evenly over the
//     layers, so the step is max or sum of the totals; the data-parallel gradient all-reduce
//     runs after the backward pass and adds to the step either way.
package plan

import (
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"distflash/ckpt"
	"distflash/config"
	"distflash/kernels"
	"distflash/model"
	"distflash/parallel"
	"distflash/parallel/transport"
)

// GPUType is a GPU model's memory, achievable peak and link bandwidths.
type GPUType struct {
	Name      string  `json:"name"`
	MemBytes  float64 `json:"mem_bytes"`  // device memory
	FLOPS     float64 `json:"flops"`      // dense bf16 peak, FLOP/s
	FP32FLOPS float64 `json:"fp32_flops"` // float32 peak (no tensor cores), FLOP/s
	HBMBW     float64 `json:"hbm_bw"`     // device memory bandwidth, bytes/s
	IntraBW   float64 `json:"intra_bw"`   // NVLink bytes/s per GPU inside a node
	InterBW   float64 `json:"inter_bw"`   // network bytes/s per GPU between nodes
	MFU       float64 `json:"mfu"`        // fraction of the peak distflash's GEMMs reach (gemmFraction)
	AttnMFU   float64 `json:"attn_mfu"`   // fraction of the peak cuDNN's fused attention reaches (cudnnAttnFraction)
	// OwnAttnMFU is the fraction the own FlashAttention-2 kernels reach (ownAttnFraction):
	// device.attention = own, or an fp32 run.
	OwnAttnMFU float64 `json:"own_attn_mfu"`
	// Efficiency says where MFU and AttnMFU come from: measured, and on what, or assumed.
	Efficiency string `json:"efficiency"`
}

// gpuTypes are the presets of the table in the file comment.
var gpuTypes = []GPUType{
	{"A100-40GB", 40e9, 312e12, 19.5e12, 1.555e12, 300e9, 25e9, gemmFraction, cudnnAttnFraction, ownAttnFraction, ampereEfficiency},
	{"A100-80GB", 80e9, 312e12, 19.5e12, 2.039e12, 300e9, 25e9, gemmFraction, cudnnAttnFraction, ownAttnFraction, ampereEfficiency},
	{"H100-80GB", 80e9, 989e12, 67e12, 3.35e12, 450e9, 25e9, gemmFraction, cudnnAttnFraction, ownAttnFraction, hopperEfficiency},
	{"H200-141GB", 141e9, 989e12, 67e12, 4.8e12, 450e9, 25e9, gemmFraction, cudnnAttnFraction, ownAttnFraction, "the H100's (the same SMs): " + hopperEfficiency},
}

// hopperEfficiency says where the Hopper fractions come from (steptime.go). The fit this plan
// used before issue 41 (0.22 dense and 0.15 attention from two step times of the fp32-storage
// path on one H200) did not hold at 64K and 128K (the review's §0), and the path it described
// is gone.
const hopperEfficiency = "predicted, not measured on distflash's 16-bit step: GEMMs as native bf16 cuBLAS runs (torchtitan, llm.c), attention as cuDNN's SDPA ran in PyTorch on an H100, memory-bound kernels at 0.78 of HBM"

// ampereEfficiency is the A100's, which no run has measured: the Hopper fractions, so that a
// plan never ranks an A100 above an H100 on a guess (an A100 run would replace it).
const ampereEfficiency = "assumed the H100's fractions: not measured on an A100"

// cpuType is a rank of the CPU backend (--cluster NODESxRANKSxcpu, e.g. the hosts of
// scripts/netns-cluster.sh): its FLOP/s is measured, not a datasheet figure, so --flops must
// give it (bench/netns_overlap.sh derives it from a run on the hosts with unshaped links) and mfu
// is 1; memory per rank this machine's available memory shared by a host's ranks (16 GB where
// it cannot be read), within a host 2 GB/s (MPI's shared memory), between hosts 1 Gbit/s per
// host shared by its ranks, unless --gpu-mem, --intra-bw, --inter-bw say otherwise.
var cpuType = GPUType{Name: "cpu", MemBytes: 16e9, IntraBW: 2e9, InterBW: 125e6 / 2, Efficiency: "--flops, measured on the hosts"}

// Cluster is the machine a plan is made for.
type Cluster struct {
	Nodes       int     `json:"nodes"`
	GPUsPerNode int     `json:"gpus_per_node"`
	GPU         GPUType `json:"gpu"`
	MFU         float64 `json:"mfu"`      // achievable fraction of the peak rate in the dense products
	AttnMFU     float64 `json:"attn_mfu"` // and in the attention kernels
	// MemSource says where a cpu cluster's memory per rank comes from ("" for a GPU's datasheet).
	MemSource string `json:"mem_source,omitempty"`
}

// String writes the cluster as a preset name.
func (c Cluster) String() string { return fmt.Sprintf("%dx%dx%s", c.Nodes, c.GPUsPerNode, c.GPU.Name) }

// GPUs is the number of GPUs in all.
func (c Cluster) GPUs() int { return c.Nodes * c.GPUsPerNode }

// unit names one of the cluster's ranks in the printed plan: "rank" for CPU ranks, "GPU".
func (c Cluster) unit() string {
	if c.GPU.Name == cpuType.Name {
		return "rank"
	}
	return "GPU"
}

// ParseCluster reads NODESxGPUSxTYPE, e.g. 2x8xA100-80GB.
func ParseCluster(s string) (Cluster, error) {
	parts := strings.SplitN(s, "x", 3)
	var names []string
	for _, g := range gpuTypes {
		names = append(names, g.Name)
	}
	if len(parts) != 3 {
		return Cluster{}, fmt.Errorf("--cluster %q: want NODESxGPUSxTYPE, e.g. 2x8xA100-80GB, with TYPE one of %s or cpu", s, strings.Join(names, ", "))
	}
	nodes, err1 := strconv.Atoi(parts[0])
	gpus, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || nodes < 1 || gpus < 1 {
		return Cluster{}, fmt.Errorf("--cluster %q: NODES and GPUS must be positive integers", s)
	}
	if strings.EqualFold(parts[2], cpuType.Name) {
		return Cluster{Nodes: nodes, GPUsPerNode: gpus, GPU: cpuType, MFU: 1, AttnMFU: 1}, nil
	}
	for _, g := range gpuTypes {
		if strings.EqualFold(g.Name, parts[2]) {
			return Cluster{Nodes: nodes, GPUsPerNode: gpus, GPU: g, MFU: g.MFU, AttnMFU: g.AttnMFU}, nil
		}
	}
	return Cluster{}, fmt.Errorf("--cluster %q: unknown GPU type %q: want one of %s or cpu", s, parts[2], strings.Join(names, ", "))
}

// MemoryPlan is one rank's memory, in bytes.
type MemoryPlan struct {
	Params          float64 `json:"params"`           // fp32 master (+ low-precision copy)
	Grads           float64 `json:"grads"`            // fp32 gradients
	Optimizer       float64 `json:"optimizer"`        // AdamW moments
	Activations     float64 `json:"activations"`      // saved per checkpoint policy
	Logits          float64 `json:"logits"`           // fp32 logits and final-norm outputs
	BackwardScratch float64 `json:"backward_scratch"` // gradient temporaries of one block
	AttnWork        float64 `json:"attn_work"`        // attention working set (estimate)
	AttnKernel      float64 `json:"attn_kernel"`      // bf16/fp16: the packed attention operands (and their float32 widening on the CPU); on a GPU cuDNN's outputs and workspace
	CommBuffers     float64 `json:"comm_buffers"`     // fsdp gather/scatter buffers
	Runtime         float64 `json:"runtime"`          // on the CPU: the Go collector's headroom over the rest
	Process         float64 `json:"process"`          // on the CPU: the rank's share of the process outside its tensors (ProcessBase, the data's tokens, the held-out samples of an evaluation during training, the checkpoint writer)
	Peak            float64 `json:"peak"`
	Capacity        float64 `json:"capacity"`
	Margin          float64 `json:"margin"` // capacity − peak (negative: does not fit)
	Fits            bool    `json:"fits"`
}

// CommPlan is the bytes one rank sends in a step.
type CommPlan struct {
	Attention      float64 `json:"attention"`        // the schedule's traffic, all layers
	AttnInterNode  float64 `json:"attn_inter_node"`  // the part of it that crosses between nodes
	InterNode      float64 `json:"inter_node"`       // all bytes that cross between nodes (attention, fsdp, data-parallel)
	AttnPerLayer   float64 `json:"attn_per_layer"`   // forward + backward of one layer, one micro-batch
	AttnTotalLayer float64 `json:"attn_total_layer"` // the same summed over the sequence-parallel ranks
	FSDP           float64 `json:"fsdp"`
	DataParallel   float64 `json:"data_parallel"`
	Total          float64 `json:"total"`
}

// TimePlan is the predicted step time, in seconds.
type TimePlan struct {
	DenseFLOPs   float64 `json:"dense_flops"` // per rank
	AttnFLOPs    float64 `json:"attn_flops"`  // per rank, before the idle stretch
	IdleFraction float64 `json:"idle_fraction"`
	Compute      float64 `json:"compute_s"`
	Comm         float64 `json:"comm_s"`
	Step         float64 `json:"step_s"`
	Overlap      bool    `json:"overlap"`
	AttnLinkBW   float64 `json:"attn_link_bw"`
	// WorldLinkBW is the bandwidth of the world's collectives: NCCL's ring bus bandwidth on
	// GPUs, Open MPI's mix of the two link classes on CPU ranks (worldCollectives).
	WorldLinkBW float64 `json:"world_link_bw"`
	// FSDP and DataParallel are the time of FSDP's all-gathers and reduce-scatters and of the
	// gradient all-reduce, with the algorithm that runs them (collectives.go); both are in Comm.
	FSDP         CollectiveTime `json:"fsdp"`
	DataParallel CollectiveTime `json:"data_parallel"`
	// Components are a GPU's compute time by part (gpuStepTime: GEMMs, attention, elementwise
	// kernels, the optimizer phase), predictions from assumed rates; Compute is their sum. None
	// on CPU ranks, whose compute is the FLOPs at --flops.
	Components []TimeComponent `json:"components,omitempty"`
}

// Plan is the prediction for one config, schedule and sequence length on a cluster.
type Plan struct {
	Attention    string      `json:"attention"`
	SeqLen       int         `json:"seq_len"`
	TokensPerGPU int         `json:"tokens_per_gpu"` // per micro-batch
	Refused      string      `json:"refused,omitempty"`
	Memory       MemoryPlan  `json:"memory"`
	Comm         CommPlan    `json:"comm"`
	Time         TimePlan    `json:"time"`
	MaxSeqPerGPU int         `json:"max_seq_per_gpu"`     // longest tokens per GPU that fit, multiple of 1024 (0: under 1024)
	Docs         *DocPlan    `json:"documents,omitempty"` // document masking (data.document_mask, --doc-len)
	Window       *WindowPlan `json:"window,omitempty"`    // the sliding window (model.sliding_window)
	// Eval is the memory per rank during train's held-out evaluation (eval.interval > 0:
	// TrainEvalMemoryFor), and EvalMaxSeqLen the longest eval.seq_len whose Eval fits.
	// EvalSeqLen is the length it scores (eval.seq_len, else data.seq_len).
	Eval          *MemoryPlan `json:"eval_memory,omitempty"`
	EvalSeqLen    int         `json:"eval_seq_len,omitempty"`
	EvalMaxSeqLen int         `json:"eval_max_seq_len,omitempty"`
	// Choice is what the config left to the device (checkpoint.activation = "auto",
	// training.mlp_tile or loss_chunk -1), decided for this GPU's memory (Choose); nil when it
	// left nothing. Memory and Time are of the choice.
	Choice *Choice `json:"choice,omitempty"`
}

// Report is what plan prints: the config, the cluster and one plan per row.
type Report struct {
	Config  string  `json:"config"`
	Layers  int     `json:"n_layers"` // the model's layers`
	Summary string  `json:"summary"`
	Cluster Cluster `json:"cluster"`
	Plans   []Plan  `json:"plans"`
}

// defaultCluster is world A100-80GB GPUs, 8 a node.
func DefaultCluster(world int) Cluster {
	c := Cluster{Nodes: 1, GPUsPerNode: world, GPU: gpuTypes[1], MFU: gpuTypes[1].MFU, AttnMFU: gpuTypes[1].AttnMFU}
	if world > 8 {
		c.Nodes, c.GPUsPerNode = (world+7)/8, 8
	}
	return c
}

// fitToCluster re-plans cfg for the cluster's GPUs: world_size becomes the number of GPUs, and
// sequence_parallel_degree follows when it was the whole world; otherwise the GPUs must form
// whole sequence-parallel groups.
func FitToCluster(cfg config.Config, cl Cluster) (config.Config, error) {
	p := &cfg.Parallelism
	if cl.GPUs() == p.WorldSize {
		return cfg, nil
	}
	if p.SequenceParallelDegree == p.WorldSize {
		p.SequenceParallelDegree = cl.GPUs()
	} else if cl.GPUs()%p.SequenceParallelDegree != 0 {
		return cfg, fmt.Errorf("plan: cluster %s has %d %ss, not a multiple of parallelism.sequence_parallel_degree = %d", cl, cl.GPUs(), cl.unit(), p.SequenceParallelDegree)
	}
	p.WorldSize = cl.GPUs()
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("plan: on cluster %s (world_size %d): %w", cl, p.WorldSize, err)
	}
	return cfg, nil
}

// parseSweep reads seq_len=LO..HI (or data.seq_len=LO..HI) into LO, 2·LO, … ≤ HI.
func ParseSweep(s string) ([]int, error) {
	key, rng, ok := strings.Cut(s, "=")
	if !ok || (key != "seq_len" && key != "data.seq_len") {
		return nil, fmt.Errorf("--sweep %q: want seq_len=LO..HI, e.g. seq_len=8K..512K", s)
	}
	los, his, ok := strings.Cut(rng, "..")
	lo, err1 := ParseTokens(los)
	hi, err2 := ParseTokens(his)
	if !ok || err1 != nil || err2 != nil || lo < 1 || hi < lo {
		return nil, fmt.Errorf("--sweep %q: want seq_len=LO..HI with 1 <= LO <= HI, sizes like 8192, 8K or 1M", s)
	}
	var out []int
	for v := lo; v <= hi; v *= 2 {
		out = append(out, v)
	}
	return out, nil
}

// ParseTokens reads a token count: 8192, 8K (×1024) or 1M (×1024²).
func ParseTokens(s string) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "K") || strings.HasSuffix(s, "k"):
		mult, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "M") || strings.HasSuffix(s, "m"):
		mult, s = 1<<20, s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > math.MaxInt32/mult {
		return 0, fmt.Errorf("size %q", s)
	}
	return n * mult, nil
}

// elemBytes is the size of an activation or communicated element in the compute precision.
func elemBytes(cfg config.Config) float64 {
	if cfg.Training.MixedPrecision == "fp32" {
		return 4
	}
	return 2
}

// gcHeadroom is the resident memory the Go heap holds beyond the live tensors, as a fraction of
// them: the 10% the collector lets the heap grow by before a collection under the GOGC of a
// training run (package train sets 10), and the pages it has freed but not yet returned to the
// system. With 10% alone, the peak resident set was 1.02–1.04 of the estimate (the 125M-class
// model at 1K and 8K tokens, bench/memory.sh; the tiny model at 16K and 32K); with 15%,
// 0.96–1.04 (EstimateError).
const gcHeadroom = 0.15

// ProcessBase is the resident memory of a distflash process outside the tensors, the data and
// the checkpoint writer: the binary's code and data (25 MB on disk), the Go runtime's
// structures and stacks. Measured on linux/amd64: peak RSS from /usr/bin/time less the
// tensors' estimate was 40 to 52 MB for the tiny model at 1K to 8K tokens, GOMAXPROCS 1 to 4,
// which held 4 MiB of tokens and one to four writer workers besides (dataBytes and
// ckpt.WorkerBytes count those).
const ProcessBase = 32 << 20

// localRanks is how many of the world's ranks one process runs, by world.Launch's rule: one
// under MPI (parallelism.backend = "mpi", which Launch sets when mpirun or srun started the
// process), else all of them (inproc, and NCCL over the in-process world).
func localRanks(cfg config.Config) int {
	if cfg.Parallelism.Backend == "mpi" {
		return 1
	}
	return max(1, cfg.Parallelism.WorldSize)
}

// dataBytes bounds the training data a process holds: for each source (data.train, or each
// [[data.sources]] table, each read up to data.max_bytes) its tokens as int32, at most one a
// byte of text, and its loader's window order, one int a window of data.seq_len tokens. A
// tokenized set (format "tokens") or an unbounded read (data.max_bytes = 0) is not known
// before it is read, and counts 0.
func dataBytes(cfg config.Config) float64 {
	var n float64
	for _, s := range cfg.Data.TrainSources() {
		if s.Format == "tokens" || cfg.Data.MaxBytes <= 0 {
			continue
		}
		tokens := float64(cfg.Data.MaxBytes)
		n += 4*tokens + 8*math.Ceil(tokens/float64(max(cfg.Data.SeqLen, 1)))
	}
	return n
}

// actElemBytes is the size of one element of the activation, logits, scratch and attention
// buffers: the model allocates them as kernels.Buf, float32 on every backend, whatever
// training.mixed_precision.
const actElemBytes = 4

// actField is the width of one model.LayerActs field per token, in elements, and whether it
// is kept in fp32 (statistics) rather than the compute precision.
type actField struct {
	width func(m model.Config) int
	fp32  bool
}

// actFields sizes every field of model.LayerActs; TestPlanActFieldsCoverLayerActs checks that
// none is missing.
var actFields = map[string]actField{
	"X":       {func(m model.Config) int { return m.Dim }, false},
	"Norm1":   {func(m model.Config) int { return m.Dim }, false},
	"Rstd1":   {func(m model.Config) int { return 1 }, true},
	"Q":       {func(m model.Config) int { return m.QDim() }, false},
	"K":       {func(m model.Config) int { return m.KVDim() }, false},
	"V":       {func(m model.Config) int { return m.KVDim() }, false},
	"AttnOut": {func(m model.Config) int { return m.QDim() }, false},
	"Lse":     {func(m model.Config) int { return m.NHeads }, true},
	"H":       {func(m model.Config) int { return m.Dim }, false},
	"Norm2":   {func(m model.Config) int { return m.Dim }, false},
	"Rstd2":   {func(m model.Config) int { return 1 }, true},
	"Gate":    {func(m model.Config) int { return m.FFNDim }, false},
	"Up":      {func(m model.Config) int { return m.FFNDim }, false},
	"Act":     {func(m model.Config) int { return m.FFNDim }, false},
}

// keptFields are the LayerActs fields every block keeps under each checkpoint policy (nil:
// all of them).
var keptFields = map[string][]string{
	"none":        nil,
	"layer":       {"X"},
	"attn_output": {"X", "AttnOut", "Lse"},
}

// actBytesPerToken is the bytes per token of the named LayerActs fields (all when names is nil).
func actBytesPerToken(cfg config.Config, names []string, elem float64) float64 {
	if names == nil {
		for _, f := range reflect.VisibleFields(reflect.TypeFor[model.LayerActs]()) {
			names = append(names, f.Name)
		}
	}
	var b float64
	for _, n := range names {
		f, ok := actFields[n]
		if !ok {
			panic("plan: model.LayerActs field " + n + " has no size in actFields")
		}
		e := elem
		if f.fp32 {
			e = 4
		}
		b += float64(f.width(cfg.Model)) * e
	}
	return b
}

// CUDNNDeterministicCap is the most workspace a deterministic cuDNN backward block may ask
// for (device.deterministic_attention; kernels/cuda_cudnn.go, cudnnDeterministicCap): larger
// blocks run the own kernel.
const CUDNNDeterministicCap = 256 << 20

// attnKernelBytes is what the attention holds besides the schedule's float32 buffers, for
// blocks of n queries and n keys (a rank's tokens; Ulysses' all-token blocks of its heads hold
// as many values), in a bf16 or fp16 run (nothing in float32). On every device the operands the
// schedules keep packed in 16 bits (model/operands.go): q, k, v, O and dO (q, k, v in an
// evaluation, backward false). On the CPU the float32 values its kernels widen them into for a
// call (q, k, v and dO at once). On a GPU with cuDNN (device.attention auto or cudnn): cuDNN's
// 16-bit output and O′, dO, dq, dk and dv, the statistics (float32, a ragged block's padded up
// to twice), and its workspace: the float32 dQ accumulator and softmax_sum of the
// non-deterministic backward, or up to CUDNNDeterministicCap with
// device.deterministic_attention (cuDNN's own workspace for these graphs is small and not
// counted). The own GPU kernels read the packed operands as they are.
func attnKernelBytes(cfg config.Config, n float64, backward bool) float64 {
	if cfg.Training.MixedPrecision == "fp32" {
		return 0
	}
	m := cfg.Model
	q, kv, h := float64(m.QDim()), float64(m.KVDim()), float64(m.NHeads)
	packed, widened := 2*n*(3*q+2*kv), 4*n*(2*q+2*kv) // q, k, v, O, dO; q, k, v, dO
	if !backward {
		packed, widened = 2*n*(q+2*kv), 4*n*(q+2*kv)
	}
	switch {
	case cfg.Device.Kind != "cuda":
		return packed + widened
	case cfg.Device.Attention == "own":
		return packed
	case !backward:
		return packed + 2*n*q + 2*4*h*n // o_b, statistics
	}
	out := 2*n*(3*q+2*kv) + 2*4*h*n // O′ (or o_b), dO, dq, dk, dv; statistics
	ws := 4*n*q + 4*h*n             // dQ accumulator, softmax_sum
	if cfg.Device.DeterministicAttention {
		ws = CUDNNDeterministicCap + 4*h*n
	}
	return packed + out + ws
}

// MemoryFor is one rank's memory for cfg (data.seq_len as set) with capacity bytes. What cfg
// leaves to the device (checkpoint.activation = "auto", training.mlp_tile or loss_chunk -1) is
// decided for capacity first (Choose).
func MemoryFor(cfg config.Config, capacity float64) MemoryPlan {
	cfg = Resolved(cfg, capacity)
	m, p, dm := cfg.Model, cfg.Parallelism, dims(cfg)
	N := m.ParamCount()
	e := elemBytes(cfg)
	shard := 1.0
	if p.FSDP {
		shard = float64(dm.World)
	}
	var mp MemoryPlan
	mp.Params = config.WeightBytesPerParam * N / shard
	if e < 4 {
		mp.Params += e * N / shard
	}
	mp.Grads = config.GradBytesPerParam * N / shard
	mp.Optimizer = config.OptimizerBytesPerParam * N / shard
	n := float64(cfg.Data.BatchSize) * float64(cfg.Data.SeqLen) / float64(dm.SP)
	q, kv := float64(m.QDim()), float64(m.KVDim())
	a := float64(actElemBytes)
	// The MLP in tiles (training.mlp_tile) keeps no [tokens, ffn] tensor: its gate, up and
	// activation exist for one tile, in the forward and, recomputed, in the backward.
	tile := n
	if t := cfg.Training.MLPTile; t > 0 {
		tile = min(n, float64(t))
	}
	chunk := n // the logits exist one loss chunk at a time (training.loss_chunk)
	if c := cfg.Training.LossChunk; c > 0 {
		chunk = min(n, float64(c))
	}
	if e < 4 {
		mp.Activations, mp.Logits, mp.BackwardScratch = halfActivations(cfg, n, tile, chunk)
	} else {
		mp.Activations, mp.Logits, mp.BackwardScratch = fp32Activations(cfg, n, tile, chunk)
	}
	mp.AttnWork = n * (a*(2*q+4*kv) + 8*float64(m.NHeads))
	mp.AttnKernel = attnKernelBytes(cfg, n, true)
	if p.FSDP && dm.World > 1 {
		L := float64(m.NLayers)
		block := float64(m.NumParams()-2*int64(m.VocabSize)*int64(m.Dim)-int64(m.Dim)) / L
		mp.CommBuffers = 2*block*e + block*4
	}
	mp.Peak = mp.Params + mp.Grads + mp.Optimizer + mp.Activations + mp.Logits + mp.BackwardScratch + mp.AttnWork + mp.AttnKernel + mp.CommBuffers
	if cfg.Device.Kind == "cpu" {
		// train runs the collector at GOGC=10: the heap grows past what is live before a
		// collection (device memory has no such headroom); and the process outside its tensors
		// (with the held-out samples of an evaluation during training)
		mp.Runtime = gcHeadroom * mp.Peak
		mp.Process = (ProcessBase + dataBytes(cfg) + evalBytes(cfg) + ckpt.ProcessWorkers*float64(ckpt.WorkerBytes(0))) / float64(localRanks(cfg))
		mp.Peak += mp.Runtime + mp.Process
	}
	mp.Capacity = capacity
	mp.Margin = capacity - mp.Peak
	mp.Fits = mp.Margin >= 0
	return mp
}

// fp32Activations is the float32 step's share of MemoryPlan (training.mixed_precision fp32):
// the buffers of model.Model.ActivationBytes for n tokens of a micro-batch, the MLP in tiles of
// tile tokens (n: whole), the logits in chunks of chunk tokens (n: at once), every one
// float32. Saved activations: every field of model.LayerActs for every block under none
// (actFields), or each block's X (layer) or X, AttnOut and Lse (attn_output) with one block's
// full set as the recompute scratch; with the MLP in tiles no block keeps Gate, Up or Act, one
// tile of each instead. Logits and head: one chunk of logits (their gradient reuses the
// buffer), the last block's output, the final norm's output and rstd, the per-token losses.
// Backward scratch: model.gradScratch's buffers (the MLP's three a tile long).
func fp32Activations(cfg config.Config, n, tile, chunk float64) (acts, logits, scratch float64) {
	m := cfg.Model
	L := float64(m.NLayers)
	d, q, kv, f := float64(m.Dim), float64(m.QDim()), float64(m.KVDim()), float64(m.FFNDim)
	a := float64(actElemBytes)
	full := actBytesPerToken(cfg, nil, a)
	kept := actBytesPerToken(cfg, keptFields[cfg.Checkpoint.Activation], a)
	if tile < n {
		full -= 3 * f * a
		if cfg.Checkpoint.Activation == "none" {
			kept = full
		}
		acts += 3 * tile * f * a
	}
	if cfg.Checkpoint.Activation == "none" {
		acts += n * L * kept
	} else {
		acts += n * (L*kept + full)
	}
	logits = chunk*float64(m.VocabSize)*4 + n*(2*d*a+4+4) // logits of a chunk; last block output, final norm, rstd, losses
	scratch = n*a*(3*d+2*q+2*kv) + tile*a*3*f
	return acts, logits, scratch
}

// halfActivations is the 16-bit step's share of MemoryPlan (training.mixed_precision bf16 or
// fp16: issue 41's step, where every activation between kernels is packed, two bytes a value,
// but the residual stream, the statistics and the logits): the buffers of
// model.Model.ActivationBytes for n tokens of a micro-batch, the MLP in tiles of tile tokens
// (n: whole), the logits in chunks of chunk tokens (n: at once).
//
//   - A block's full set: its input X, H = X + attention, the two norms' outputs, q, k and v
//     after RoPE, the attention output (packed, D, D, D, D, Q, KV, KV, Q a token), the lse
//     and the two norms' rstd (float32, heads + 2 a token), gate‖up and the activation
//     (packed, 2F + F a token; with the MLP in tiles, one tile of them for all blocks
//     instead). Under none every block keeps its full set; under attn_output each keeps X,
//     the attention output and the lse, under layer X, and one full set is the recompute
//     scratch.
//   - The residual stream (float32 [n, D]) and the fused q|k|v projection before RoPE (packed
//     [n, Q+2·KV]).
//   - The head: the final norm's output (packed [n, D]) and rstd, the per-token losses, a
//     chunk's logits (float32 [chunk, V]) and their gradient (packed [chunk, V]).
//   - The backward's temporaries: dx (float32 [n, D]) and its packed copy for the GEMMs,
//     dnorm (packed [n, D]), dqkv (packed [n, Q+2·KV]), dq, dk, dv and dattn (packed), dgu
//     (packed [tile, 2F]) and dact (packed [tile, F]).
func halfActivations(cfg config.Config, n, tile, chunk float64) (acts, logits, scratch float64) {
	m := cfg.Model
	const h, s = 2, 4 // a packed value, a float32
	L := float64(m.NLayers)
	d, q, kv, f, heads, v := float64(m.Dim), float64(m.QDim()), float64(m.KVDim()), float64(m.FFNDim), float64(m.NHeads), float64(m.VocabSize)
	policy := cfg.Checkpoint.Activation
	tiled := tile < n
	mlp := 0.0 // gate‖up and act of a token, where a block holds them whole
	if !tiled {
		mlp = h * 3 * f
	}
	// kept per block, a token: X, N1, Q, K, V, O, H, N2 packed, the two 1/rms and the lse
	// (none); X (layer); X, O and the lse (attn_output)
	perBlock := map[string]float64{
		"none":        h*(4*d+2*q+2*kv) + s*(2+heads) + mlp,
		"attn_output": h*(d+q) + s*heads,
		"layer":       h * d,
	}[policy]
	acts = n * L * perBlock
	if policy != "none" { // the recomputation's scratch: N1, Q, K, V, H, N2, the 1/rms
		work := h*(3*d+q+2*kv) + s*2 + mlp
		if policy == "layer" {
			work += h*q + s*heads // the attention output and lse, recomputed too
		}
		acts += n * work
	}
	if tiled {
		acts += tile * h * 3 * f // a tile's gate‖up and act
	}
	acts += n * (s*d + h*(q+2*kv)) // the float32 stream, q‖k‖v
	// the head: the final norm's input and output and 1/rms, the per-token losses, a chunk's
	// float32 logits and packed dlogits
	logits = chunk*v*(s+h) + n*(2*h*d+s+s)
	// the backward: dx (float32) and its packed copy, dnorm, dattn, dq, dk, dv, dq‖dk‖dv, and a
	// tile's dgate‖dup and dact
	scratch = n*(s*d+2*h*d+2*h*q+2*h*kv+h*(q+2*kv)) + min(tile, n)*h*3*f
	return acts, logits, scratch
}

// ActivationBytes is what MemoryFor counts of the buffers model.Model.ActivationBytes reports
// (the saved activations, the logits and head, the backward scratch) for cfg's micro-batch of
// data.batch_size × data.seq_len / sequence_parallel_degree tokens on one rank, with what cfg
// leaves to the device decided for capacity bytes (0: not known).
func ActivationBytes(cfg config.Config, capacity float64) float64 {
	mp := MemoryFor(cfg, capacity)
	return mp.Activations + mp.Logits + mp.BackwardScratch
}

// MaxTokensPerGPU is the longest tokens per GPU (a multiple of 1024, data.seq_len =
// tokens × sequence_parallel_degree) whose peak memory fits capacity; 0 if none does.
func MaxTokensPerGPU(cfg config.Config, capacity float64) int {
	fits := func(k int) bool {
		cfg.Data.SeqLen = k * 1024 * dims(cfg).SP
		return MemoryFor(cfg, capacity).Fits
	}
	return LargestFitting(fits, 1<<20) * 1024
}

// LargestFitting is the largest k ≥ 1 with fits(k), for a fits that holds up to some k and
// not past it: doubling until it fails (or k reaches limit), then bisecting; 0 when fits(1)
// does not hold.
func LargestFitting(fits func(k int) bool, limit int) int {
	if !fits(1) {
		return 0
	}
	lo, hi := 1, 2
	for fits(hi) && hi < limit {
		lo, hi = hi, hi*2
	}
	for hi-lo > 1 {
		if mid := (lo + hi) / 2; fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// IdleFraction is the average fraction of the time a rank of schedule name on P ranks waits
// for the others under the causal mask (DistFlashAttn §3.2): ring (and Burst, which keeps its
// contiguous split) (P²−P)/(2P²); DistFlashAttn's load-balanced schedule 1/(2P) for even P
// and 0 for odd P; zigzag, attn2d and Ulysses balance the causal work exactly: 0.
func IdleFraction(name string, P int) float64 {
	if P <= 1 {
		return 0
	}
	p := float64(P)
	switch name {
	case "ring", "burst":
		return (p*p - p) / (2 * p * p)
	case "distflash":
		if P%2 == 0 {
			return 1 / (2 * p)
		}
	}
	return 0
}

// maxTrafficRanks is the largest sequence-parallel group plan simulates in process.
const maxTrafficRanks = 64

// traffic is one schedule's measured bytes (at the run's precision: 16-bit operands in a bf16
// or fp16 run) for one layer and one sequence of T tokens: bytes(T) = a·T + b for each rank and summed over ranks,
// forward and backward apart.
type traffic struct {
	fwd, bwd                           []line  // each rank's
	fwdTotA, fwdTotB, bwdTotA, bwdTotB float64 // all ranks
	// peer[r][d] is the bytes rank r sent to rank d point to point (Isend) at the longer
	// sequence, other the bytes sent by collectives, whose peers the schedule does not name.
	peer  [][]float64
	other float64
}

// crossFraction is the fraction of the schedule's bytes that cross between nodes of g ranks
// each (ranks 0..g-1 on the first node, as mpirun places them by slot): point-to-point
// bytes by their peers, collective bytes as if spread evenly over the other ranks.
func (t traffic) crossFraction(g int) float64 {
	P := len(t.peer)
	if P <= g {
		return 0
	}
	var cross, all float64
	for r, row := range t.peer {
		for d, b := range row {
			all += b
			if r/g != d/g {
				cross += b
			}
		}
	}
	cross += t.other * float64(P-g) / float64(P-1)
	all += t.other
	if all == 0 {
		return 0
	}
	return cross / all
}

// peerCounter is a Comm that counts the bytes of every Isend by destination.
type peerCounter struct {
	transport.Comm
	peer []float64
}

// Isend implements transport.Comm.
func (p *peerCounter) Isend(buf kernels.Buf, dst, tag int, site string) transport.Request {
	p.peer[dst] += 4 * float64(buf.Len())
	return p.Comm.Isend(buf, dst, tag, site)
}

// line is bytes(T) = A·T + B.
type line struct{ A, B float64 }

// at is the line at T.
func (l line) at(T float64) float64 { return l.A*T + l.B }

// at evaluates, at T, the forward and backward bytes of the busiest rank of a layer whose
// forward runs fwdPasses times (2 under checkpoint.activation = "layer"): the rank that sends
// the most in fwdPasses forwards and one backward, since every layer and sequence puts the
// same tokens on the same rank. total is the sum over the ranks of one forward and backward.
func (t traffic) at(T, fwdPasses float64) (fwd, bwd, total float64) {
	best := -1.0
	for r := range t.fwd {
		f, b := t.fwd[r].at(T), t.bwd[r].at(T)
		if x := fwdPasses*f + b; x > best {
			best, fwd, bwd = x, f, b
		}
	}
	return fwd, bwd, (t.fwdTotA+t.bwdTotA)*T + t.fwdTotB + t.bwdTotB
}

var (
	trafficMu    sync.Mutex
	trafficCache = map[string]traffic{}
)

// measureTraffic runs schedule name on P in-process ranks with heads h at T = 2·div and
// 4·div tokens (div: the layout's divisor) and fits bytes(T) = a·T + b. Under a sliding
// window of W tokens at seq_len T, the short runs get the window that hides the same blocks
// (windowReach), so the fit is that of the windowed schedule at T. Results are cached.
func measureTraffic(name string, h model.Heads, P, T, W int, prec kernels.Precision) (traffic, error) {
	if P > maxTrafficRanks {
		return traffic{}, fmt.Errorf("plan simulates at most %d sequence-parallel ranks to measure a schedule's traffic, not %d", maxTrafficRanks, P)
	}
	l, err := parallel.LayoutOf(name)
	if err != nil {
		return traffic{}, err
	}
	D := windowReach(l, P, T, W)
	key := fmt.Sprintf("%s/%d/%d/%d/%d/%d/%v", name, h.N, h.KV, h.Dim, P, D, prec)
	trafficMu.Lock()
	defer trafficMu.Unlock()
	if t, ok := trafficCache[key]; ok {
		return t, nil
	}
	T1, T2 := 2*l.Divisor(P), 4*l.Divisor(P)
	f1, b1, _, err := runScheduleOnce(name, h, P, T1, reachWindow(D, 2), prec)
	if err != nil {
		return traffic{}, err
	}
	f2, b2, peer, err := runScheduleOnce(name, h, P, T2, reachWindow(D, 4), prec)
	if err != nil {
		return traffic{}, err
	}
	fit := func(y1, y2 float64) line {
		a := (y2 - y1) / float64(T2-T1)
		return line{a, y1 - a*float64(T1)}
	}
	t := traffic{peer: peer}
	var ft1, bt1, ft2, bt2 float64
	for r := range P {
		t.fwd, t.bwd = append(t.fwd, fit(f1[r], f2[r])), append(t.bwd, fit(b1[r], b2[r]))
		ft1, bt1, ft2, bt2 = ft1+f1[r], bt1+b1[r], ft2+f2[r], bt2+b2[r]
	}
	t.other = ft2 + bt2
	for _, row := range peer {
		for _, b := range row {
			t.other -= b
		}
	}
	ft, bt := fit(ft1, ft2), fit(bt1, bt2)
	t.fwdTotA, t.fwdTotB, t.bwdTotA, t.bwdTotB = ft.A, ft.B, bt.A, bt.B
	trafficCache[key] = t
	return t, nil
}

// attnTraffic is one layer's attention bytes per rank (at precision prec) for schedule name on SP ranks,
// U-way Ulysses groups inside (1: none), nodes of gpn ranks, at seq_len T under a sliding
// window of W (0: none), the forward run fwdPasses times: the busiest rank's forward and
// backward (traffic.at), the sum over the ranks, and the fraction that crosses between nodes.
func attnTraffic(name string, h model.Heads, SP, U, gpn, T, W int, fwdPasses float64, prec kernels.Precision) (fwd, bwd, total, cross float64, err error) {
	if U > 1 { // Ulysses groups and the schedule between them (plan_hybrid.go)
		return hybridTraffic(name, h, SP, U, gpn, T, W, fwdPasses, prec)
	}
	t, err := measureTraffic(name, h, SP, T, W, prec)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	fwd, bwd, total = t.at(float64(T), fwdPasses)
	return fwd, bwd, total, t.crossFraction(gpn), nil
}

// runScheduleOnce runs one forward and backward of schedule name over a sequence of T tokens
// (under a sliding window of W, 0: none) on P in-process ranks and returns the bytes each rank
// sent in the forward and in the backward, and the point-to-point bytes from each rank to each.
func runScheduleOnce(name string, h model.Heads, P, T, W int, prec kernels.Precision) (fwd, bwd []float64, peer [][]float64, err error) {
	fwd, bwd = make([]float64, P), make([]float64, P)
	peer = make([][]float64, P)
	pass := schedulePass{Name: name, Opt: parallel.Options{Overlap: true}, Heads: h, P: P, T: T, Window: W, Prec: prec,
		Wrap: func(c transport.Comm) transport.Comm {
			pc := &peerCounter{Comm: c, peer: make([]float64, P)}
			peer[c.Rank()] = pc.peer
			return pc
		},
		Forward: func(c transport.Comm, _ kernels.Backend) { fwd[c.Rank()] = float64(c.Traffic().Total()) },
		Backward: func(c transport.Comm, _ kernels.Backend) {
			bwd[c.Rank()] = float64(c.Traffic().Total()) - fwd[c.Rank()]
		},
	}
	if err := pass.run(); err != nil {
		return nil, nil, nil, err
	}
	return fwd, bwd, peer, nil
}

// schedulePass is one forward and backward of a sequence-parallel attention schedule on P
// in-process ranks over T tokens of one sequence (batch 1, one layer), with fixed inputs: what
// plan runs to count a schedule's bytes, and its tests to count bytes and FLOPs.
type schedulePass struct {
	Name     string
	Opt      parallel.Options
	Heads    model.Heads
	P, T     int
	DocStart []int32                               // the document mask's start table (nil: causal)
	Window   int                                   // the sliding window (0: none)
	Prec     kernels.Precision                     // the backends' matmul precision: a 16-bit run's schedules send their operands packed
	Wrap     func(transport.Comm) transport.Comm   // wraps each rank's Comm (nil: as it is)
	Forward  func(transport.Comm, kernels.Backend) // called on each rank after the forward
	Backward func(transport.Comm, kernels.Backend) // called on each rank after the backward
}

// run runs the pass.
func (p schedulePass) run() error {
	h := p.Heads
	err := transport.NewWorld(p.P).Run(func(c transport.Comm) error {
		if p.Wrap != nil {
			c = p.Wrap(c)
		}
		be := kernels.NewCPU()
		be.SetMatMulPrecision(p.Prec)
		s, err := parallel.NewAttention(p.Name, c, be, p.Opt)
		if err != nil {
			return err
		}
		pos, err := s.Layout().Positions(p.T, p.P, c.Rank())
		if err != nil {
			return err
		}
		n := len(pos)
		buf := func(size int) kernels.Buf {
			b := be.Alloc(size)
			x := make([]float32, size)
			for i := range x {
				x[i] = float32(i%7) * 0.01
			}
			be.Upload(b, x)
			return b
		}
		q, k, v, do := buf(n*h.N*h.Dim), buf(n*h.KV*h.Dim), buf(n*h.KV*h.Dim), buf(n*h.N*h.Dim)
		o, lse := be.Alloc(q.Len()), be.Alloc(h.N*n)
		dq, dk, dv := be.Alloc(q.Len()), be.Alloc(k.Len()), be.Alloc(v.Len())
		seq := model.Seq{Pos: pos, DocStart: p.DocStart, Window: p.Window}
		s.Forward(o, lse, q, k, v, seq, h)
		if p.Forward != nil {
			p.Forward(c, be)
		}
		s.Backward(dq, dk, dv, q, k, v, o, lse, do, seq, h)
		if p.Backward != nil {
			p.Backward(c, be)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("plan: running %s on %d in-process ranks: %w", p.Name, p.P, err)
	}
	return nil
}

// PlanFor predicts memory, communication and step time of cfg with schedule name and
// data.seq_len = seqLen on cluster cl. A schedule that cannot run the config comes back with
// Refused saying why. With data.document_mask it assumes web-like documents (defaultDocLen).
func PlanFor(cfg config.Config, cl Cluster, name string, seqLen int) Plan {
	var docs *DocLengths
	if cfg.Data.DocumentMask {
		docs = &DocLengths{Dist: "lognormal", Mean: DefaultDocLen, Assumed: true}
	}
	return PlanWithDocs(cfg, cl, name, seqLen, docs)
}

// PlanWithDocs is PlanFor with packed documents of lengths docs under a document mask (nil:
// plain causal attention): attention FLOPs scale by the visible fraction and the idle
// fraction is the schedule's under the documents (plandocs.go in this package), after
// parallel.BalanceDocuments with parallelism.balance_documents.
func PlanWithDocs(cfg config.Config, cl Cluster, name string, seqLen int, docs *DocLengths) Plan {
	cfg.Data.SeqLen = seqLen
	cfg.Model.MaxSeqLen = max(cfg.Model.MaxSeqLen, seqLen)
	cfg.Parallelism.Attention = name
	m, p, dm := cfg.Model, cfg.Parallelism, dims(cfg)
	SP, world := dm.SP, dm.World
	pl := Plan{Attention: name, SeqLen: seqLen, TokensPerGPU: seqLen / SP}
	h := model.Heads{N: m.NHeads, KV: m.NKVHeads, Dim: m.HeadDim}
	refuse := func(err error) Plan {
		pl.Refused = err.Error()
		return pl
	}
	U := hybridDegree(cfg, name)
	if err := parallel.CheckHybrid(name, h, SP, U); err != nil {
		return refuse(err)
	}
	l, err := parallel.LayoutOf(name)
	if err != nil {
		return refuse(err)
	}
	if seqLen%l.Divisor(SP) != 0 {
		return refuse(fmt.Errorf("seq_len %d is not a multiple of %d (%s split over %d ranks)", seqLen, l.Divisor(SP), l, SP))
	}
	pl.Memory = MemoryFor(cfg, cl.GPU.MemBytes)
	pl.MaxSeqPerGPU = MaxTokensPerGPU(cfg, cl.GPU.MemBytes)
	if ev, ok := TrainEvalMemoryFor(cfg, cl.GPU.MemBytes); ok {
		pl.Eval, pl.EvalSeqLen, pl.EvalMaxSeqLen = &ev, TrainEvalSeqLen(cfg), MaxTrainEvalSeqLen(cfg, cl.GPU.MemBytes)
	}
	if IsAuto(cfg) { // the rest of the plan is of what the config leaves to the device, decided
		ch := Choose(cfg, cl.GPU.MemBytes)
		pl.Choice = &ch
		cfg = ch.Apply(cfg)
	}

	e := elemBytes(cfg)
	prec, err := kernels.ParsePrecision(cfg.Training.MixedPrecision)
	if err != nil {
		return refuse(err)
	}
	L := float64(m.NLayers)
	B, accum := float64(cfg.Data.BatchSize), float64(cfg.Training.GradAccumSteps)
	layerPolicy := cfg.Checkpoint.Activation == "layer"
	// The layers with the window and those without (model.sliding_window_layers).
	type layerClass struct{ n, W int }
	var classes []layerClass
	windowed := 0
	for l := range m.NLayers {
		if m.Window(l) > 0 {
			windowed++
		}
	}
	if windowed < m.NLayers {
		classes = append(classes, layerClass{m.NLayers - windowed, 0})
	}
	if windowed > 0 {
		classes = append(classes, layerClass{windowed, m.SlidingWindow})
		pl.Window = &WindowPlan{Window: m.SlidingWindow, Layers: windowed, Visible: windowVisible(seqLen, m.SlidingWindow),
			CausalIdle: IdleFraction(name, SP/U), BytesRatio: 1}
	}
	if SP > 1 {
		// attnTraffic measures in the run's precision: 16-bit operands, float32 statistics and gradients
		fwdPasses := 1.0
		if layerPolicy {
			fwdPasses = 2
		}
		plain := 0.0 // an unwindowed layer's forward + backward bytes, busiest rank
		for _, c := range classes {
			fwd, bwd, total, cross, err := attnTraffic(name, h, SP, U, cl.GPUsPerNode, seqLen, c.W, fwdPasses, prec)
			if err != nil {
				return refuse(err)
			}
			n := float64(c.n)
			pl.Comm.AttnPerLayer += n / L * B * (fwd + bwd) // averaged over the layers
			pl.Comm.AttnTotalLayer += n / L * B * total
			a := accum * n * B * (fwdPasses*fwd + bwd)
			pl.Comm.Attention += a
			pl.Comm.AttnInterNode += a * cross
			if c.W == 0 {
				plain = fwd + bwd
			} else {
				if plain == 0 {
					f0, b0, _, _, err := attnTraffic(name, h, SP, U, cl.GPUsPerNode, seqLen, 0, fwdPasses, prec)
					if err != nil {
						return refuse(err)
					}
					plain = f0 + b0
				}
				pl.Window.BytesRatio = (fwd + bwd) / plain
			}
		}
	}
	N := float64(m.NumParams())
	Pw := float64(world)
	if world > 1 {
		// Gradients travel as float32 (kernels.Buf) whatever the compute precision; FSDP
		// gathers weights in the compute precision (parallel.FSDPOptions.Precision).
		if p.FSDP {
			pl.Comm.FSDP = accum * (2*e + 4) * (Pw - 1) / Pw * N
		} else {
			pl.Comm.DataParallel = 2 * (Pw - 1) / Pw * N * 4
		}
	}
	pl.Comm.Total = pl.Comm.Attention + pl.Comm.FSDP + pl.Comm.DataParallel

	tokens := B * float64(seqLen) * accum / float64(SP)
	blockParams := N - 2*float64(m.VocabSize)*float64(m.Dim) - float64(m.Dim)
	tm := &pl.Time
	tm.DenseFLOPs = 6 * N * tokens
	if cfg.Checkpoint.Activation != "none" {
		tm.DenseFLOPs += 2 * blockParams * tokens
	}
	attnPasses := 3.5
	if layerPolicy {
		attnPasses = 4.5
	}
	// Attention: each class of layers its FLOPs (the visible pairs) and its idle stretch.
	T := float64(seqLen)
	layerFLOPs := accum * B * (4 * T * T * float64(m.QDim()) / 2) * attnPasses / float64(SP)
	stretched := 0.0 // attention FLOPs / (1 − idle), summed over the layers
	for _, c := range classes {
		visible, idle := 1.0, IdleFraction(name, SP/U) // a hybrid's groups: the outer schedule's balance
		if docs != nil {
			dp, err := planDocuments(*docs, name, SP/U, seqLen, c.W, p.BalanceDocuments)
			if err != nil {
				return refuse(err)
			}
			if pl.Docs == nil || c.W == 0 { // the documents of an unwindowed layer when there is one
				pl.Docs = &dp
			}
			visible, idle = dp.Visible, dp.Idle
			if dp.Balanced {
				idle = dp.IdleBalanced
			}
		} else if c.W > 0 {
			visible = windowVisible(seqLen, c.W)
			if idle, err = windowIdle(name, SP/U, seqLen, c.W); err != nil {
				return refuse(err)
			}
		}
		if c.W > 0 {
			pl.Window.Idle = idle
		}
		f := float64(c.n) * layerFLOPs * visible
		tm.AttnFLOPs += f
		stretched += f / (1 - idle)
	}
	tm.IdleFraction = IdleFraction(name, SP/U)
	if stretched > 0 {
		tm.IdleFraction = 1 - tm.AttnFLOPs/stretched
	}
	if cl.GPU.Name == cpuType.Name {
		tm.Compute = tm.DenseFLOPs/(cl.GPU.FLOPS*cl.MFU) + stretched/(cl.GPU.FLOPS*cl.AttnMFU)
	} else {
		tm.Components = gpuStepTime(cfg, cl, tokens, tm.AttnFLOPs, stretched)
		tm.Compute = 0
		for _, c := range tm.Components {
			tm.Compute += c.Seconds
		}
	}
	tm.AttnLinkBW = cl.GPU.IntraBW
	if SP > cl.GPUsPerNode {
		tm.AttnLinkBW = cl.GPU.InterBW
	}
	// The attention bytes that stay inside a node move at the intra-node rate, the others
	// at the inter-node rate; the world's collectives as worldCollectives says (NCCL's ring
	// and tree with their latency on GPUs, Open MPI's direct exchanges on CPU ranks), call by
	// call (collectives.go).
	inter := pl.Comm.AttnInterNode
	attnComm := inter/cl.GPU.InterBW + (pl.Comm.Attention-inter)/cl.GPU.IntraBW
	wn := worldCollectives(cl, world)
	tm.WorldLinkBW = 1 / wn.secPerByte
	pl.Comm.InterNode = wn.cross*(pl.Comm.FSDP+pl.Comm.DataParallel) + inter
	if pl.Comm.FSDP > 0 {
		tm.FSDP = wn.gatherScatter(pl.Comm.FSDP, int(accum)*fsdpCalls(m.NLayers))
	}
	if pl.Comm.DataParallel > 0 {
		tm.DataParallel = wn.allReduce(N*4, pl.Comm.DataParallel) // one call of the float32 gradients
	}
	fsdpComm, dpComm := tm.FSDP.Seconds, tm.DataParallel.Seconds
	tm.Comm = attnComm + fsdpComm + dpComm
	tm.Overlap = p.OverlapComm
	// The gradient all-reduce runs after the backward pass (package train), so it never
	// overlaps; attention transfers and FSDP's prefetched gathers do with overlap_comm.
	if p.OverlapComm {
		tm.Step = max(tm.Compute, attnComm+fsdpComm) + dpComm
	} else {
		tm.Step = tm.Compute + tm.Comm
	}
	return pl
}

// gb writes bytes in GB (10^9).
func gb(b float64) string { return fmt.Sprintf("%.2f GB", b/1e9) }

// seqName writes a token count as 8K, 512K or 1M when it is a whole multiple.
func seqName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.Itoa(n)
}

// writeDetail prints one plan with its breakdown.
func WriteDetail(w io.Writer, rep Report) {
	pl := rep.Plans[0]
	fmt.Fprintf(w, "config:   %s\n", rep.Summary)
	mem := gb(rep.Cluster.GPU.MemBytes)
	if src := rep.Cluster.MemSource; src != "" {
		mem += " (" + src + ")"
	}
	cl := rep.Cluster
	if cl.GPU.Name == cpuType.Name {
		fmt.Fprintf(w, "cluster:  %s: %d CPU ranks, %s each, %.3g GFLOP/s each (%s), within a host %.3g GB/s (shared memory), between hosts %.3g GB/s per rank\n",
			cl, cl.GPUs(), mem, cl.GPU.FLOPS/1e9, cl.GPU.Efficiency, cl.GPU.IntraBW/1e9, cl.GPU.InterBW/1e9)
	} else {
		fmt.Fprintf(w, "cluster:  %s: %d GPUs, %s each, %.3g TFLOP/s bf16 × mfu %.2f (attention %.2f; %s), NVLink %.3g GB/s, inter-node %.3g GB/s per GPU\n",
			cl, cl.GPUs(), mem, cl.GPU.FLOPS/1e12, cl.MFU, cl.AttnMFU, efficiencyOf(cl), cl.GPU.IntraBW/1e9, cl.GPU.InterBW/1e9)
	}
	fmt.Fprintf(w, "schedule: %s, seq_len %s (%s tokens per %s)\n", pl.Attention, seqName(pl.SeqLen), seqName(pl.TokensPerGPU), cl.unit())
	if pl.Refused != "" {
		fmt.Fprintf(w, "refused:  %s\n", pl.Refused)
		return
	}
	if pl.Choice != nil {
		fmt.Fprintf(w, "auto:     %s\n", pl.Choice)
	}
	mp := pl.Memory
	fmt.Fprintf(w, "\nmemory per rank:\n")
	writeMemoryRows(w, mp, []memoryRow{{"parameters", mp.Params, ""}, {"gradients", mp.Grads, ""}, {"optimizer (AdamW)", mp.Optimizer, ""},
		{"saved activations", mp.Activations, "grows with the tokens per rank"},
		{"logits + head", mp.Logits, "one loss chunk of logits, and the final norm's grow with the tokens"},
		{"backward scratch", mp.BackwardScratch, "grows with the tokens; the MLP's is one tile"},
		{"attention working set", mp.AttnWork, "grows with the tokens"},
		{"attention 16-bit", mp.AttnKernel, "bf16/fp16: the packed operands; on a GPU cuDNN's outputs and workspace"}, {"communication buffers", mp.CommBuffers, ""},
		{"collector headroom", mp.Runtime, "the CPU's Go heap: 15% of the rest"},
		{"process", mp.Process, "the binary and Go runtime, the data's tokens and held-out samples, the checkpoint writer"}, {"peak", mp.Peak, ""}})
	if mp.Fits && mp.Margin < thinMargin*mp.Capacity {
		fmt.Fprintf(w, "  note: a margin under %.0f%% of the memory: what the estimate does not count (the CUDA context, NCCL's buffers, the allocator's fragmentation; on the CPU the peak resident set has been 0.96–1.04 of the estimate, up to 1.10 before it counted the process and the heap's freed pages) can take that much, so a run may not fit; keep the margin above it\n", 100*thinMargin)
	}
	if pl.MaxSeqPerGPU == 0 { // the search steps by 1K tokens; fewer may fit, as the plan's own may
		fmt.Fprintf(w, "  longest sequence per %s that fits: under 1K tokens (the search steps by 1024)\n", cl.unit())
	} else {
		fmt.Fprintf(w, "  longest sequence per %s that fits: %s tokens (seq_len %s)\n", cl.unit(), seqName(pl.MaxSeqPerGPU), seqName(pl.MaxSeqPerGPU*pl.SeqLen/max(pl.TokensPerGPU, 1)))
	}
	if pl.Eval != nil {
		writeEvalMemory(w, rep, pl)
	}
	c := pl.Comm
	fmt.Fprintf(w, "\ncommunication per rank per step:\n")
	fmt.Fprintf(w, "  %-22s %10s  (one layer's forward + backward: %s per rank, %s all ranks together)\n",
		"attention ("+pl.Attention+")", gb(c.Attention), gb(c.AttnPerLayer), gb(c.AttnTotalLayer))
	fmt.Fprintf(w, "    between nodes        %10s\n", gb(c.AttnInterNode))
	fmt.Fprintf(w, "  fsdp                   %10s\n", gb(c.FSDP))
	fmt.Fprintf(w, "  data-parallel          %10s\n", gb(c.DataParallel))
	fmt.Fprintf(w, "  total                  %10s\n", gb(c.Total))
	t := pl.Time
	if len(t.Components) > 0 {
		fmt.Fprintf(w, "\nstep time (predicted: the rates are assumed, not measured on distflash's step; train --profile measures it):\n")
	} else {
		fmt.Fprintf(w, "\nstep time:\n")
	}
	fmt.Fprintf(w, "  FLOPs per rank         %.3g dense + %.3g attention\n", t.DenseFLOPs, t.AttnFLOPs)
	if d := pl.Docs; d != nil {
		fmt.Fprintf(w, "  documents              %s\n", docSummary(*d, pl.SeqLen))
		fmt.Fprintf(w, "  visible pairs          %.4f of causal, attention FLOPs scaled by it (%.4f if every document were %.0f tokens; %.4f counted on %d sampled windows)\n",
			d.Visible, d.FixedVisible, d.Mean, d.SampledVisible, d.Windows)
		use := "off"
		if d.Balanced {
			use = "on"
		}
		fmt.Fprintf(w, "  idle fraction          %.3f under the documents as packed, %.3f with balance_documents (causal, no documents: %.3f); the step uses %.3f (balance_documents %s)\n",
			d.Idle, d.IdleBalanced, d.CausalIdle, t.IdleFraction, use)
		if pl.Attention == "distflash" {
			fmt.Fprintf(w, "                         %s\n", distflashDocNote)
		}
	} else {
		fmt.Fprintf(w, "  idle fraction          %.3f\n", t.IdleFraction)
	}
	if wp := pl.Window; wp != nil {
		fmt.Fprintf(w, "  sliding window         %d tokens on %d of %d layers: a windowed layer computes %.4f of the causal pairs and sends %.3f of an unwindowed layer's attention bytes; its idle %.3f (causal %.3f)\n",
			wp.Window, wp.Layers, rep.Layers, wp.Visible, wp.BytesRatio, wp.Idle, wp.CausalIdle)
	}
	for _, c := range t.Components {
		work, rate := fmt.Sprintf("%.3g TFLOP", c.Work/1e12), fmt.Sprintf("%.3g TF/s", c.Rate/1e12)
		if c.Name == "elementwise" || c.Name == "optimizer" {
			work, rate = fmt.Sprintf("%.3g GB", c.Work/1e9), fmt.Sprintf("%.3g TB/s", c.Rate/1e12)
		}
		fmt.Fprintf(w, "  %-22s %8.1f ms  (%s at %s: %s)\n", componentNames[c.Name], 1e3*c.Seconds, work, rate, c.Basis)
	}
	fmt.Fprintf(w, "  compute                %8.2f s\n", t.Compute)
	fmt.Fprintf(w, "  communication          %8.2f s  (attention inside a node at %.3g GB/s, between nodes at %.3g GB/s; fsdp/dp at %.3g GB/s)\n",
		t.Comm, rep.Cluster.GPU.IntraBW/1e9, rep.Cluster.GPU.InterBW/1e9, t.WorldLinkBW/1e9)
	for _, r := range []struct {
		what string
		ct   CollectiveTime
	}{{"fsdp", t.FSDP}, {"data-parallel", t.DataParallel}} {
		if r.ct.Calls > 0 {
			fmt.Fprintf(w, "    %-20s %8.3f s  (%s)\n", r.what, r.ct.Seconds, r.ct.describe())
		}
	}
	how := "sum, overlap_comm off"
	if t.Overlap {
		how = "max, overlap_comm on"
	}
	fmt.Fprintf(w, "  step                   %8.2f s  (%s)\n", t.Step, how)
}

// componentNames are the printed names of gpuStepTime's components.
var componentNames = map[string]string{"gemm": "GEMMs", "attention": "attention kernels", "elementwise": "elementwise kernels", "optimizer": "optimizer phase"}

// memoryRow is one line of a memory table: what, its bytes, and a note.
type memoryRow struct {
	what string
	b    float64
	note string
}

// writeMemoryRows prints the rows of plan mp's memory table (the headroom, the process and the
// 16-bit attention left out where they are 0) and its verdict against the capacity.
func writeMemoryRows(w io.Writer, mp MemoryPlan, rows []memoryRow) {
	for _, r := range rows {
		if (r.what == "collector headroom" || r.what == "process" || r.what == "attention 16-bit") && r.b == 0 {
			continue
		}
		if r.note != "" {
			r.note = "  (" + r.note + ")"
		}
		fmt.Fprintf(w, "  %-22s %10s%s\n", r.what, gb(r.b), r.note)
	}
	verdict := "fits"
	if !mp.Fits {
		verdict = "DOES NOT FIT"
	}
	fmt.Fprintf(w, "  %s in %s: margin %s (%.0f%%)\n", verdict, gb(mp.Capacity), gb(mp.Margin), 100*mp.Margin/mp.Capacity)
}

// writeEvalMemory prints the memory of the held-out evaluation during training of plan pl.
func writeEvalMemory(w io.Writer, rep Report, pl Plan) {
	ev, u := *pl.Eval, rep.Cluster.unit()
	fmt.Fprintf(w, "\nmemory per rank in the held-out evaluation during training (eval.interval > 0): samples of up to %s tokens (eval.seq_len), one a replica (%s tokens per %s), beside the training state:\n",
		seqName(pl.EvalSeqLen), seqName(pl.EvalSeqLen*pl.TokensPerGPU/max(pl.SeqLen, 1)), u)
	writeMemoryRows(w, ev, []memoryRow{{"model state", ev.Params + ev.Grads + ev.Optimizer + ev.CommBuffers, "parameters, gradients, optimizer and fsdp buffers, as above"},
		{"saved activations", ev.Activations, "the forward's, kept as checkpoint.activation keeps them"},
		{"logits + head", ev.Logits, ""}, {"backward scratch", ev.BackwardScratch, "the training step's"},
		{"attention", ev.AttnWork + ev.AttnKernel, ""}, {"collector headroom", ev.Runtime, ""}, {"process", ev.Process, ""}, {"peak", ev.Peak, ""}})
	if pl.EvalMaxSeqLen == 0 {
		fmt.Fprintf(w, "  longest eval.seq_len that fits: under 1K tokens per %s (the search steps by 1024)\n", u)
	} else {
		fmt.Fprintf(w, "  longest eval.seq_len that fits: %s tokens\n", seqName(pl.EvalMaxSeqLen))
	}
}

// writeTable prints one row per plan, aligned.
func WriteTable(w io.Writer, rep Report) {
	fmt.Fprintf(w, "config:  %s\ncluster: %s, mfu %.2f (attention %.2f)\n\n", rep.Summary, rep.Cluster, rep.Cluster.MFU, rep.Cluster.AttnMFU)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	u := rep.Cluster.unit()
	evalCol := "" // the held-out evaluation during training, where eval.interval > 0
	if slices.ContainsFunc(rep.Plans, func(pl Plan) bool { return pl.Eval != nil }) {
		evalCol = "eval GB\t"
	}
	autoCol := "" // checkpoint.activation = "auto": the policy each plan chose
	if slices.ContainsFunc(rep.Plans, func(pl Plan) bool {
		return pl.Choice != nil && slices.Contains(pl.Choice.Auto, "checkpoint.activation")
	}) {
		autoCol = "checkpoint\t"
	}
	fmt.Fprintf(tw, "attention\tseq_len\tper %s\t%speak GB\t%sfits\tattn GB\tfsdp GB\tidle\tcompute s\tcomm s\tstep s\tmax/%s\t\n", u, autoCol, evalCol, u)
	var reasons []string // one line per refused schedule and reason, printed under the table
	for _, pl := range rep.Plans {
		if pl.Refused != "" {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s-\t%srefused\t-\t-\t-\t-\t-\t-\t-\t\n", pl.Attention, seqName(pl.SeqLen), seqName(pl.TokensPerGPU),
				strings.ReplaceAll(autoCol, "checkpoint", "-"), strings.ReplaceAll(evalCol, "eval GB", "-"))
			if r := pl.Attention + " refused: " + pl.Refused; !slices.Contains(reasons, r) {
				reasons = append(reasons, r)
			}
			continue
		}
		fits := "yes"
		if !pl.Memory.Fits {
			fits = "NO"
		}
		ev := ""
		if evalCol != "" {
			ev = "-\t"
		}
		if pl.Eval != nil {
			ev = fmt.Sprintf("%.1f\t", pl.Eval.Peak/1e9)
			if pl.Memory.Fits && !pl.Eval.Fits {
				fits = "NO (eval)"
			}
		}
		policy := ""
		if autoCol != "" {
			policy = "-\t"
			if pl.Choice != nil {
				policy = pl.Choice.Policy + "\t"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s%.1f\t%s%s\t%.2f\t%.2f\t%.3f\t%.2f\t%.2f\t%.2f\t%s\t\n", pl.Attention, seqName(pl.SeqLen),
			seqName(pl.TokensPerGPU), policy, pl.Memory.Peak/1e9, ev, fits, pl.Comm.Attention/1e9, (pl.Comm.FSDP+pl.Comm.DataParallel)/1e9,
			pl.Time.IdleFraction, pl.Time.Compute, pl.Time.Comm, pl.Time.Step, seqName(pl.MaxSeqPerGPU))
	}
	tw.Flush()
	for _, r := range reasons {
		fmt.Fprintf(w, "\n%s\n", r)
	}
	writeDocTable(w, rep)
	writeWindowTable(w, rep)
}

// writeDocTable prints, under plan's table, what document masking does to each plan: the
// visible fraction and the idle fractions with and without balance_documents.
func writeDocTable(w io.Writer, rep Report) {
	var tw *tabwriter.Writer
	for _, pl := range rep.Plans {
		d := pl.Docs
		if d == nil || pl.Refused != "" {
			continue
		}
		if tw == nil {
			fmt.Fprintf(w, "\ndocuments: %s; the idle column above is under them\n", docSummary(*d, pl.SeqLen))
			tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "attention\tseq_len\tvisible\tfixed-length visible\tcausal idle\tidle as packed\tidle balanced\tbalance_documents\t")
		}
		use := "off"
		if d.Balanced {
			use = "on"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.4f\t%.4f\t%.3f\t%.3f\t%.3f\t%s\t\n", pl.Attention, seqName(pl.SeqLen), d.Visible, d.FixedVisible, d.CausalIdle, d.Idle, d.IdleBalanced, use)
	}
	if tw != nil {
		tw.Flush()
		for _, pl := range rep.Plans {
			if pl.Attention == "distflash" && pl.Docs != nil && pl.Refused == "" {
				fmt.Fprintf(w, "distflash: %s\n", distflashDocNote)
				break
			}
		}
	}
}

// thinMargin is the fraction of the memory under which a margin that fits gets a note: what
// the estimate leaves out can take that much.
const thinMargin = 0.05

// efficiencyOf says where the cluster's mfu and attention mfu come from: the flags, or its
// GPU's preset (measured, and on what, or assumed).
func efficiencyOf(cl Cluster) string {
	if cl.MFU != cl.GPU.MFU || cl.AttnMFU != cl.GPU.AttnMFU {
		return "given by --mfu / --attn-mfu"
	}
	return cl.GPU.Efficiency
}
