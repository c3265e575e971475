package train

import (
	"fmt"
	"math"
	"strings"

	"distflash/config"
	"distflash/plan"
	"distflash/world"
)

// CheckMemory refuses, before anything is allocated, a config whose ranks do not fit in the
// memory each has (world.Memory: the memory the process has, MemAvailable or the room under its
// cgroup's limit, shared by the ranks the process runs, all of them in process, one under
// MPI): plan's per-rank estimate (plan.MemoryFor: the model state or its FSDP share, the
// activations the checkpoint policy keeps, the logits, the backward scratch and the
// attention's working set). The error says what is needed and available, term by term, the
// longest data.seq_len that fits and the knobs that shrink what grows with it. On a GPU
// (device.kind cuda) the estimate is of device memory, which is not known before the devices
// are opened, so it passes.
//
// With eval.interval > 0 the held-out evaluation runs on the training ranks beside the training
// state, a forward of up to eval.seq_len tokens (plan.TrainEvalMemoryFor); the larger of the two
// must fit, and an evaluation that does not is refused with the longest eval.seq_len that fits,
// before a step is run.
func CheckMemory(cfg config.Config, w *world.World) error {
	if cfg.Device.Kind == "cuda" {
		return nil
	}
	perRank, source, ok := w.Memory()
	if !ok {
		return nil
	}
	p := cfg.Parallelism
	ranks := w.LocalRanks()
	avail := perRank * float64(ranks)
	m := plan.MemoryFor(cfg, perRank)
	ev, evalOn := plan.TrainEvalMemoryFor(cfg, perRank)
	if m.Fits && (!evalOn || ev.Fits) {
		return nil
	}
	if m.Fits {
		return evalRefusal(cfg, w, m, ev, perRank, source)
	}
	state := m.Params + m.Grads + m.Optimizer + m.CommBuffers
	var msg strings.Builder
	fmt.Fprintf(&msg, "training needs %s per rank", showBytes(m.Peak))
	if ranks > 1 {
		fmt.Fprintf(&msg, " × %d in-process ranks = %s", ranks, showBytes(m.Peak*float64(ranks)))
	}
	fmt.Fprintf(&msg, " (model state %s; the process outside its tensors %s; growing with data.seq_len × data.batch_size: activations %s, logits %s, backward scratch %s, attention %s), this machine has %s available (%s)",
		showBytes(state), showBytes(m.Process), showBytes(m.Activations), showBytes(m.Logits), showBytes(m.BackwardScratch), showBytes(m.AttnWork), showBytes(avail), source)
	if tokens := plan.MaxTokensPerGPU(cfg, plan.SafeCapacity(perRank)); tokens > 0 {
		seq := tokens * w.Dims.SP
		fmt.Fprintf(&msg, ". The longest data.seq_len that fits is %d (data.batch_size %d; %.0f%% of the memory left for what the estimate misses)",
			seq, cfg.Data.BatchSize, 100*plan.EstimateError)
	} else if state >= plan.SafeCapacity(perRank) {
		msg.WriteString(". The model state alone does not fit")
	} else {
		msg.WriteString(". Not even 1024 tokens per rank fit beside the model state")
	}
	var knobs []string
	if state >= plan.SafeCapacity(perRank)/2 {
		// what shrinks the model state: sharding it over more ranks, as processes on machines
		// of this size (in process they would share this machine's memory)
		all := state
		if p.FSDP {
			all *= float64(w.Dims.World)
		}
		n := int(math.Ceil(all / (plan.SafeCapacity(perRank*float64(ranks)) / 2)))
		knobs = append(knobs, fmt.Sprintf("parallelism.fsdp = true over %d or more MPI processes (parallelism.world_size = %d, mpirun -np %d, on machines of this one's %s each: each holds %s of the %s of model state, half its memory)",
			n, n, n, showBytes(avail), showBytes(all/float64(n)), showBytes(all)))
	} else {
		switch policy := plan.Resolved(cfg, perRank).Checkpoint.Activation; {
		case policy != "layer":
			knobs = append(knobs, fmt.Sprintf(`checkpoint.activation = "layer" (now %s)`, policyName(cfg, policy)))
		case cfg.Checkpoint.Activation == "auto": // where nothing fits, auto takes layer
			msg.WriteString(`. checkpoint.activation = "auto" took "layer" already, the policy that keeps least`)
		}
		if cfg.Data.BatchSize > 1 {
			knobs = append(knobs, fmt.Sprintf("a smaller data.batch_size (now %d) with more training.grad_accum_steps", cfg.Data.BatchSize))
		}
		if !p.FSDP && w.Dims.World > 1 {
			knobs = append(knobs, "parallelism.fsdp = true (each rank holds 1/world_size of the model state)")
		}
		knobs = append(knobs, "more parallelism.sequence_parallel_degree, with the ranks as MPI processes on more machines (parallelism.backend = \"mpi\")")
	}
	fmt.Fprintf(&msg, ". To fit: %s", strings.Join(knobs, "; "))
	if evalOn && ev.Peak > m.Peak {
		fmt.Fprintf(&msg, ". The held-out evaluation during training (eval.interval = %d) needs more: %s per rank at %s",
			cfg.Eval.Interval, showBytes(ev.Peak), evalLength(cfg))
	}
	return fmt.Errorf("%s: %s", cfg.Where(msg.String()), msg.String()) // the --set of data.seq_len, say
}

// evalRefusal is CheckMemory's error for a config whose training step fits perRank bytes (m)
// but whose held-out evaluation during training (ev) does not.
func evalRefusal(cfg config.Config, w *world.World, m, ev plan.MemoryPlan, perRank float64, source string) error {
	ranks := w.LocalRanks()
	var msg strings.Builder
	fmt.Fprintf(&msg, "the held-out evaluation during training (eval.interval = %d) of samples of up to %s needs %s per rank",
		cfg.Eval.Interval, evalLength(cfg), showBytes(ev.Peak))
	if ranks > 1 {
		fmt.Fprintf(&msg, " × %d in-process ranks = %s", ranks, showBytes(ev.Peak*float64(ranks)))
	}
	fmt.Fprintf(&msg, " (it runs on the training ranks beside the model state %s and the training step's backward scratch %s; the process outside its tensors %s; its forward of %d tokens per rank: activations %s as checkpoint.activation = %s keeps them, logits %s, attention %s), "+
		"this machine has %s available (%s); the training step needs %s per rank",
		showBytes(ev.Params+ev.Grads+ev.Optimizer+ev.CommBuffers), showBytes(ev.BackwardScratch), showBytes(ev.Process), plan.TrainEvalSeqLen(cfg)/w.Dims.SP,
		showBytes(ev.Activations), policyName(cfg, plan.Resolved(cfg, perRank).Checkpoint.Activation), showBytes(ev.Logits), showBytes(ev.AttnWork+ev.AttnKernel), showBytes(perRank*float64(ranks)), source, showBytes(m.Peak))
	if seq := plan.MaxTrainEvalSeqLen(cfg, plan.SafeCapacity(perRank)); seq > 0 {
		fmt.Fprintf(&msg, ". The longest eval.seq_len that fits is %d (%.0f%% of the memory left for what the estimate misses)", seq, 100*plan.EstimateError)
	} else {
		msg.WriteString(". Not even 1024 tokens per rank fit beside the training state")
	}
	knobs := []string{"a shorter eval.seq_len"}
	if policy := plan.Resolved(cfg, perRank).Checkpoint.Activation; policy != "layer" {
		knobs = append(knobs, fmt.Sprintf(`checkpoint.activation = "layer" (now %s; the evaluation's forward keeps what the training's policy keeps)`, policyName(cfg, policy)))
	}
	knobs = append(knobs, "eval.interval = 0, and distflash eval of the run's checkpoints, which holds no training state")
	fmt.Fprintf(&msg, ". To fit: %s", strings.Join(knobs, "; "))
	return fmt.Errorf("%s: %s", cfg.Where(msg.String()), msg.String())
}

// policyName writes the checkpoint policy a run takes: "attn_output", or for
// checkpoint.activation = "auto" the one auto chose, e.g. "auto, which chose none".
func policyName(cfg config.Config, resolved string) string {
	if cfg.Checkpoint.Activation == "auto" {
		return fmt.Sprintf("%q, which chose %q", "auto", resolved)
	}
	return fmt.Sprintf("%q", resolved)
}

// evalLength names the length train's held-out evaluation scores: "eval.seq_len = N", or the
// data.seq_len it falls back to.
func evalLength(cfg config.Config) string {
	if cfg.Eval.SeqLen > 0 {
		return fmt.Sprintf("eval.seq_len = %d tokens", cfg.Eval.SeqLen)
	}
	return fmt.Sprintf("data.seq_len = %d tokens (eval.seq_len = 0)", cfg.Data.SeqLen)
}

// showBytes writes bytes in GiB from 1 GiB up, else in MiB.
func showBytes(x float64) string {
	if x >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", x/(1<<30))
	}
	return fmt.Sprintf("%.0f MiB", x/(1<<20))
}
