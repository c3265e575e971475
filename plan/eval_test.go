package plan

import (
	"strings"
	"testing"
)

// TestTrainEvalMemoryFor: train's held-out evaluation is priced only with eval.interval > 0;
// it holds the training state and the training step's backward scratch, and the forward of
// one sample of eval.seq_len tokens (data.seq_len when 0) split over the sequence-parallel
// ranks; MaxTrainEvalSeqLen is the longest eval.seq_len that fits.
func TestTrainEvalMemoryFor(t *testing.T) {
	const capacity = 2 << 30
	base := []string{"data.seq_len=1024", "model.max_seq_len=65536", "eval.interval=10"}
	for _, c := range []struct {
		path string
		sets []string
		sp   int
	}{
		{"../configs/tiny.toml", nil, 1},
		{"../configs/tiny.toml", []string{"checkpoint.activation=layer", "training.mixed_precision=bf16"}, 1},
		{"../configs/tiny-sp4.toml", []string{"parallelism.fsdp=true"}, 4},
	} {
		name := c.path + " " + strings.Join(c.sets, " ")
		if _, ok := TrainEvalMemoryFor(loadPlanConfig(t, c.path, c.sets...), capacity); ok {
			t.Errorf("%s: an evaluation priced with eval.interval = 0", name)
		}
		cfg := loadPlanConfig(t, c.path, append(append([]string{}, base...), c.sets...)...)
		step := MemoryFor(cfg, capacity)
		same, ok := TrainEvalMemoryFor(cfg, capacity)
		if !ok || same.Peak > step.Peak {
			t.Errorf("%s: the evaluation at data.seq_len (eval.seq_len = 0) needs %.0f, the step %.0f (%v)", name, same.Peak, step.Peak, ok)
		}

		cfg.Eval.SeqLen = 32768
		step = MemoryFor(cfg, capacity) // the process holds the longer held-out samples
		ev, _ := TrainEvalMemoryFor(cfg, capacity)
		one := cfg
		one.Data.SeqLen, one.Data.BatchSize = 32768, 1
		fwd := MemoryFor(one, capacity)
		if ev.Params != step.Params || ev.Grads != step.Grads || ev.Optimizer != step.Optimizer || ev.CommBuffers != step.CommBuffers {
			t.Errorf("%s: the evaluation's model state %+v is not the step's %+v", name, ev, step)
		}
		if ev.BackwardScratch != step.BackwardScratch {
			t.Errorf("%s: backward scratch %.0f, want the step's %.0f", name, ev.BackwardScratch, step.BackwardScratch)
		}
		if ev.Activations != fwd.Activations || ev.Logits != fwd.Logits || ev.AttnWork != fwd.AttnWork {
			t.Errorf("%s: the forward of 32768 tokens: activations %.0f, logits %.0f, attention %.0f; one sequence of 32768 tokens in training: %.0f, %.0f, %.0f",
				name, ev.Activations, ev.Logits, ev.AttnWork, fwd.Activations, fwd.Logits, fwd.AttnWork)
		}
		if ev.Peak <= step.Peak || ev.Process != step.Process || ev.Process <= same.Process {
			t.Errorf("%s: at eval.seq_len 32768 the evaluation needs %.0f (process %.0f), the step %.0f (process %.0f); at data.seq_len process %.0f",
				name, ev.Peak, ev.Process, step.Peak, step.Process, same.Process)
		}
		if sum := ev.Params + ev.Grads + ev.Optimizer + ev.Activations + ev.Logits + ev.BackwardScratch + ev.AttnWork + ev.AttnKernel + ev.CommBuffers + ev.Runtime + ev.Process; sum != ev.Peak || ev.Margin != capacity-ev.Peak {
			t.Errorf("%s: peak %.0f, the terms sum to %.0f; margin %.0f", name, ev.Peak, sum, ev.Margin)
		}

		longest := MaxTrainEvalSeqLen(cfg, capacity)
		if longest <= 0 || longest%(1024*c.sp) != 0 {
			t.Fatalf("%s: longest eval.seq_len %d", name, longest)
		}
		for _, l := range []struct {
			seq  int
			fits bool
		}{{longest, true}, {longest + 1024*c.sp, false}} {
			cfg.Eval.SeqLen = l.seq
			if m, _ := TrainEvalMemoryFor(cfg, capacity); m.Fits != l.fits {
				t.Errorf("%s: eval.seq_len %d (the longest %d) fits: %v", name, l.seq, longest, m.Fits)
			}
		}
		cfg.Eval.Interval = 0
		if n := MaxTrainEvalSeqLen(cfg, capacity); n != 0 {
			t.Errorf("%s: eval.interval = 0 gives a longest eval.seq_len %d", name, n)
		}
	}
}
