package plan

import (
	"distflash/config"
)

// EvalMemoryFor is one sequence-parallel rank's memory in an evaluation (package evaluate) of
// one sample of data.seq_len tokens: the model's float32 weights, whole on every rank (with
// parallelism.fsdp its chunks and two gathered units); each
// block's input and one block's full set (the evaluator's models keep what CheckpointLayer
// keeps: the forward needs no more); one loss chunk of logits with the final norm's output;
// the attention's working set (and on a GPU its kernel's buffers); the Go collector's headroom and the process (ProcessBase). No gradients, optimizer or
// backward scratch.
func EvalMemoryFor(cfg config.Config, capacity float64) MemoryPlan {
	m := cfg.Model
	n := float64(cfg.Data.SeqLen) / float64(dims(cfg).SP)
	d, q, kv, f := float64(m.Dim), float64(m.QDim()), float64(m.KVDim()), float64(m.FFNDim)
	a := float64(actElemBytes)
	var mp MemoryPlan
	mp.Params = config.WeightBytesPerParam * m.ParamCount()
	if d := dims(cfg); cfg.Parallelism.FSDP && d.World > 1 {
		// the rank's chunks, and two gathered units (the one computing and the prefetch),
		// float32 under eval
		block := float64(m.NumParams()-2*int64(m.VocabSize)*int64(m.Dim)-int64(m.Dim)) / float64(m.NLayers)
		mp.Params = mp.Params/float64(d.World) + 2*block*4
	}
	full := actBytesPerToken(cfg, nil, a)
	if tile := config.AutoMLPTile(m.FFNDim); float64(tile) < n {
		full -= 3 * f * a
		mp.Activations = 3 * float64(tile) * f * a
	}
	mp.Activations += n * (float64(m.NLayers)*d*a + full)
	chunk := min(n, float64(config.AutoLossChunk(m.VocabSize)))
	mp.Logits = chunk*float64(m.VocabSize)*4 + n*(2*d*a+4)
	mp.AttnWork = n * (a*(2*q+4*kv) + 8*float64(m.NHeads))
	mp.AttnKernel = attnKernelBytes(cfg, n, false)
	mp.Peak = mp.Params + mp.Activations + mp.Logits + mp.AttnWork + mp.AttnKernel
	mp.Runtime = gcHeadroom * mp.Peak
	mp.Process = ProcessBase / float64(localRanks(cfg)) // no training data or checkpoint writer
	mp.Peak += mp.Runtime + mp.Process
	mp.Capacity = capacity
	mp.Margin = capacity - mp.Peak
	mp.Fits = mp.Margin >= 0
	return mp
}

// MaxEvalSeqLen is the longest sample (a multiple of 1024 tokens per rank, times
// sequence_parallel_degree) whose EvalMemoryFor fits capacity; 0 if none does.
func MaxEvalSeqLen(cfg config.Config, capacity float64) int {
	sp := dims(cfg).SP
	fits := func(k int) bool {
		cfg.Data.SeqLen = k * 1024 * sp
		return EvalMemoryFor(cfg, capacity).Fits
	}
	return LargestFitting(fits, 1<<22) * 1024 * sp
}

// EstimateError is the memory a length suggested as the longest that fits leaves to spare
// (SafeCapacity), for what the estimate of MemoryFor misses: the peak resident set of a
// training process was 0.96–1.04 of it on the CPU (the tiny model at 16K and 32K tokens, the
// 125M-class model at 1K to 8K, docs/training.md; runs of one config differ by up to 7%, as the
// collector's timing moves the heap's high-water mark), and up to 1.10 before the estimate
// counted the process outside its tensors and the heap's freed pages.
const EstimateError = 0.10

// SafeCapacity is the memory a suggested length may fill: capacity less EstimateError of it.
func SafeCapacity(capacity float64) float64 { return capacity * (1 - EstimateError) }

// TrainEvalSeqLen is the length of the samples train's held-out evaluation scores:
// eval.seq_len, else data.seq_len (evaluate.SeqLen).
func TrainEvalSeqLen(cfg config.Config) int {
	if cfg.Eval.SeqLen > 0 {
		return cfg.Eval.SeqLen
	}
	return cfg.Data.SeqLen
}

// TrainEvalMemoryFor is one rank's memory during train's held-out evaluation, and false when
// cfg evaluates nothing during training (eval.interval = 0). The evaluation (train/heldout.go)
// runs on the training ranks with the training's model, beside the training state: a forward
// of one sample of up to TrainEvalSeqLen tokens on each replica's sequence group, whose
// buffers grow to that length and stay so for the rest of the run. So it is MemoryFor of one
// sequence of that length (the activations the checkpoint policy keeps, the logits, the
// attention of a forward), but for the backward scratch, which is the training step's (a
// forward writes none of it, and a step writes its buffers only as far as its own tokens).
// The process holds the evaluation's samples besides (MemoryFor counts them too).
func TrainEvalMemoryFor(cfg config.Config, capacity float64) (MemoryPlan, bool) {
	if cfg.Eval.Interval <= 0 {
		return MemoryPlan{}, false
	}
	cfg = Resolved(cfg, capacity) // the training's choices: the evaluation runs on its model
	step := MemoryFor(cfg, capacity)
	e := cfg
	e.Data.SeqLen, e.Data.BatchSize = TrainEvalSeqLen(cfg), 1
	mp := MemoryFor(e, capacity)
	mp.BackwardScratch = step.BackwardScratch
	mp.AttnKernel = attnKernelBytes(e, float64(e.Data.SeqLen)/float64(dims(e).SP), false)
	mp.Peak = mp.Params + mp.Grads + mp.Optimizer + mp.Activations + mp.Logits + mp.BackwardScratch + mp.AttnWork + mp.AttnKernel + mp.CommBuffers
	if cfg.Device.Kind == "cpu" {
		mp.Runtime = gcHeadroom * mp.Peak
		mp.Process = step.Process
		mp.Peak += mp.Runtime + mp.Process
	}
	mp.Margin = capacity - mp.Peak
	mp.Fits = mp.Margin >= 0
	return mp, true
}

// MaxTrainEvalSeqLen is the longest eval.seq_len (a multiple of 1024 tokens per rank, times
// sequence_parallel_degree) whose TrainEvalMemoryFor fits capacity; 0 if none does or cfg
// evaluates nothing during training.
func MaxTrainEvalSeqLen(cfg config.Config, capacity float64) int {
	if cfg.Eval.Interval <= 0 {
		return 0
	}
	sp := dims(cfg).SP
	fits := func(k int) bool {
		cfg.Eval.SeqLen = k * 1024 * sp
		m, _ := TrainEvalMemoryFor(cfg, capacity)
		return m.Fits
	}
	return LargestFitting(fits, 1<<22) * 1024 * sp
}

// evalBytes is the held-out samples a training process holds when it evaluates during
// training (eval.interval > 0): eval.samples of up to TrainEvalSeqLen tokens, each as int32
// ids and targets, for each held-out set (data.eval, and each source's eval of a mixture).
func evalBytes(cfg config.Config) float64 {
	if cfg.Eval.Interval <= 0 {
		return 0
	}
	sets := 0
	if cfg.Data.HeldOut() != "" {
		sets++
	}
	for _, s := range cfg.Data.Sources {
		if s.Eval != "" {
			sets++
		}
	}
	return 8 * float64(cfg.Eval.Samples) * float64(TrainEvalSeqLen(cfg)) * float64(sets)
}
