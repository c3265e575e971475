package train

import (
	"fmt"
	"math"

	"distflash/data"
	"distflash/model"
	"distflash/optim"
	"distflash/parallel"
	"distflash/parallel/transport"
)

// stepStats are what each rank contributes to a step's metrics, exchanged in one all-gather.
// Float64 values travel as two float32 (hi, lo) so that sums keep ~48 bits.
const (
	statLoss    = 0 // 2 slots: summed token loss
	statCount   = 2 // 2 slots: tokens
	statSumSq   = 4 // 2 slots: Σ g² over what this rank owns (FSDP) or all (else), by GradStats on the device
	statBad     = 6 // 1 slot: 1 when this rank's gradients hold Inf or NaN (GradStats' third value, after statSumSq's two)
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

// step runs one optimizer step (grad_accum_steps micro-batches per replica) on every rank and
// returns its metrics. Each rank computes the loss and gradients of its tokens of its
// replica's sequences; the gradients are summed over all ranks (dscale makes the sum the
// global mean's gradient) by an all-reduce, or by FSDP's reduce-scatters, and each rank
// applies the update to what it holds.
func (t *trainer) step(step int) (Metrics, error) {
	cfg := t.cfg
	accum := cfg.Training.GradAccumSteps
	dp := t.w.Dims.DP()
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
	if err := t.trace.batch(step+1, lr, batches); err != nil {
		return Metrics{}, err
	}
	var out Metrics
	err := t.run(func(r *rank) error {
		sent := attnBytes(r.Comm.Traffic())
		count := t.gradients(r, batches, float32(dscale*scale))
		sent = attnBytes(r.Comm.Traffic()) - sent
		if t.beforeUpdate != nil {
			t.beforeUpdate(step, r)
		}
		st := t.gatherStats(r, count, sent)
		norm := math.Sqrt(st.sumsq) / scale
		// Every rank has the same statistics and the same history, so decides alike.
		sp := t.spikes.check(st.loss/st.tokens, norm, skipRuleOf(cfg.Training))
		skip := sp.skip
		// The clip scale is computed here, on the host, from the downloaded Σg², and AdamW is
		// queued after that download. On the device it would save nothing while the host must
		// hear the step's statistics before deciding whether to update at all: the spike rule
		// (training.skip_spikes) needs the all-gathered loss and norm, fp16's loss scaler the
		// all-gathered finiteness, and a bf16/fp32 step with a non-finite gradient must not
		// touch the weights (the run stops there as diverged). A device-side clip would also
		// need an AdamW that reads its gradient scale from device memory, which the Backend's
		// kernels.AdamWStep (a host float) does not.
		if !st.bad && !skip {
			clip := float64(optim.ClipScale(norm, cfg.Training.GradClip))
			if half := r.Half(); half != nil { // the 16-bit compute copy written in the same pass
				r.opt.UpdateHalf(r.Params, r.Grads, half, r.Precision, lr, float32(clip/scale))
			} else {
				r.opt.Update(r.Params, r.Grads, lr, float32(clip/scale))
				r.Refresh()
			}
		}
		if r == t.ranks[0] {
			out = Metrics{Step: step + 1, Loss: st.loss / st.tokens, LR: lr, GradNorm: norm, Tokens: int64(st.tokens),
				AttnForwards: r.Model.Stats.AttnForwards, AttnBytes: st.attnBytes, Skipped: st.bad && t.scaler != nil, Memory: st.mems, stop: st.stop,
				diverged: st.bad && t.scaler == nil, SpikeSkipped: skip, spike: sp}
		}
		return nil
	})
	if err != nil {
		return Metrics{}, fmt.Errorf("train: step %d: %w", step+1, err)
	}
	sp := out.spike
	t.spikes.add(step+1, out.Loss, out.GradNorm, sp)
	if sp.any() {
		out.LossSpike, out.GradNormSpike, out.LossMedian, out.GradNormMedian = sp.loss, sp.norm, sp.lossMedian, sp.normMedian
		for _, mb := range batches {
			for _, b := range mb {
				out.Windows = append(out.Windows, b.Windows...)
			}
		}
	}
	if len(cfg.Data.Sources) > 0 {
		t.sourceMetrics(&out, batches, sp.any())
	}
	if t.scaler != nil {
		out.LossScale = scale
		t.scaler.Update(!out.Skipped)
	}
	return out, nil
}

// sourceMetrics puts a mixture's account into m after the step's batches were drawn: the
// tokens each source has given the run so far and its completed epochs, the sources of the
// step's sequences when it spiked (spiked), and which sources ran out for the first time in
// this process (said once: a resumed run whose source had run out before does not say it).
func (t *trainer) sourceMetrics(m *Metrics, batches [][]data.Batch, spiked bool) {
	names, T := t.loader.Names(), int64(t.cfg.Data.SeqLen)
	m.SourceTokens, m.SourceEpochs = map[string]int64{}, map[string]int64{}
	for i, d := range t.loader.Drawn() {
		m.SourceTokens[names[i]] = d * T
	}
	if t.ranOut == nil {
		t.ranOut = make([]bool, len(names))
	}
	for i, e := range t.loader.Epochs() {
		m.SourceEpochs[names[i]] = e
		if e > 0 && !t.ranOut[i] {
			t.ranOut[i] = true
			m.ranOut = append(m.ranOut, i)
		}
	}
	if spiked {
		for _, mb := range batches {
			for _, b := range mb {
				for _, s := range b.Sources {
					m.Sources = append(m.Sources, names[s])
				}
			}
		}
	}
}

// gradients is rank r's forward and backward over the step's micro-batches (its replica's
// batch of each, its tokens of each sequence), with the loss scaled by lossScale: the
// gradients accumulate in r.Grads (summed over the data-parallel replicas without FSDP;
// FSDP reduce-scatters them as it goes). It returns r's target count; the losses stay on the
// device (model.Model.DeferLoss; gatherStats takes them), so that nothing in the step waits for
// the device before its last backward product is queued. Without FSDP, where the model can, the first
// micro-batch's backward overwrites each gradient instead of adding to a zeroed buffer
// (model.Model.FreshGrads), which saves ZeroGrads' pass over the gradients.
func (t *trainer) gradients(r *rank, batches [][]data.Batch, lossScale float32) (count int) {
	m, par := r.Model, t.cfg.Parallelism
	B, T := t.cfg.Data.BatchSize, t.cfg.Data.SeqLen
	switch {
	case r.FSDP != nil:
		r.FSDP.ZeroGrads()
	default:
		m.FreshGrads = true
	}
	m.DeferLoss = true
	for _, mb := range batches {
		b := mb[r.Replica]
		if par.BalanceDocuments {
			b = balanceBatch(b, par.Attention, t.w.Dims.BalanceGroups())
		}
		ids := parallel.Shard(b.Inputs, B, T, 1, r.pos)
		tg := parallel.Shard(b.Targets, B, T, 1, r.pos)
		_, n := m.ForwardBackward(model.Batch{IDs: ids, Targets: tg, B: B, Pos: r.pos, SeqLen: T,
			Docs: b.DocStart, ResetPositions: t.cfg.Data.PositionReset}, lossScale)
		count += n
	}
	if r.FSDP == nil && t.size() > 1 {
		r.Comm.AllReduce(r.Grads, "grad.allreduce")
	}
	return count
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
		r.Backend.Upload(r.statBuf, s)
		r.Comm.AllGather(r.statAll, r.statBuf, "stats.stop")
		all := make([]float32, statLen*t.size())
		r.Backend.Download(all, r.statAll)
		any := false
		for q := range t.size() {
			any = any || all[q*statLen+statStop] != 0
		}
		if r == t.ranks[0] {
			stop = any
		}
		return nil
	})
	return stop
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
// numbers. The step's losses are still on the device (gradients) and are taken here.
//
// The gradient's statistics never visit the host on their own: GradStats writes Σg² and the
// not-finite flag straight into the rank's statistics buffer on the device (the slots statSumSq,
// statSumSq+1 and statBad, adjacent), queued before the losses' download, and the host's part
// of the statistics is uploaded around those slots. The step's syncs are so the losses'
// download (after every backward product and the gradient statistics are queued) and the
// download of the all-gathered statistics.
func (t *trainer) gatherStats(r *rank, count int, attn int64) stepStats {
	be := r.Backend
	be.GradStats(be.Slice(r.statBuf, statSumSq, statBad-statSumSq+1), r.Grads)
	lossSum := r.Model.TakeLoss()
	r.Model.DeferLoss = false
	s := r.stats
	clear(s)
	putStat(s, statLoss, lossSum)
	putStat(s, statCount, float64(count))
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
	// the host's statistics, around the device's (stream order puts both before the gather)
	be.Upload(be.Slice(r.statBuf, 0, statSumSq), s[:statSumSq])
	be.Upload(be.Slice(r.statBuf, statBad+1, statLen-statBad-1), s[statBad+1:])
	r.Comm.AllGather(r.statAll, r.statBuf, "stats")
	all := make([]float32, statLen*t.size())
	be.Download(all, r.statAll)
	out := stepStats{mems: make([]Memory, t.size())}
	for q := range t.size() {
		st := all[q*statLen : (q+1)*statLen]
		out.loss += getStat(st, statLoss)
		out.tokens += getStat(st, statCount)
		if r.FSDP != nil || q == 0 { // without FSDP every rank holds the same summed gradient
			out.sumsq += getStat(st, statSumSq)
		}
		out.bad = out.bad || st[statBad] != 0
		out.stop = out.stop || st[statStop] != 0
		out.attnBytes = max(out.attnBytes, int64(getStat(st, statAttn)))
		out.mems[q] = Memory{Params: int64(getStat(st, statParams)), Grads: int64(getStat(st, statGrads)),
			Optimizer: int64(getStat(st, statOptim)), Compute: int64(getStat(st, statCompute)),
			Activations: int64(getStat(st, statActs))}
	}
	// Σg² travels as two float32: a sum of finite gradients past the float32 range (a norm
	// above 1.8e19) arrives as +Inf and −Inf, whose sum is NaN. No update can use such a
	// gradient; it counts as not finite.
	if math.IsNaN(out.sumsq) || math.IsInf(out.sumsq, 0) {
		out.bad = true
	}
	return out
}

// balanceBatch returns b with the documents of each sequence reordered for even attention
// work on P ranks of schedule (parallel.BalanceDocuments); each token keeps its target and
// its offset in its document, so the loss is the same. Every rank computes the same order.
func balanceBatch(b data.Batch, schedule string, P int) data.Batch {
	T := b.T
	out := data.Batch{B: b.B, T: T, Inputs: make([]int32, len(b.Inputs)), Targets: make([]int32, len(b.Targets)), DocStart: make([]int32, len(b.DocStart)), Windows: b.Windows, Sources: b.Sources}
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
