// Package train is distflash's training: the world it runs in (in-process ranks, or this
// process as one MPI rank: Launch), the ranks and their step (forward, loss, backward,
// gradient exchange or FSDP's reduce-scatter, clipping, AdamW), the data loader
// (NewLoader), signals that stop after a step or a save with a checkpoint (OnSignal), the
// time limit and how long steps take (Clock), CPU and heap profiles, run directories and their
// locks, checkpoints and resume with its report of what changed, --init-from
// (LoadInitConfig), periodic evaluation and the metrics writers (metrics.jsonl with FLOP/s and
// MFU, TensorBoard). Run is the train command after its flags.
//
// Layer: train imports config, plan (its memory check, FLOPs per token), evaluate (its
// held-out evaluation), ckpt, data, model, optim, parallel, kernels, runplot, sysmem and
// train/tensorboard. Only the command imports it.
package train

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"

	"distflash/ckpt"
	"distflash/config"
	"distflash/data"
	"distflash/evaluate"
	"distflash/kernels"
	"distflash/model"
	"distflash/optim"
	"distflash/parallel"
	"distflash/parallel/transport"
	"distflash/plan"
	"distflash/runplot"
)

// Metrics is one line of runs/<name>/metrics.jsonl.
type Metrics struct {
	Step         int      `json:"step"`
	Loss         float64  `json:"loss"`
	LR           float64  `json:"lr"`
	GradNorm     float64  `json:"grad_norm"`
	TokensPerSec float64  `json:"tokens_per_s"`
	Tokens       int64    `json:"tokens"`
	ElapsedSec   float64  `json:"elapsed_s"`
	AttnForwards int64    `json:"attn_forwards"`
	AttnBytes    int64    `json:"attn_bytes"`           // the bytes the busiest rank sent for attention (sequence-parallel blocks, statistics, all-to-alls)
	FLOPsPerSec  float64  `json:"flops_per_s"`          // the model FLOPs of the step's tokens (plan.FLOPsPerToken) per second, all ranks together
	MFU          float64  `json:"mfu,omitempty"`        // FLOPsPerSec over the peak of all devices (device.peak_tflops or the GPU's); absent when the peak is not known (CPU)
	Skipped      bool     `json:"skipped,omitempty"`    // fp16: gradients overflowed, the update was skipped
	LossScale    float64  `json:"loss_scale,omitempty"` // fp16: the scale this step's loss was multiplied by
	Memory       []Memory `json:"memory"`               // per rank
	// Held-out evaluation, on the steps where it runs (eval.interval).
	EvalLoss        float64 `json:"eval_loss,omitempty"`
	EvalPerplexity  float64 `json:"eval_perplexity,omitempty"`
	EvalBitsPerByte float64 `json:"eval_bits_per_byte,omitempty"`

	stop     bool // some rank was asked to stop after this step (all ranks stop together)
	diverged bool // fp32/bf16: the gradients hold Inf or NaN; no update was applied
}

// writeTraffic writes, when DISTFLASH_TRAFFIC names a path prefix, the bytes this MPI rank
// sent by call site over the whole run to PREFIX.rankN as JSON (bench/netns_overlap.sh
// reads them). The in-process world (comm nil) writes nothing.
func WriteTraffic(comm transport.Comm) error {
	prefix := os.Getenv("DISTFLASH_TRAFFIC")
	if prefix == "" || comm == nil {
		return nil
	}
	b, err := json.Marshal(comm.Traffic())
	if err != nil {
		return fmt.Errorf("DISTFLASH_TRAFFIC: %w", err)
	}
	path := fmt.Sprintf("%s.rank%d", prefix, comm.Rank())
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("DISTFLASH_TRAFFIC=%s: %w", prefix, err)
	}
	return nil
}

// OnSignal returns a context that the first SIGINT or SIGTERM cancels, which makes
// training stop after the step it is in (or the checkpoint being saved) and save a checkpoint
// there; a second signal ends the process at once (exit status 130), leaving the last complete
// checkpoint as `latest`. clock says what the run is doing; only a process that speaks (rank
// 0) prints.
func OnSignal(stderr io.Writer, clock *Clock, speak bool) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	quit := make(chan struct{})
	go func() {
		for n := 0; ; n++ {
			select {
			case <-sigs:
			case <-quit:
				return
			}
			if n > 0 {
				if speak {
					fmt.Fprintf(stderr, "\nstopped at once during step %d, without saving; the newest complete checkpoint stays `latest`\n", clock.step.Load())
				}
				os.Exit(130)
			}
			if speak {
				fmt.Fprintf(stderr, "\n%s\n", clock.StopMessage())
			}
			cancel()
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(quit)
		cancel()
	}
}

// Launch starts MPI when the config asks for it (parallelism.backend = "mpi") or when
// this process was started by an MPI launcher (mpirun, srun) together with others, and
// returns this process's communicator; nil means the in-process world. Under
// parallelism.backend = "nccl" the MPI communicator is the bootstrap one: it carries NCCL's
// unique id and the host-side agreements (newRank makes the NCCL communicator on it).
func Launch(cfg *config.Config, stderr io.Writer) (transport.Comm, error) {
	launch, err := transport.MPIEnv()
	if err != nil {
		return nil, err
	}
	started := launch != nil && (launch.Size > 1 || launch.Rank > 0)
	if cfg.Parallelism.Backend != "mpi" && !started {
		return nil, nil
	}
	if cfg.Parallelism.Backend == "inproc" {
		if launch.Rank == 0 {
			fmt.Fprintf(stderr, "mpi: started by %s; using parallelism.backend = \"mpi\" instead of %q\n", launch.Launcher, cfg.Parallelism.Backend)
		}
		cfg.Parallelism.Backend = "mpi"
	}
	if b := cfg.Parallelism.Backend; b != "mpi" && b != "nccl" {
		return nil, fmt.Errorf("%s: parallelism.backend = %q, but this process was started by %s (%v): use \"mpi\"",
			cfg.Path, b, launch.Launcher, launch.Vars)
	}
	if err := transport.CheckLaunch(); err != nil {
		return nil, err
	}
	comm, err := transport.InitMPI()
	if err != nil {
		return nil, fmt.Errorf("%s: parallelism.backend = %q (over MPI): %w", cfg.Path, cfg.Parallelism.Backend, err)
	}
	return comm, nil
}

// trainer holds the pieces of a run: the data, the schedule, and the ranks this process
// runs, each with its own backend, model and optimizer. The world has size ranks: dp
// data-parallel replicas of sp sequence-parallel ranks each (rank = replica·sp + sp index).
// Without FSDP every rank holds all parameters, and ranks stay identical because they apply
// the same update to the same all-reduced gradients; with FSDP each rank holds and updates
// its chunk of every unit (parallel.FSDP).
type trainer struct {
	cfg    config.Config
	sched  optim.Schedule
	loader *data.Loader
	world  *transport.World // the in-process world; nil when this process is one rank of many
	ranks  []*rank          // the ranks this process runs, in rank order
	size   int              // world size
	prec   kernels.Precision
	scaler *optim.LossScaler // fp16 only
	id     ckpt.RunID        // the run's identity, saved in every checkpoint

	// beforeUpdate, when set (tests), runs on every rank after the gradients are complete and
	// before they are checked and applied.
	beforeUpdate func(step int, r *rank)
	// stopRequested reports whether this process was asked to stop (SIGINT, SIGTERM). Ranks
	// exchange it with each step's statistics, so all stop after the same step.
	stopRequested func() bool
}

// rank is one worker's state.
type rank struct {
	id      int
	Comm    transport.Comm // the whole world
	be      kernels.Backend
	model   *model.Model
	opt     *optim.AdamW
	fsdp    *parallel.FSDP   // nil without FSDP
	cast    *model.CastStore // the 16-bit compute copy without FSDP in bf16/fp16, else nil
	replica int              // data-parallel index: which sequences of the step's batch
	pos     []int32          // global positions of this rank's tokens in every sequence

	params, grads kernels.Buf     // what the optimizer updates: all parameters, or the FSDP chunks
	segs          []optim.Segment // their tensors' pieces, for the optimizer (weight decay or not)
	stats         []float32       // this rank's statistics of the step (statLen)
	statBuf       kernels.Buf     // the same, on the backend
	statAll       kernels.Buf     // every rank's, gathered
}

// stepStats are what each rank contributes to a step's metrics, exchanged in one all-gather.
// Float64 values travel as two float32 (hi, lo) so that sums keep ~48 bits.
const (
	statLoss    = 0 // 2 slots: summed token loss
	statCount   = 2 // 2 slots: tokens
	statSumSq   = 4 // 2 slots: Σ g² over what this rank owns (FSDP) or all (else)
	statBad     = 6 // 1 slot: 1 when this rank's gradients hold Inf or NaN
	statParams  = 7 // 2 slots each: the rank's Memory
	statGrads   = 9
	statOptim   = 11
	statCompute = 13
	statActs    = 15
	statStop    = 17 // 1 slot: 1 when this rank was asked to stop (a signal)
	statAttn    = 18 // 2 slots: the bytes this rank sent for attention in the step
	statLen     = 20
)

func putStat(s []float32, at int, v float64) {
	hi := float32(v)
	s[at], s[at+1] = hi, float32(v-float64(hi))
}

func getStat(s []float32, at int) float64 { return float64(s[at]) + float64(s[at+1]) }

// newTrainer builds a trainer whose ranks all run in this process (the in-process world).
func newTrainer(cfg config.Config, stderr io.Writer) (*trainer, error) {
	return newTrainerOn(cfg, stderr, nil)
}

// newLoader reads the training data the config names (data.train, in data.format, through
// data.tokenizer, cut at data.max_bytes; documents marked when data.document_mask) and returns
// the loader that cuts it into the batches training sees, in order. It reports what it read
// on stderr.
func NewLoader(cfg config.Config, stderr io.Writer) (*data.Loader, error) {
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("%s: data.tokenizer: %w", cfg.Path, err)
	}
	if tok.VocabSize() > cfg.Model.VocabSize {
		return nil, fmt.Errorf("%s: data.tokenizer %q has %d tokens but model.vocab_size = %d: set model.vocab_size to at least %d",
			cfg.Path, cfg.Data.Tokenizer, tok.VocabSize(), cfg.Model.VocabSize, tok.VocabSize())
	}
	path, err := data.ExpandPath(cfg.Data.Train)
	if err != nil {
		return nil, fmt.Errorf("%s: data.train = %q: %w", cfg.Path, cfg.Data.Train, err)
	}
	start := time.Now()
	src := data.Source{Path: path, Format: cfg.Data.Format, Include: cfg.Data.Include,
		MaxBytes: cfg.Data.MaxBytes, Seed: cfg.Run.Seed, Log: stderr} // Log: a max_bytes cut, warnings
	if cfg.Data.DocumentMask {
		b, err := data.DocumentBoundary(tok)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.Path, err)
		}
		src.Boundary = &b
	}
	tokens, err := data.LoadTokens(src, tok)
	if err != nil {
		return nil, fmt.Errorf("%s: data.train = %q: %w", cfg.Path, cfg.Data.Train, err)
	}
	fmt.Fprintf(stderr, "data: %d tokens from %s (%s tokenizer) in %.1fs\n", len(tokens), path, tok.Name(), time.Since(start).Seconds())
	loader, err := data.NewLoader(tokens, cfg.Data.SeqLen, cfg.Data.BatchSize, cfg.Run.Seed)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	if src.Boundary != nil {
		loader.SetBoundary(*src.Boundary)
	}
	return loader, nil
}

// newTrainerOn builds a trainer. With comm nil it runs every rank of the world in this
// process; otherwise this process is the one rank comm.Rank() of a world of comm.Size()
// processes (MPI), which must equal parallelism.world_size.
func newTrainerOn(cfg config.Config, stderr io.Writer, comm transport.Comm) (*trainer, error) {
	loader, err := NewLoader(cfg, stderr)
	if err != nil {
		return nil, err
	}
	t := cfg.Training
	sched := optim.Schedule{Kind: t.LRSchedule, LR: t.LR, MinLR: t.MinLR, Warmup: t.WarmupSteps, Steps: t.Steps}
	if err := sched.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	prec, err := kernels.ParsePrecision(t.MixedPrecision)
	if err != nil {
		return nil, fmt.Errorf("%s: training.mixed_precision: %w", cfg.Path, err)
	}
	tr := &trainer{cfg: cfg, sched: sched, loader: loader, size: cfg.Parallelism.WorldSize, prec: prec}
	if prec == kernels.FP16 {
		if tr.scaler, err = optim.NewLossScaler(t.LossScaleInit, t.LossScaleGrowthInterval); err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.Path, err)
		}
	}
	// The initial weights, whole: the in-process ranks share one copy. An MPI rank with FSDP
	// generates and keeps only its chunks (newRank), so no process holds the whole model.
	var params0 []float32
	if comm == nil || !cfg.Parallelism.FSDP {
		params0 = model.InitParams(cfg.Model, model.NewLayout(cfg.Model), cfg.Run.Seed)
	}
	if comm != nil {
		if comm.Size() != tr.size {
			return nil, fmt.Errorf("%s: parallelism.world_size = %d, but the launcher started %d processes: make them equal (mpirun -np %d)",
				cfg.Path, tr.size, comm.Size(), tr.size)
		}
		r, err := tr.newRank(comm, params0)
		if err != nil {
			return nil, fmt.Errorf("%s: rank %d: %w", cfg.Path, comm.Rank(), err)
		}
		tr.ranks = []*rank{r}
	} else {
		tr.world = transport.NewWorld(tr.size)
		tr.ranks = make([]*rank, tr.size)
		err = tr.world.Run(func(c transport.Comm) error {
			r, err := tr.newRank(c, params0)
			tr.ranks[c.Rank()] = r
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.Path, err)
		}
	}
	// The initial weights are in the ranks now: their host copy is freed before the
	// optimizer's moments are allocated, so the two never take memory together.
	params0 = nil
	runtime.GC()
	tc := cfg.Training
	for _, r := range tr.ranks {
		r.opt = optim.NewAdamW(r.be, r.params.Len(), r.segs,
			optim.Hyper{Beta1: tc.Beta1, Beta2: tc.Beta2, Eps: tc.Eps, WeightDecay: tc.WeightDecay})
	}
	return tr, nil
}

// newRank builds the state of the rank c belongs to. Every rank of the world calls it at the
// same time: splitting off the sequence-parallel group and the FSDP prefetch group are
// collective calls.
func (t *trainer) newRank(c transport.Comm, params0 []float32) (*rank, error) {
	cfg := t.cfg
	p := cfg.Parallelism
	policy, err := model.ParseCheckpoint(cfg.Checkpoint.Activation)
	if err != nil {
		return nil, err
	}
	layout, err := parallel.LayoutOf(p.Attention)
	if err != nil {
		return nil, err
	}
	sp := p.SequenceParallelDegree
	if cfg.Device.Kind == "cuda" && t.world != nil && c.Size() > 1 {
		return nil, fmt.Errorf("device.kind = \"cuda\" with parallelism.world_size = %d in one process: a GPU rank is a process; launch them with mpirun -np %d (or srun), each takes the GPU of its local rank", c.Size(), c.Size())
	}
	be, err := kernels.NewDevice(cfg.Device.Kind, transport.LocalRank())
	if err != nil {
		return nil, err
	}
	if p.Backend == "nccl" {
		// NCCL moves the device buffers itself; c (MPI, or the in-process world of one
		// rank) bootstraps it and carries its splits' agreements
		lib, ok := be.(transport.NCCLLib)
		if !ok {
			return nil, fmt.Errorf("parallelism.backend = \"nccl\" needs device.kind = \"cuda\" (device %s has no NCCL)", be.Name())
		}
		opt, err := transport.NCCLOptionsFromEnv()
		if err != nil {
			return nil, err
		}
		if c, err = transport.NewNCCL(c, lib, opt); err != nil {
			return nil, err
		}
	} else if hm, ok := be.(interface{ HostMemory() bool }); !ok || !hm.HostMemory() {
		// the in-process and MPI communicators move host memory: device buffers go through
		// host copies (transport.Staged), the same bytes at every call site
		c = transport.Staged(c, be)
	}
	r := &rank{id: c.Rank(), Comm: c, be: be, replica: c.Rank() / sp, stats: make([]float32, statLen)}
	r.statBuf, r.statAll = r.be.Alloc(statLen), r.be.Alloc(statLen*c.Size())
	spComm := c
	if c.Size() > sp {
		spComm = c.Split(r.replica, c.Rank()%sp, "sp.split")
	}
	if r.pos, err = layout.Positions(cfg.Data.SeqLen, sp, spComm.Rank()); err != nil {
		return nil, err
	}
	mlayout := model.NewLayout(cfg.Model)
	segs := segments(mlayout)
	switch {
	case p.FSDP:
		r.fsdp = parallel.NewFSDP(c, r.be, mlayout, parallel.FSDPOptions{Precision: t.prec, Prefetch: true})
		if params0 != nil {
			r.fsdp.Load(params0)
		} else {
			r.fsdp.LoadEach(func(visit func(off int, vals []float32)) {
				model.InitParamsEach(cfg.Model, mlayout, cfg.Run.Seed, 1<<20, visit)
			})
		}
		r.model = model.NewWithStore(cfg.Model, policy, r.be, r.fsdp)
		r.model.LossChunk, r.model.MLPTile, r.model.ActPrecision = cfg.LossChunkTokens(), cfg.MLPTileTokens(), t.prec
		r.params, r.grads = r.fsdp.Master, r.fsdp.MasterGrads
		segs = r.fsdp.Segments(mlayout)
	default:
		r.model = model.New(cfg.Model, policy, r.be)
		r.model.LoadParams(params0)
		r.model.LossChunk, r.model.MLPTile, r.model.ActPrecision = cfg.LossChunkTokens(), cfg.MLPTileTokens(), t.prec
		r.params, r.grads = r.model.Params.Flat, r.model.Grads.Flat
		if t.prec != kernels.FP32 {
			r.cast = model.NewCastStore(r.be, mlayout, r.params, r.grads, t.prec)
			r.model.Store = r.cast
		}
	}
	r.be.SetMatMulPrecision(t.prec)
	if sp > 1 {
		a, err := parallel.NewAttention(p.Attention, spComm, r.be, parallel.Options{Overlap: p.OverlapComm, UlyssesDegree: p.UlyssesDegree})
		if err != nil {
			return nil, err
		}
		r.model.Attn = a
	}
	r.segs = segs
	return r, nil
}

// segments groups consecutive tensors of the layout that share a weight-decay setting.
func segments(l model.Layout) []optim.Segment {
	var segs []optim.Segment
	for _, t := range l.Tensors {
		if n := len(segs); n > 0 && segs[n-1].Decay == t.Decay && segs[n-1].Off+segs[n-1].N == t.Off {
			segs[n-1].N += t.Size()
			continue
		}
		segs = append(segs, optim.Segment{Off: t.Off, N: t.Size(), Decay: t.Decay})
	}
	return segs
}

// run calls fn on every rank of this process, concurrently, and returns the first error.
func (t *trainer) run(fn func(r *rank) error) error {
	if t.world == nil {
		if err := fn(t.ranks[0]); err != nil {
			return fmt.Errorf("rank %d: %w", t.ranks[0].id, err)
		}
		return nil
	}
	return t.world.Run(func(c transport.Comm) error { return fn(t.ranks[c.Rank()]) })
}

// memory returns the bytes rank r holds for the model and its training.
func (r *rank) memory() Memory {
	m := Memory{Params: 4 * int64(r.params.Len()), Grads: 4 * int64(r.grads.Len()),
		Optimizer: 2 * 4 * int64(r.params.Len()), Activations: r.model.ActivationBytes()}
	if r.fsdp != nil {
		f := r.fsdp.Memory()
		m.Compute = f.GatheredPeak + f.PackedBuffers + f.GradBuffers
	} else if r.cast != nil {
		m.Compute = r.cast.Bytes()
	}
	return m
}

// Memory is what one rank holds, in bytes (metrics.jsonl "memory", one entry per rank).
type Memory struct {
	Params      int64 `json:"params"`      // fp32 master weights: all of them, or the rank's FSDP chunks
	Grads       int64 `json:"grads"`       // fp32 gradients, likewise
	Optimizer   int64 `json:"optimizer"`   // AdamW first and second moments (fp32, same extent as Params)
	Compute     int64 `json:"compute"`     // per-unit working buffers: FSDP's gathered units (peak) and unit gradient, or the 16-bit compute copy
	Activations int64 `json:"activations"` // the model's activation buffers of the step (peak)
}

// fullParams returns the whole parameter vector in Layout order on this process's first
// rank (nil on the others). It is collective: with FSDP every rank sends its chunks.
func (t *trainer) fullParams() []float32 {
	var out []float32
	_ = t.run(func(r *rank) error {
		var p []float32
		if r.fsdp != nil {
			p = r.fsdp.FullParams()
		} else if r == t.ranks[0] {
			p = make([]float32, r.params.Len())
			r.be.Download(p, r.params)
		}
		if r == t.ranks[0] {
			out = p
		}
		return nil
	})
	return out
}

// step runs one optimizer step (grad_accum_steps micro-batches per replica) on every rank and
// returns its metrics. Each rank computes the loss and gradients of its tokens of its
// replica's sequences; the gradients are summed over all ranks (dscale makes the sum the
// global mean's gradient) by an all-reduce, or by FSDP's reduce-scatters, and each rank
// applies the update to what it holds.
func (t *trainer) step(step int) (Metrics, error) {
	cfg := t.cfg
	accum := cfg.Training.GradAccumSteps
	dp := t.size / cfg.Parallelism.SequenceParallelDegree
	B, T := cfg.Data.BatchSize, cfg.Data.SeqLen
	dscale := 1 / float64(B*T*accum*dp)
	scale := 1.0
	if t.scaler != nil {
		scale = t.scaler.Scale
	}
	batches := make([][]data.Batch, accum) // [micro-batch][replica]
	for a := range batches {
		for d := 0; d < dp; d++ {
			batches[a] = append(batches[a], t.loader.Next())
		}
	}
	lr := t.sched.At(step)
	var out Metrics
	err := t.run(func(r *rank) error {
		sent := attnBytes(r.Comm.Traffic())
		lossSum, count := t.gradients(r, batches, float32(dscale*scale))
		sent = attnBytes(r.Comm.Traffic()) - sent
		if t.beforeUpdate != nil {
			t.beforeUpdate(step, r)
		}
		st := t.gatherStats(r, lossSum, count, sent)
		norm := math.Sqrt(st.sumsq) / scale
		if !st.bad {
			clip := float64(optim.ClipScale(norm, cfg.Training.GradClip))
			r.opt.Update(r.params, r.grads, lr, float32(clip/scale))
			if r.cast != nil {
				r.cast.Refresh()
			}
		}
		if r == t.ranks[0] {
			out = Metrics{Step: step + 1, Loss: st.loss / st.tokens, LR: lr, GradNorm: norm, Tokens: int64(st.tokens),
				AttnForwards: r.model.Stats.AttnForwards, AttnBytes: st.attnBytes, Skipped: st.bad && t.scaler != nil, Memory: st.mems, stop: st.stop,
				diverged: st.bad && t.scaler == nil}
		}
		return nil
	})
	if err != nil {
		return Metrics{}, fmt.Errorf("train: step %d: %w", step+1, err)
	}
	if t.scaler != nil {
		out.LossScale = scale
		t.scaler.Update(!out.Skipped)
	}
	return out, nil
}

// gradients is rank r's forward and backward over the step's micro-batches (its replica's
// batch of each, its tokens of each sequence), with the loss scaled by lossScale: the
// gradients accumulate in r.grads (summed over the data-parallel replicas without FSDP;
// FSDP reduce-scatters them as it goes). It returns r's summed loss and target count.
func (t *trainer) gradients(r *rank, batches [][]data.Batch, lossScale float32) (lossSum float64, count int) {
	m, par := r.model, t.cfg.Parallelism
	B, T := t.cfg.Data.BatchSize, t.cfg.Data.SeqLen
	if r.fsdp != nil {
		r.fsdp.ZeroGrads()
	} else {
		m.ZeroGrads()
	}
	for _, mb := range batches {
		b := mb[r.replica]
		if par.BalanceDocuments {
			sp := par.SequenceParallelDegree
			if par.UlyssesDegree > 1 && par.Attention != "ulysses" {
				sp /= par.UlyssesDegree // a hybrid balances its groups; inside one the all-to-all splits the work by head
			}
			b = balanceBatch(b, par.Attention, sp)
		}
		ids := parallel.Shard(b.Inputs, B, T, 1, r.pos)
		tg := parallel.Shard(b.Targets, B, T, 1, r.pos)
		l, n := m.ForwardBackward(model.Batch{IDs: ids, Targets: tg, B: B, Pos: r.pos, SeqLen: T,
			Docs: b.DocStart, ResetPositions: t.cfg.Data.PositionReset}, lossScale)
		lossSum += l
		count += n
	}
	if r.fsdp == nil && t.size > 1 {
		r.Comm.AllReduce(r.grads, "grad.allreduce")
	}
	return lossSum, count
}

// anyStop reports on every rank whether some rank's process was asked to stop (local: this
// process was), so that all stop at the same point: an all-gather of one flag per rank.
func (t *trainer) anyStop(local bool) bool {
	stop := false
	_ = t.run(func(r *rank) error {
		s := r.stats
		clear(s)
		if local {
			s[statStop] = 1
		}
		r.be.Upload(r.statBuf, s)
		r.Comm.AllGather(r.statAll, r.statBuf, "stats.stop")
		all := make([]float32, statLen*t.size)
		r.be.Download(all, r.statAll)
		any := false
		for q := range t.size {
			any = any || all[q*statLen+statStop] != 0
		}
		if r == t.ranks[0] {
			stop = any
		}
		return nil
	})
	return stop
}

// peakFLOPS is the FLOP/s MFU divides by, of all the world's devices: device.peak_tflops each,
// else the dense bf16 peak of the GPU the backend names (a CUDA backend), else 0 (not known).
func peakFLOPS(cfg config.Config, be kernels.Backend) float64 {
	per := cfg.Device.PeakTFLOPS * 1e12
	if d, ok := be.(interface{ DeviceName() string }); ok && per == 0 {
		per = plan.PeakFLOPS(d.DeviceName())
	}
	return per * float64(cfg.Parallelism.WorldSize)
}

// stepStats is what every rank knows after gatherStats: the step's summed loss and targets,
// the squared gradient norm, whether some gradient is not finite, whether some rank was
// asked to stop, and every rank's memory.
type stepStats struct {
	loss, tokens, sumsq float64
	bad, stop           bool
	mems                []Memory
	attnBytes           int64 // the busiest rank's
}

// attnBytes is what a rank's traffic holds of attention: everything but the gradients'
// all-reduce, FSDP's collectives and the step's statistics.
func attnBytes(tr transport.Traffic) int64 {
	return tr.Total() - tr.Sum("grad.") - tr.Sum("fsdp.") - tr.Sum("stats")
}

// gatherStats all-gathers rank r's loss, target count, squared gradient norm (every rank's
// share with FSDP; rank 0's whole sum without), finiteness, stop request, memory and attention
// bytes, and sums them in rank order (the bytes: the largest), so every rank reaches the same
// numbers.
func (t *trainer) gatherStats(r *rank, lossSum float64, count int, attn int64) stepStats {
	s := r.stats
	clear(s)
	putStat(s, statLoss, lossSum)
	putStat(s, statCount, float64(count))
	if r.fsdp != nil || r.id == 0 { // without FSDP every rank holds the same summed gradient
		putStat(s, statSumSq, r.be.SumSquares(r.grads))
	}
	if !r.be.AllFinite(r.grads) {
		s[statBad] = 1
	}
	if t.stopRequested != nil && t.stopRequested() {
		s[statStop] = 1
	}
	mem := r.memory()
	putStat(s, statParams, float64(mem.Params))
	putStat(s, statGrads, float64(mem.Grads))
	putStat(s, statOptim, float64(mem.Optimizer))
	putStat(s, statCompute, float64(mem.Compute))
	putStat(s, statActs, float64(mem.Activations))
	putStat(s, statAttn, float64(attn))
	r.be.Upload(r.statBuf, s)
	r.Comm.AllGather(r.statAll, r.statBuf, "stats")
	all := make([]float32, statLen*t.size)
	r.be.Download(all, r.statAll)
	out := stepStats{mems: make([]Memory, t.size)}
	for q := range t.size {
		st := all[q*statLen : (q+1)*statLen]
		out.loss += getStat(st, statLoss)
		out.tokens += getStat(st, statCount)
		out.sumsq += getStat(st, statSumSq)
		out.bad = out.bad || st[statBad] != 0
		out.stop = out.stop || st[statStop] != 0
		out.attnBytes = max(out.attnBytes, int64(getStat(st, statAttn)))
		out.mems[q] = Memory{Params: int64(getStat(st, statParams)), Grads: int64(getStat(st, statGrads)),
			Optimizer: int64(getStat(st, statOptim)), Compute: int64(getStat(st, statCompute)),
			Activations: int64(getStat(st, statActs))}
	}
	return out
}

// Options are train's command-line choices that are not part of the config.
type Options struct {
	Progress  bool   // draw a progress bar (else log lines)
	Resume    string // "", "auto" or a checkpoint path
	Fresh     bool   // start over: move an earlier run in the run directory aside
	StopAfter int    // stop (with a checkpoint) after this step; 0 = run to training.steps
	// initParams, when set (--init-from), replace the initial weights (model Layout order).
	InitParams []float32
	// comm, when set, makes this process one rank of a world of processes (MPI). Only rank 0
	// prints and writes the run's shared files; every rank writes its checkpoint shard.
	Comm transport.Comm
	// Clock, when set, is kept at the step being trained and how long steps and saves take
	// (for the Ctrl-C message), and holds the time limit (--time-limit). Nil: a clock without
	// a limit.
	Clock *Clock
	// Profile, when set (--profile), is the directory where rank 0 writes Go CPU and heap
	// profiles of the steps ProfileSteps names (first and last, 1-based, of this session's steps).
	Profile      string
	ProfileSteps [2]int
}

// divergedError ends a run whose loss or gradient norm is not a finite number.
type divergedError struct {
	step           int
	loss, gradNorm float64
	lr             float64
	last           string // the newest checkpoint, or ""
}

func (e *divergedError) Error() string {
	msg := fmt.Sprintf("train: diverged at step %d (loss %g, grad_norm %g, lr %.3g): lower training.lr, raise training.warmup_steps or set training.grad_clip",
		e.step, e.loss, e.gradNorm, e.lr)
	if e.last != "" {
		return msg + "; the last good checkpoint, " + e.last + ", is untouched: --resume auto continues from it"
	}
	return msg + "; no checkpoint was saved before it"
}

// Run runs the configured number of steps, writing metrics.jsonl, a progress bar and
// checkpoints: every checkpoint.interval steps, and always one of the step where it stops (the
// last step, or where a signal or --stop-after stopped it). A cancelled ctx (Ctrl-C, SIGTERM)
// stops after the current step and saves a checkpoint there. Nothing is written into the run
// directory before the config, the data and the tokenizer are known to be good, and the run
// directory is locked for the run's lifetime (runDirs).
func Run(ctx context.Context, cfg config.Config, stdout, stderr io.Writer, opt Options) error {
	if os.Getenv("GOGC") == "" {
		// A training process's heap is a few large buffers that live for the whole run; the
		// collector's default slack (GOGC=100: the heap may double before a collection) would
		// take as much memory again. 10% keeps the peak near what plan counts, at no speed
		// measurable here (bench/memory.sh). GOGC in the environment wins.
		debug.SetGCPercent(10)
	}
	leader := opt.Comm == nil || opt.Comm.Rank() == 0
	if !leader {
		stdout, stderr, opt.Progress = io.Discard, io.Discard, false
	}
	r, err := setup(cfg, stderr, opt, leader)
	if r != nil {
		defer r.close()
	}
	if err != nil {
		return err
	}
	r.stdout = stdout
	if err := r.loop(ctx); err != nil {
		return err
	}
	if err := r.finish(); err != nil {
		return err
	}
	return r.t.closeComms()
}

// closeComms releases the communicators that hold resources of their own (NCCL's: each rank's
// communicators and streams) at the end of a run that went well; after a failure the process's
// exit releases them, as a destroy would wait for peers that may be gone.
func (t *trainer) closeComms() error {
	for _, r := range t.ranks {
		if c, ok := r.Comm.(interface{ Close() error }); ok {
			if err := c.Close(); err != nil {
				return fmt.Errorf("train: rank %d: %w", r.id, err)
			}
		}
	}
	return nil
}

// session is one training run in progress: the trainer, its directories and metrics file,
// and what the loop has done so far.
type session struct {
	cfg            config.Config
	opt            Options
	leader         bool
	stdout, stderr io.Writer
	t              *trainer
	dirs           *runDirs
	ev             *trainEval    // rank 0's evaluation every eval.interval steps
	sampler        *trainSampler // rank 0's samples of text every eval.sample_interval steps
	mf             *metricsFile
	metricsPath    string
	st             trainState // where the run started (a resumed checkpoint's step, else 0)
	bar            *progressbar.ProgressBar
	start          time.Time
	tokens         int64
	first, last    Metrics
	done, saved    int    // steps done, and the step of the newest checkpoint
	lastPath       string // the newest checkpoint this process saved or resumed from
	end            int    // the step to stop after (training.steps or --stop-after)
	dirsOpen       bool
	clock          *Clock
	flopsPerToken  float64   // plan.FLOPsPerToken of the model at data.seq_len
	peak           float64   // FLOP/s of all devices together; 0: not known
	recent         []float64 // the losses of the last runplot.LastSteps steps
	prof           *profiler // --profile, rank 0; nil: none
	tb             *tbLog    // run.tensorboard, rank 0; nil: none
}

// setup builds the trainer and the run's directory, metrics file and evaluation, resuming
// from a checkpoint when asked: everything before the first step. Rank 0 (leader) owns the
// directory; the other MPI ranks wait for it.
func setup(cfg config.Config, stderr io.Writer, opt Options, leader bool) (*session, error) {
	dirs := runDirsOf(cfg)
	if leader {
		if err := dirs.checkInUse(); err != nil {
			return nil, err
		}
	}
	if leader && opt.Resume == "" && !opt.Fresh {
		if err := dirs.checkFresh(); err != nil { // early, before the data is read; open checks again under the lock
			return nil, err
		}
	}
	fmt.Fprintf(stderr, "%s\n", cfg.Summary())
	for _, n := range cfg.Notes() {
		fmt.Fprintf(stderr, "note: %s\n", n)
	}
	if opt.Comm != nil {
		fmt.Fprintf(stderr, "mpi: %d processes; %s\n", opt.Comm.Size(), transport.MPIInfo())
	}
	t, err := newTrainerOn(cfg, stderr, opt.Comm)
	if err != nil {
		return nil, err
	}
	if opt.InitParams != nil {
		if err := t.loadWeights(opt.InitParams); err != nil {
			return nil, err
		}
	}
	r := &session{cfg: cfg, opt: opt, leader: leader, stderr: stderr, t: t, dirs: dirs}
	if cfg.Eval.Interval > 0 && leader {
		if r.ev, err = newTrainEval(cfg); err != nil {
			return nil, err
		}
		fmt.Fprintf(stderr, "eval: %d samples of up to %d tokens from %s every %d steps\n", len(r.ev.samples), evaluate.SeqLen(cfg), data.ShowPath(cfg.Data.Eval), cfg.Eval.Interval)
	}
	if cfg.Eval.SampleInterval > 0 && leader {
		if r.sampler, err = newTrainSampler(cfg, dirs.run); err != nil {
			return nil, err
		}
	}
	if leader {
		if err := dirs.open(cfg, opt.Resume, opt.Fresh, stderr); err != nil {
			return nil, err
		}
		r.dirsOpen = true
	}
	if opt.Comm != nil {
		opt.Comm.Barrier() // rank 0 has prepared the run directory
		if !leader {
			if dirs.id, _, err = ckpt.ReadRunID(dirs.run); err != nil {
				return r, err
			}
		}
	}
	t.id = dirs.id
	if opt.Resume != "" {
		if r.st, _, err = t.restore(opt.Resume, dirs.id, stderr); err != nil {
			return r, err
		}
	}
	r.metricsPath = filepath.Join(dirs.run, "metrics.jsonl")
	if leader {
		if r.mf, err = openMetrics(r.metricsPath, r.st.Step); err != nil {
			return r, err
		}
		if cfg.Run.TensorBoard {
			if r.tb, err = openTB(dirs.run, stderr); err != nil {
				return r, err
			}
		}
	}
	steps := cfg.Training.Steps
	r.end = steps
	if opt.StopAfter > 0 && opt.StopAfter < steps {
		r.end = opt.StopAfter
	}
	r.bar = progressbar.NewOptions(steps,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetVisibility(opt.Progress),
		progressbar.OptionSetWidth(24),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish())
	_ = r.bar.Set(r.st.Step)
	r.start, r.tokens = time.Now(), r.st.Tokens
	r.clock = opt.Clock
	if r.clock == nil {
		r.clock = NewClock(0)
	}
	r.clock.last.Store(int64(r.st.Step)) // the checkpoint resumed from, or 0
	r.clock.guessSave(int64(len(StateTensors)) * 4 * int64(t.ranks[0].model.Layout.Size))
	r.flopsPerToken = plan.FLOPsPerToken(cfg.Model, cfg.Data.SeqLen)
	r.peak = peakFLOPS(cfg, t.ranks[0].be)
	if opt.Profile != "" && leader {
		r.prof = &profiler{dir: opt.Profile, from: r.st.Step + opt.ProfileSteps[0], to: r.st.Step + opt.ProfileSteps[1]}
	}
	r.done, r.saved = r.st.Step, r.st.Step
	if r.st.Step > 0 {
		r.lastPath = filepath.Join(t.runDir(), ckpt.StepDir(r.st.Step))
	}
	return r, nil
}

// close releases the metrics file and the run directory's lock.
func (r *session) close() {
	r.mf.close()
	r.tb.close()
	if r.dirsOpen {
		r.dirs.close()
	}
}

// checkpoint saves the state after step and says where and how large.
func (r *session) checkpoint(step int) error {
	began := time.Now()
	t := r.t
	r.clock.saving.Store(int64(step))
	path, err := t.save(trainState{Step: step, Tokens: r.tokens, Elapsed: r.st.Elapsed + time.Since(r.start).Seconds()}, r.lastPath, r.stderr)
	r.clock.saving.Store(0)
	if err != nil {
		return err
	}
	r.clock.saved(step, time.Since(began))
	r.saved, r.lastPath = step, path
	r.bar.Clear()
	raw, stored := checkpointSize(path, t.ranks[0].model.Layout.Size)
	fmt.Fprintf(r.stderr, "checkpoint: step %d saved to %s (%.1f MB of fp32 state in %.1f MB, ratio %.3f, %.0f MB/s)\n",
		step, path, float64(raw)/1e6, float64(stored)/1e6, float64(raw)/float64(max(stored, 1)), float64(raw)/1e6/time.Since(began).Seconds())
	return nil
}

// loop trains from the start step to the end, or until a signal on any rank or the time limit
// stops it after a step, saving checkpoints every checkpoint.interval steps.
func (r *session) loop(ctx context.Context) error {
	t, cfg, steps, clock := r.t, r.cfg, r.cfg.Training.Steps, r.clock
	t.stopRequested = func() bool { return ctx.Err() != nil || clock.overLimit() }
	defer r.prof.stop(r.stderr)
	for s := r.st.Step; s < r.end; s++ {
		if err := r.prof.begin(s+1, r.stderr); err != nil {
			return err
		}
		clock.begin(s + 1)
		stepStart := time.Now()
		m, err := t.step(s)
		if err != nil {
			return err
		}
		clock.end()
		r.prof.end(s+1, r.stderr)
		r.tokens += m.Tokens
		m.ElapsedSec = r.st.Elapsed + time.Since(r.start).Seconds()
		m.TokensPerSec = float64(m.Tokens) / time.Since(stepStart).Seconds()
		m.FLOPsPerSec = m.TokensPerSec * r.flopsPerToken
		if r.peak > 0 {
			m.MFU = m.FLOPsPerSec / r.peak
		}
		m.Tokens = r.tokens
		if m.diverged || !finite(m.Loss) || !finite(m.GradNorm) && !m.Skipped {
			r.bar.Clear()
			if r.mf != nil {
				_ = r.mf.write(m) // the diverged step, with null for what is not a number
			}
			return &divergedError{step: m.Step, loss: m.Loss, gradNorm: m.GradNorm, lr: m.LR, last: r.lastPath}
		}
		if m.Skipped {
			r.bar.Clear()
			fmt.Fprintf(r.stderr, "step %d: fp16 gradients overflowed at loss scale %g: update skipped, scale now %g\n",
				m.Step, m.LossScale, t.scaler.Scale)
		}
		if cfg.Eval.Interval > 0 && (m.Step%cfg.Eval.Interval == 0 || m.Step == steps) {
			if err := r.evaluate(ctx, &m); err != nil {
				return err
			}
		}
		if k := cfg.Eval.SampleInterval; k > 0 && (m.Step%k == 0 || m.Step == steps) {
			if err := r.sample(ctx, m.Step); err != nil {
				return err
			}
		}
		if r.mf != nil {
			if err := r.mf.write(m); err != nil {
				return err
			}
		}
		r.tb.write(m)
		if r.first.Step == 0 {
			r.first = m
		}
		r.last, r.done = m, s+1
		if r.recent = append(r.recent, m.Loss); len(r.recent) > runplot.LastSteps {
			r.recent = r.recent[1:]
		}
		r.bar.Describe(fmt.Sprintf("loss %.4f  lr %.2e  %.0f tok/s%s", m.Loss, m.LR, float64(r.tokens-r.st.Tokens)/time.Since(r.start).Seconds(), mfuText(m)))
		_ = r.bar.Add(1)
		if !r.opt.Progress && cfg.Run.LogInterval > 0 && (m.Step%cfg.Run.LogInterval == 0 || m.Step == steps) {
			fmt.Fprintf(r.stderr, "%s\n", r.logLine(m))
		}
		if m.stop { // a signal on any rank, or the time limit: every rank stops after this step
			if clock.limited.Load() {
				r.bar.Clear()
				fmt.Fprintf(r.stderr, "time limit %s: stopping after step %d, %s into the run, and saving (a step takes about %s, a save about %s)\n",
					Duration(clock.limit), m.Step, Duration(time.Since(clock.started)), Duration(time.Duration(clock.stepNS.Load())), Duration(time.Duration(clock.saveNS.Load())))
			}
			break
		}
		if k := cfg.Checkpoint.Interval; k > 0 && m.Step%k == 0 && m.Step < r.end {
			if err := r.checkpoint(m.Step); err != nil {
				return err
			}
			if t.anyStop(ctx.Err() != nil) { // a signal during the save: stop here, it is saved
				break
			}
		}
	}
	_ = r.bar.Finish()
	return nil
}

// logLine is the log line of step m without a progress bar: the step's numbers, the time the
// run has taken (this session and any it resumed) and the time left at this session's mean
// step time.
func (r *session) logLine(m Metrics) string {
	line := fmt.Sprintf("step %d/%d  loss %.4f  lr %.2e  grad_norm %.3f  %.0f tok/s  %s%s  elapsed %s",
		m.Step, r.cfg.Training.Steps, m.Loss, m.LR, m.GradNorm, m.TokensPerSec, flopsText(m.FLOPsPerSec), mfuText(m), Duration(time.Duration(m.ElapsedSec*1e9)))
	if left := r.end - m.Step; left > 0 {
		line += "  eta " + Duration(time.Duration(left)*time.Duration(r.clock.stepNS.Load()))
	}
	return line
}

// flopsText writes a FLOP/s figure with its SI prefix: "3.2 GFLOP/s".
func flopsText(f float64) string {
	for _, u := range []struct {
		v float64
		p string
	}{{1e15, "P"}, {1e12, "T"}, {1e9, "G"}, {1e6, "M"}} {
		if f >= u.v {
			return fmt.Sprintf("%.3g %sFLOP/s", f/u.v, u.p)
		}
	}
	return fmt.Sprintf("%.3g FLOP/s", f)
}

// mfuText is "  mfu 14.8%" when the peak is known, else "".
func mfuText(m Metrics) string {
	if m.MFU <= 0 {
		return ""
	}
	return fmt.Sprintf("  mfu %.1f%%", 100*m.MFU)
}

// meanRecent is the mean loss of the last runplot.LastSteps steps (fewer when fewer ran).
func (r *session) meanRecent() float64 {
	sum := 0.0
	for _, l := range r.recent {
		sum += l
	}
	return sum / float64(max(len(r.recent), 1))
}

// evaluate runs the held-out evaluation after m's step (every rank takes part in gathering
// the parameters; rank 0 evaluates) and puts its result in m. A stop signal during it skips
// the result.
func (r *session) evaluate(ctx context.Context, m *Metrics) error {
	params := r.t.fullParams() // collective
	res, err := evaluate.Result{}, error(nil)
	if r.ev != nil {
		res, err = r.ev.run(ctx, params)
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("train: eval at step %d: %w", m.Step, err)
	}
	if err == nil && r.ev != nil {
		m.EvalLoss, m.EvalPerplexity, m.EvalBitsPerByte = res.Loss, res.Perplexity, res.BitsPerByte
		r.bar.Clear()
		fmt.Fprintf(r.stderr, "eval step %d: loss %.4f  perplexity %.3f  bits/byte %.4f  (%d tokens)\n", m.Step, res.Loss, res.Perplexity, res.BitsPerByte, res.Tokens)
	}
	return nil
}

// sample continues eval.sample_prompt with the weights after step (every rank takes part in
// gathering them; rank 0 generates), prints the text and appends it to the run's
// samples.jsonl. A stop signal during it skips the sample.
func (r *session) sample(ctx context.Context, step int) error {
	params := r.t.fullParams() // collective
	if r.sampler == nil {
		return nil
	}
	text, err := r.sampler.run(ctx, params, step)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("train: sample at step %d: %w", step, err)
	}
	r.bar.Clear()
	fmt.Fprintf(r.stderr, "sample step %d: %q\n", step, r.cfg.Eval.SamplePrompt+text)
	return nil
}

// finish ends the run: a checkpoint of the step where it stopped (the last step, or where a
// signal or --stop-after stopped it, so that the model is kept and --resume auto continues
// from here), the metrics file closed, the run's picture, and what was done.
func (r *session) finish() error {
	t, cfg, steps, stdout := r.t, r.cfg, r.cfg.Training.Steps, r.stdout
	if r.done > r.saved {
		if err := r.checkpoint(r.done); err != nil {
			return err
		}
	}
	if err := r.mf.close(); err != nil {
		return err
	}
	if r.leader && r.done > r.st.Step {
		png := filepath.Join(r.dirs.run, "metrics.png")
		if err := runplot.WriteRun(r.dirs.run, png); err != nil { // the run is saved: a picture that fails is only said
			fmt.Fprintf(r.stderr, "plot: %v\n", err)
		} else {
			fmt.Fprintf(r.stderr, "plot: %s\n", png)
		}
	}
	elapsed := time.Since(r.start).Seconds()
	switch {
	case r.done < steps:
		fmt.Fprintf(stdout, "stopped after step %d of %d; checkpoint in %s; continue with --resume auto; metrics in %s\n",
			r.done, steps, r.lastPath, r.metricsPath)
	case r.first.Step == 0:
		fmt.Fprintf(stdout, "nothing to train: the checkpoint is at step %d of %d\n", r.done, steps)
	default:
		end := fmt.Sprintf("%.4f", r.last.Loss)
		if len(r.recent) > 1 {
			end = fmt.Sprintf("%.4f (mean of the last %d steps; the last step's %.4f)", r.meanRecent(), len(r.recent), r.last.Loss)
		}
		fmt.Fprintf(stdout, "trained %d steps in %.1fs (%.0f tokens/s): loss %.4f -> %s (ln vocab = %.4f); model in %s; metrics in %s\n",
			r.done-r.st.Step, elapsed, float64(r.tokens-r.st.Tokens)/elapsed, r.first.Loss, end, math.Log(float64(cfg.Model.VocabSize)), r.lastPath, r.metricsPath)
	}
	if t.scaler != nil && t.scaler.Skipped > 0 {
		fmt.Fprintf(stdout, "fp16: %d steps skipped for overflowing gradients; loss scale now %g\n", t.scaler.Skipped, t.scaler.Scale)
	}
	writeMemory(stdout, r.last.Memory)
	return nil
}

// finite reports whether v is a number other than ±Inf.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// trainEval is train's held-out evaluation: the samples of data.eval, loaded once, and the
// ranks that evaluate them (cfg's sequence-parallel world), built once and given the current
// weights at each evaluation.
type trainEval struct {
	ev      *evaluate.Evaluator
	samples []evaluate.Sample
	seqLen  int
}

// newTrainEval loads data.eval's first eval.samples documents and builds the evaluator.
func newTrainEval(cfg config.Config) (*trainEval, error) {
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("%s: data.tokenizer: %w", cfg.Path, err)
	}
	seqLen := evaluate.SeqLen(cfg)
	samples, err := evaluate.LoadSamples(cfg.Data.Eval, cfg.Data, tok, -1, seqLen, cfg.Model.VocabSize, cfg.Eval.Samples)
	if err != nil {
		return nil, fmt.Errorf("%s: data.eval: %w", cfg.Path, err)
	}
	ev, err := evaluate.NewEvaluator(cfg.Model, cfg.Parallelism)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	return &trainEval{ev: ev, samples: samples, seqLen: seqLen}, nil
}

// run evaluates params (model Layout order) on the samples.
func (e *trainEval) run(ctx context.Context, params []float32) (evaluate.Result, error) {
	if err := e.ev.Load(params); err != nil {
		return evaluate.Result{}, err
	}
	r, err := e.ev.Evaluate(ctx, e.samples, nil)
	r.SeqLen = e.seqLen
	return r, err
}

// trainSampler is train's text samples: the prompt tokenized once and one rank's evaluator
// (the whole model on rank 0: a sample is short) given the current weights each time.
type trainSampler struct {
	ev     *evaluate.Evaluator
	tok    data.Tokenizer
	prompt []int32
	opt    evaluate.GenOptions
	path   string // samples.jsonl
}

// newTrainSampler tokenizes eval.sample_prompt and builds a one-rank evaluator.
func newTrainSampler(cfg config.Config, runDir string) (*trainSampler, error) {
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("%s: data.tokenizer: %w", cfg.Path, err)
	}
	prompt := tok.Encode([]byte(cfg.Eval.SamplePrompt))
	if len(prompt) == 0 {
		return nil, fmt.Errorf("%s: eval.sample_prompt is empty: give the text the samples continue", cfg.Path)
	}
	par := cfg.Parallelism
	par.SequenceParallelDegree, par.WorldSize, par.Backend = 1, 1, "inproc"
	ev, err := evaluate.NewEvaluator(cfg.Model, par)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	opt := evaluate.GenOptions{MaxNew: cfg.Eval.SampleTokens}
	if sp, ok := tok.(data.SpecialTokens); ok {
		if _, eos := sp.Specials(); eos >= 0 {
			opt.Stop = []int32{eos}
		}
	}
	return &trainSampler{ev: ev, tok: tok, prompt: prompt, opt: opt, path: filepath.Join(runDir, "samples.jsonl")}, nil
}

// run generates from params (model Layout order) and appends the sample of step to
// samples.jsonl; it returns the new text.
func (s *trainSampler) run(ctx context.Context, params []float32, step int) (string, error) {
	if err := s.ev.Load(params); err != nil {
		return "", err
	}
	g, err := s.ev.Generate(ctx, s.prompt, s.opt, nil)
	if err != nil {
		return "", err
	}
	text := string(s.tok.Decode(g.Tokens))
	line, err := json.Marshal(map[string]any{"step": step, "prompt": string(s.tok.Decode(s.prompt)), "text": text, "tokens": g.Tokens})
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(s.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		f.Close()
		return "", err
	}
	return text, f.Close()
}

// writeMemory prints the per-rank memory table of the end of a run.
func writeMemory(w io.Writer, mems []Memory) {
	if len(mems) == 0 {
		return
	}
	mib := func(b int64) string { return fmt.Sprintf("%.2f", float64(b)/(1<<20)) }
	fmt.Fprintf(w, "memory per rank (MiB): %-5s %9s %9s %9s %9s %11s %9s\n", "rank", "params", "grads", "optimizer", "compute", "activations", "total")
	for r, m := range mems {
		total := m.Params + m.Grads + m.Optimizer + m.Compute + m.Activations
		fmt.Fprintf(w, "                       %-5d %9s %9s %9s %9s %11s %9s\n", r, mib(m.Params), mib(m.Grads),
			mib(m.Optimizer), mib(m.Compute), mib(m.Activations), mib(total))
	}
}

// balanceBatch returns b with the documents of each sequence reordered for even attention
// work on P ranks of schedule (parallel.BalanceDocuments); each token keeps its target and
// its offset in its document, so the loss is the same. Every rank computes the same order.
func balanceBatch(b data.Batch, schedule string, P int) data.Batch {
	T := b.T
	out := data.Batch{B: b.B, T: T, Inputs: make([]int32, len(b.Inputs)), Targets: make([]int32, len(b.Targets)), DocStart: make([]int32, len(b.DocStart))}
	for s := 0; s < b.B; s++ {
		perm, start, err := parallel.BalanceDocuments(b.DocStart[s*T:(s+1)*T], schedule, P, uint64(s))
		if err != nil {
			panic(err) // the loader's document starts are intervals by construction
		}
		for i, p := range perm {
			out.Inputs[s*T+i], out.Targets[s*T+i] = b.Inputs[s*T+int(p)], b.Targets[s*T+int(p)]
		}
		copy(out.DocStart[s*T:], start)
	}
	return out
}
