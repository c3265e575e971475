package evaluate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"distflash/config"
	"distflash/kernels"
	"distflash/model"
	"distflash/parallel"
	"distflash/parallel/transport"
	"distflash/world"
)

// Evaluator runs forward passes and generation of one model on the ranks of a built world
// (world.Build): the eval command's ranks, or the training ranks with their weights in place.
// Every rank of the world takes part in every call, in process or over MPI and NCCL, on the
// ranks' devices, with the world's schedule and parameter store (FSDP's chunks included).
//
// How the work is spread. A sequence is spread over a sequence group as training spreads it: a
// sample of n tokens is padded to a multiple of the layout's divisor with targets −1, which the
// loss ignores, after the sample, so causal attention keeps the real tokens from seeing it.
// Each rank's per-token results are summed over its sequence group (zeros at the positions it
// does not hold, so the sums are exact), and with several data-parallel replicas the samples
// of a round go one to each replica and their results are gathered across the replicas, so
// that every rank ends with every sample's per-token losses and adds them up in sample order:
// the same numbers on any number of ranks. A single forward (Forward) runs on every replica
// alike.
type Evaluator struct {
	Config model.Config
	w      *world.World

	mu    sync.Mutex
	ranks map[int]*rankState // each local rank's, made on first use
}

// NewEvaluator returns the evaluator of w's model. w must be built.
func NewEvaluator(w *world.World) *Evaluator {
	return &Evaluator{Config: w.First().Model.Cfg, w: w, ranks: map[int]*rankState{}}
}

// P is the number of ranks sharing each sequence.
func (e *Evaluator) P() int { return e.w.Dims.SP }

// Attn is the schedule over a sequence group ("" when one rank holds each sequence).
func (e *Evaluator) Attn() string {
	if e.w.Dims.SP == 1 {
		return ""
	}
	return e.w.Dims.Attention
}

// Describe says on what the evaluator runs: "1 worker", "4 sequence-parallel ranks (ring)"…
func (e *Evaluator) Describe() string {
	d := e.w.Dims
	if d.World == 1 {
		return "1 worker"
	}
	if d.DP() == 1 {
		s := fmt.Sprintf("%d sequence-parallel ranks (%s)", d.SP, d.Attention)
		if d.Ulysses > 1 && d.Attention != "ulysses" {
			s = fmt.Sprintf("%d sequence-parallel ranks (%s between Ulysses groups of %d)", d.SP, d.Attention, d.Ulysses)
		}
		return s
	}
	return d.String()
}

// request is one forward: a sequence from position 0, its next-token targets (negative: not
// scored), and the positions whose logits' argmax is wanted.
type request struct {
	ids, targets []int32
	at           []int
}

// outcome is what a forward gave every rank: each position's loss (0 where the target is
// negative) and the argmax of the logits at each position asked for (ties: the lowest id).
type outcome struct {
	losses []float32
	argmax []int32
}

// Forward runs one forward of the sequence ids (positions from 0) on the ranks, with
// next-token targets (negative: not scored), and returns each position's loss (0 where the
// target is negative) in sequence order, and the argmax of the logits at each position of at
// (ties: the lowest id), for a teacher-forced check of what the model predicts there. Every
// replica computes it alike.
func (e *Evaluator) Forward(ids, targets []int32, at []int) (losses []float32, argmaxAt []int32, err error) {
	q := request{ids: ids, targets: targets, at: at}
	if err := e.check(q); err != nil {
		return nil, nil, err
	}
	var out outcome
	err = e.w.Run(func(r *world.Rank) error {
		o, err := e.forwardOn(r, q)
		if r == e.w.First() {
			out = o
		}
		return err
	})
	return out.losses, out.argmax, err
}

// check refuses a request no forward can run.
func (e *Evaluator) check(q request) error {
	n := len(q.ids)
	if n == 0 {
		return fmt.Errorf("eval: a forward of no tokens")
	}
	if len(q.targets) != n {
		return fmt.Errorf("eval: %d tokens and %d targets", n, len(q.targets))
	}
	for _, p := range q.at {
		if p < 0 || p >= n {
			return fmt.Errorf("eval: argmax at position %d of %d", p, n)
		}
	}
	return nil
}

// forwardAll runs the requests, a round of one per replica at a time, and returns every
// request's outcome on every rank.
func (e *Evaluator) forwardAll(reqs []request) ([]outcome, error) {
	for _, q := range reqs {
		if err := e.check(q); err != nil {
			return nil, err
		}
	}
	dp := e.w.Dims.DP()
	out := make([]outcome, len(reqs))
	for r0 := 0; r0 < len(reqs); r0 += dp {
		round := reqs[r0:min(r0+dp, len(reqs))]
		err := e.w.Run(func(r *world.Rank) error {
			q := request{ids: []int32{0}, targets: []int32{-1}} // a replica without a sample still takes part
			if r.Replica < len(round) {
				q = round[r.Replica]
			}
			o, err := e.forwardOn(r, q)
			if err != nil {
				return err
			}
			all := []outcome{o}
			if dp > 1 {
				all = e.gatherReplicas(r, o, round)
			}
			if r == e.w.First() {
				copy(out[r0:], all)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// gatherReplicas all-gathers the outcomes of a round across the replicas: each replica's
// packed as its losses then its argmax values (float32: ids are below 2^24), padded to the
// round's longest.
func (e *Evaluator) gatherReplicas(r *world.Rank, o outcome, round []request) []outcome {
	width := 1
	for _, q := range round {
		width = max(width, len(q.ids)+len(q.at))
	}
	g := e.replicaGroup(r)
	be := r.Backend
	mine := make([]float32, width)
	copy(mine, o.losses)
	for i, a := range o.argmax {
		mine[len(o.losses)+i] = float32(a)
	}
	src, dst := e.scratch(r, slotSend, width), e.scratch(r, slotGather, width*g.Size())
	be.Upload(src, mine)
	g.AllGather(dst, src, "eval.gather")
	all := make([]float32, width*g.Size())
	be.Download(all, dst)
	outs := make([]outcome, len(round))
	for i, q := range round {
		part := all[i*width : (i+1)*width]
		outs[i] = outcome{losses: slices.Clone(part[:len(q.ids)]), argmax: make([]int32, len(q.at))}
		for j := range q.at {
			outs[i].argmax[j] = int32(part[len(q.ids)+j])
		}
	}
	return outs
}

// rankState is what the evaluator keeps of one of the process's ranks between calls: its group
// across the replicas (split off on first use: every rank reaches its first use in the same
// call) and its buffers for the results that go between ranks, grown as needed, so that a
// sample, a round or a decoded token allocates no device memory.
type rankState struct {
	replicas transport.Comm
	bufs     [slots]kernels.Buf
}

// The scratch buffers of a rank.
const (
	slotPart   = iota // a forward's results on the rank, summed over its sequence group
	slotSend          // a replica's results of a round, sent
	slotGather        // every replica's results of a round
	slotFlag          // the stop flag
	slots
)

// state is rank r's rankState.
func (e *Evaluator) state(r *world.Rank) *rankState {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.ranks[r.ID]
	if st == nil {
		st = &rankState{}
		e.ranks[r.ID] = st
	}
	return st
}

// scratch is rank r's buffer slot, of n values (a view of one at least that long).
func (e *Evaluator) scratch(r *world.Rank, slot, n int) kernels.Buf {
	st := e.state(r)
	if b := st.bufs[slot]; b == nil || b.Len() < n {
		st.bufs[slot] = r.Backend.Alloc(n)
	}
	return r.Backend.Slice(st.bufs[slot], 0, n)
}

// replicaGroup is rank r's group across the replicas.
func (e *Evaluator) replicaGroup(r *world.Rank) transport.Comm {
	st := e.state(r)
	if st.replicas == nil {
		st.replicas = e.w.Dims.ReplicaGroup(r.Comm)
	}
	return st.replicas
}

// forwardOn runs request q on rank r (the rank's tokens of q, padded for its sequence group)
// and returns the whole sequence's outcome, summed over the sequence group.
func (e *Evaluator) forwardOn(r *world.Rank, q request) (outcome, error) {
	n := len(q.ids)
	d := e.w.Dims
	T := d.Padded(n)
	ids := make([]int32, T) // padding: token 0, target -1 (ignored), after the sample
	tg := slices.Repeat([]int32{-1}, T)
	copy(ids, q.ids)
	copy(tg, q.targets)
	pos, err := r.Positions(T)
	if err != nil {
		return outcome{}, err
	}
	want := make(map[int32]int, len(q.at)) // position → index in q.at
	for i, p := range q.at {
		want[int32(p)] = i
	}
	// the rank's results at the positions it holds, zero elsewhere: [losses of n, argmax of at]
	part := make([]float32, n+len(q.at))
	m, be, V := r.Model, r.Backend, e.Config.VocabSize
	if len(q.at) > 0 {
		row := make([]float32, V)
		m.RowHook = func(row0 int, lg kernels.Buf, rows int) {
			for i := row0; i < row0+rows; i++ {
				if j, ok := want[pos[i]]; ok {
					be.Download(row, be.Slice(lg, (i-row0)*V, V))
					part[n+j] = float32(argmax(row))
				}
			}
		}
		defer func() { m.RowHook = nil }()
	}
	// SeqLen: the sample's length, not the padded T nor the rank's slice (dynamic RoPE)
	m.Forward(model.Batch{IDs: parallel.Shard(ids, 1, T, 1, pos), Targets: parallel.Shard(tg, 1, T, 1, pos), B: 1, Pos: pos, SeqLen: n})
	for i, l := range m.TokenLosses() {
		if p := int(pos[i]); p < n {
			part[p] = l
		}
	}
	if d.SP > 1 {
		buf := e.scratch(r, slotPart, len(part))
		be.Upload(buf, part)
		r.Seq.AllReduce(buf, "eval.gather")
		be.Download(part, buf)
	}
	o := outcome{losses: part[:n], argmax: make([]int32, len(q.at))}
	for j := range q.at {
		o.argmax[j] = int32(part[n+j])
	}
	return o, nil
}

// ErrStopped is what the error of an evaluation stopped by a signal wraps: this process's, or
// under an MPI launcher another's that came first (stopped).
var ErrStopped = errors.New("stopped by a signal")

// stopped reports on every rank whether some process's ctx is done, so that all ranks stop at
// the same point of a loop (an all-reduce of one flag over the world).
func (e *Evaluator) stopped(ctx context.Context) bool {
	stop := false
	_ = e.w.Run(func(r *world.Rank) error {
		if s := e.stoppedOn(r, ctx); r == e.w.First() {
			stop = s
		}
		return nil
	})
	return stop
}

// stoppedOn is stopped's agreement on rank r, for a caller already on every rank.
func (e *Evaluator) stoppedOn(r *world.Rank, ctx context.Context) bool {
	be := r.Backend
	v := []float32{0}
	if ctx.Err() != nil {
		v[0] = 1
	}
	b := e.scratch(r, slotFlag, 1)
	be.Upload(b, v)
	r.Comm.AllReduce(b, "eval.stop")
	be.Download(v, b)
	return v[0] > 0
}

// Score returns the summed loss of one sample's targets and their count.
func (e *Evaluator) Score(s Sample) (lossSum float64, count int, err error) {
	losses, _, err := e.Forward(s.IDs, s.Targets, nil)
	if err != nil {
		return 0, 0, err
	}
	for i, t := range s.Targets { // in sequence order: the same sum on any number of ranks
		if t >= 0 {
			lossSum += float64(losses[i])
			count++
		}
	}
	return lossSum, count, nil
}

// Evaluate runs every sample (one forward each, every target scored) and returns the result;
// progress, when not nil, is called after each sample with the number done and the running
// mean loss. A cancelled ctx (on any process) stops it between rounds of samples with an
// error.
func (e *Evaluator) Evaluate(ctx context.Context, samples []Sample, progress func(done int, loss float64)) (Result, error) {
	r, _, err := e.EvaluateWith(ctx, samples, EvalOptions{}, progress)
	return r, err
}

// Local returns the evaluator of the model mc with the weights params (model.NewLayout order)
// on the ranks of par as goroutines of this process on the CPU, forward only: what a program
// or a test that holds a model in memory evaluates it with. World size beyond the sequence
// group's makes data-parallel replicas, as in a world of the eval command; a section that
// names no schedule gets the default one.
func Local(mc model.Config, par config.ParallelismConfig, params []float32) (*Evaluator, error) {
	if err := mc.Resolve(); err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	cfg := config.Default()
	cfg.Model, cfg.Parallelism, cfg.Device.Kind = mc, par, "cpu"
	cfg.Parallelism.Backend = "inproc"
	if par.Attention == "" {
		cfg.Parallelism.Attention = config.Default().Parallelism.Attention
	}
	cfg.Parallelism.WorldSize = max(par.WorldSize, par.SequenceParallelDegree, 1)
	cfg.Parallelism.SequenceParallelDegree = max(par.SequenceParallelDegree, 1)
	cfg.Parallelism.UlyssesDegree = max(par.UlyssesDegree, 1)
	if err := cfg.ValidateEval(); err != nil { // a schedule the heads or ranks do not allow, say
		return nil, fmt.Errorf("eval: %w", err)
	}
	w, err := world.Launch(&cfg, io.Discard)
	if err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	if err := w.Open(); err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	if err := w.Build(forwardSpec(mc, par.FSDP, params)); err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	return NewEvaluator(w), nil
}

// forwardSpec is the model an evaluation puts on its ranks: mc with the weights params, kept
// for a forward only (each block's input: CheckpointLayer), in float32, FSDP-sharded when fsdp,
// its loss chunk and MLP tile as training's defaults.
func forwardSpec(mc model.Config, fsdp bool, params []float32) world.Spec {
	return world.Spec{Model: mc, Policy: model.CheckpointLayer, Precision: kernels.FP32, FSDP: fsdp,
		LossChunk: config.AutoLossChunk(mc.VocabSize), MLPTile: config.AutoMLPTile(mc.FFNDim), Params: params}
}
