package train

import (
	"fmt"
	"io"
	"runtime"

	"distflash/ckpt"
	"distflash/config"
	"distflash/data"
	"distflash/kernels"
	"distflash/model"
	"distflash/optim"
	"distflash/plan"
	"distflash/world"
)

// trainer holds the pieces of a run: the data, the schedule, the world and the ranks this
// process runs, each a world.Rank (backend, model, schedule, FSDP or cast store) with its
// optimizer. The world has dp data-parallel replicas of sp sequence-parallel ranks each
// (world.Dims). Without FSDP every rank holds all parameters, and ranks stay identical
// because they apply the same update to the same all-reduced gradients; with FSDP each rank
// holds and updates its chunk of every unit (parallel.FSDP).
type trainer struct {
	cfg    config.Config
	sched  optim.Schedule
	loader *data.Mixture
	w      *world.World
	ranks  []*rank // the ranks this process runs, in rank order
	prec   kernels.Precision
	scaler *optim.LossScaler // fp16 only
	id     ckpt.RunID        // the run's identity, saved in every checkpoint
	trace  *tracer           // DISTFLASH_TRACE, rank 0; nil: none
	spikes *spikeWatch       // the recent steps' loss and gradient norm, and the spikes seen
	// ranOut says, for each source of a mixture, whether its running out (its first epoch
	// complete) has been said, or it had run out before the checkpoint this run resumed.
	ranOut []bool
	warmed string // what the attention warm-up built, for the log ("": none ran)
	// choice is what the config left to the device (checkpoint.activation = "auto",
	// training.mlp_tile and loss_chunk -1) as decided for memory bytes per rank (0: not known;
	// memorySource says where the figure comes from): the policy, tile and chunk the ranks'
	// models run (plan.Choose), and what a checkpoint records of them.
	choice       plan.Choice
	memory       float64
	memorySource string

	// beforeUpdate, when set (tests), runs on every rank after the gradients are complete and
	// before they are checked and applied.
	beforeUpdate func(step int, r *rank)
	// stopRequested reports whether this process was asked to stop (SIGINT, SIGTERM). Ranks
	// exchange it with each step's statistics, so all stop after the same step.
	stopRequested func() bool
}

// rank is one worker's training state: the world's rank and its optimizer.
type rank struct {
	*world.Rank
	opt     *optim.AdamW
	pos     []int32         // global positions of this rank's tokens in every sequence of data.seq_len
	segs    []optim.Segment // the pieces of Params, for the optimizer (weight decay or not)
	stats   []float32       // this rank's statistics of the step (statLen)
	statBuf kernels.Buf     // the same, on the backend
	statAll kernels.Buf     // every rank's, gathered
}

// size is the world's number of ranks.
func (t *trainer) size() int { return t.w.Dims.World }

// newTrainer builds a trainer whose ranks all run in this process (the in-process world), or,
// under an MPI launcher, this process's rank.
func newTrainer(cfg config.Config, stderr io.Writer) (*trainer, error) {
	w, err := world.Launch(&cfg, stderr)
	if err != nil {
		return nil, err
	}
	return newTrainerOn(cfg, stderr, w)
}

// newTrainerOn builds a trainer on the launched world w: it reads the training data, opens
// the world's devices and puts the model on its ranks (world.Build), with the initial weights
// of run.seed, and an optimizer on each.
func newTrainerOn(cfg config.Config, stderr io.Writer, w *world.World) (*trainer, error) {
	loader, err := NewLoader(cfg, stderr)
	if err != nil {
		return nil, err
	}
	t := cfg.Training
	sched := optim.Schedule{Kind: t.LRSchedule, LR: t.LR, MinLR: t.MinLR, Warmup: t.WarmupSteps, Steps: t.Steps}
	if err := sched.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Origin(""), err)
	}
	prec, err := kernels.ParsePrecision(t.MixedPrecision)
	if err != nil {
		return nil, fmt.Errorf("%s: training.mixed_precision: %w", cfg.Origin("training.mixed_precision"), err)
	}
	tr := &trainer{cfg: cfg, sched: sched, loader: loader, w: w, prec: prec, spikes: &spikeWatch{}}
	if prec == kernels.FP16 {
		if tr.scaler, err = optim.NewLossScaler(t.LossScaleInit, t.LossScaleGrowthInterval); err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.Origin(""), err)
		}
	}
	if err := w.Open(); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Origin(""), err)
	}
	// What the config leaves to the device (checkpoint.activation = "auto", training.mlp_tile
	// and loss_chunk -1) is decided now that the devices, and so their memory, are known: by
	// plan's estimate, the same on every rank (SharedMemory), said in the run's first lines.
	tr.memory, tr.memorySource, _ = w.SharedMemory()
	tr.choice = plan.Choose(cfg, tr.memory)
	if msg := tr.choiceLine(); msg != "" {
		fmt.Fprintf(stderr, "%s\n", msg)
	}
	policy, err := model.ParseCheckpoint(tr.choice.Policy)
	if err != nil {
		return nil, fmt.Errorf("%s: checkpoint.activation: %w", cfg.Origin("checkpoint.activation"), err)
	}
	spec := world.Spec{Model: cfg.Model, Policy: policy, Precision: prec, FSDP: cfg.Parallelism.FSDP,
		LossChunk: tr.choice.LossChunk, MLPTile: tr.choice.MLPTile, Seed: cfg.Run.Seed}
	// The initial weights, whole: the in-process ranks share one copy. An MPI rank with FSDP
	// generates and keeps only its chunks, so no process holds the whole model.
	if !w.MPI() || !cfg.Parallelism.FSDP {
		spec.Params = model.InitParams(cfg.Model, model.NewLayout(cfg.Model), cfg.Run.Seed)
	}
	if err := w.Build(spec); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Origin(""), err)
	}
	// The initial weights are in the ranks now: their host copy is freed before the
	// optimizer's moments are allocated, so the two never take memory together.
	spec.Params = nil
	if tr.warmed, err = warmAttention(w, cfg.Data.SeqLen, prec); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Origin(""), err)
	}
	runtime.GC()
	tc := cfg.Training
	mlayout := model.NewLayout(cfg.Model)
	for _, wr := range w.Ranks() {
		r := &rank{Rank: wr, stats: make([]float32, statLen)}
		if r.pos, err = r.Positions(cfg.Data.SeqLen); err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.Origin(""), err)
		}
		r.statBuf, r.statAll = r.Backend.Alloc(statLen), r.Backend.Alloc(statLen*w.Dims.World)
		r.segs = segments(mlayout)
		if r.FSDP != nil {
			r.segs = r.FSDP.Segments(mlayout)
		}
		r.opt = optim.NewAdamW(r.Backend, r.Params.Len(), r.segs,
			optim.Hyper{Beta1: tc.Beta1, Beta2: tc.Beta2, Eps: tc.Eps, WeightDecay: tc.WeightDecay})
		tr.ranks = append(tr.ranks, r)
	}
	return tr, nil
}

// choiceLine is the run's line that says what the config left to the device and how it was
// decided ("" when it left nothing): plan.Choice's words and where the memory figure comes from.
func (t *trainer) choiceLine() string {
	msg := t.choice.String()
	if msg == "" {
		return ""
	}
	if t.memory > 0 {
		msg += fmt.Sprintf(" (memory per rank: %s)", t.memorySource)
	}
	return msg
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
	return t.w.Run(func(wr *world.Rank) error { return fn(t.rankOf(wr)) })
}

// rankOf is the training state of the world's rank wr of this process.
func (t *trainer) rankOf(wr *world.Rank) *rank {
	if len(t.ranks) == 1 {
		return t.ranks[0]
	}
	return t.ranks[wr.ID]
}

// memory returns the bytes rank r holds for the model and its training.
func (r *rank) memory() Memory {
	m := Memory{Params: 4 * int64(r.Params.Len()), Grads: 4 * int64(r.Grads.Len()),
		Optimizer: 2 * 4 * int64(r.Params.Len()), Activations: r.Model.ActivationBytes()}
	if r.FSDP != nil {
		f := r.FSDP.Memory()
		m.Compute = f.GatheredPeak + f.PackedBuffers + f.GradBuffers
	} else if r.Cast != nil {
		m.Compute = r.Cast.Bytes()
	}
	return m
}

// fullParams returns the whole parameter vector in Layout order on this process's first
// rank (nil on the others). It is collective: with FSDP every rank sends its chunks.
func (t *trainer) fullParams() []float32 { return t.w.FullParams() }

// peakFLOPS is the FLOP/s MFU divides by, of all the world's devices: device.peak_tflops each,
// else the dense bf16 peak of the GPU the backend names (a CUDA backend), else 0 (not known).
func peakFLOPS(cfg config.Config, w *world.World) float64 {
	per := cfg.Device.PeakTFLOPS * 1e12
	if d, ok := w.First().Backend.(interface{ DeviceName() string }); ok && per == 0 {
		per = plan.PeakFLOPS(d.DeviceName())
	}
	return per * float64(w.Dims.World)
}

// warmAttention runs the attention once on every rank before the first step
// (world.WarmAttention) where the ranks' attention blocks have a path that prepares something
// per block shape: a GPU whose 16-bit blocks go to cuDNN, whose execution plans compile at
// their first use (0.2–2 s each). Built inside a step, they would stall one rank while the
// others wait in its collectives. It returns what was built and how long it took, for the log.
func warmAttention(w *world.World, seqLen int, prec kernels.Precision) (string, error) {
	ar, ok := w.Ranks()[0].Backend.(kernels.AttentionRouter)
	if !ok || prec == kernels.FP32 || ar.AttentionPaths().Mode == kernels.AttentionOwn {
		return "", nil
	}
	took, err := w.WarmAttention(seqLen)
	if err != nil {
		return "", fmt.Errorf("attention warm-up: %w", err)
	}
	p := ar.AttentionPaths()
	return fmt.Sprintf("attention warm-up before the first step: %.1f s; %s", took.Seconds(), p), nil
}
