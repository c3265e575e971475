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
