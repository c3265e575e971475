package train

import (
	"fmt"
	"io"
	"path/filepath"
	"time"

	"distflash/train/tensorboard"
)

// TensorBoardDir is where a run's TensorBoard event files go, inside its run directory:
// `tensorboard --logdir runs` shows every run.
const TensorBoardDir = "tb"

// tbLog writes each step's scalars as TensorBoard events (run.tensorboard), rank 0 only. A
// write that fails is said once and ends the TensorBoard log, not the training: metrics.jsonl
// holds the same numbers.
type tbLog struct {
	w      *tensorboard.Writer
	stderr io.Writer
}

// openTB starts a new event file in the run directory's tb/ (a resumed run adds a file;
// TensorBoard reads them all).
func openTB(run string, stderr io.Writer) (*tbLog, error) {
	w, err := tensorboard.Create(filepath.Join(run, TensorBoardDir))
	if err != nil {
		return nil, fmt.Errorf("run.tensorboard: %w", err)
	}
	return &tbLog{w: w, stderr: stderr}, nil
}

// write records step m: the training scalars, throughput and MFU, the largest rank's memory
// in GiB, and the eval loss on the steps where it ran.
func (l *tbLog) write(m Metrics) {
	if l == nil || l.w == nil {
		return
	}
	v := map[string]float64{
		"train/loss": m.Loss, "train/lr": m.LR, "train/grad_norm": m.GradNorm,
		"perf/tokens_per_s": m.TokensPerSec, "perf/flops_per_s": m.FLOPsPerSec,
	}
	if m.MFU > 0 {
		v["perf/mfu"] = m.MFU
	}
	var most int64
	for _, r := range m.Memory {
		most = max(most, r.Params+r.Grads+r.Optimizer+r.Compute+r.Activations)
	}
	if most > 0 {
		v["memory/largest_rank_gib"] = float64(most) / (1 << 30)
	}
	if m.LossSpike {
		v["spikes/loss"] = m.Loss
	}
	if m.GradNormSpike {
		v["spikes/grad_norm"] = m.GradNorm
	}
	if m.SpikeSkipped {
		v["spikes/skipped"] = 1
	}
	if m.EvalLoss != 0 {
		v["eval/loss"], v["eval/perplexity"], v["eval/bits_per_byte"] = m.EvalLoss, m.EvalPerplexity, m.EvalBitsPerByte
	}
	for name, n := range m.SourceTokens {
		v["data/tokens/"+name] = float64(n)
	}
	for name, e := range m.EvalSources {
		v["eval/loss/"+name], v["eval/perplexity/"+name], v["eval/bits_per_byte/"+name] = e.Loss, e.Perplexity, e.BitsPerByte
	}
	err := l.w.Scalars(int64(m.Step), time.Now(), v)
	if err == nil {
		err = l.w.Flush()
	}
	if err != nil {
		fmt.Fprintf(l.stderr, "tensorboard: %v; no more TensorBoard events for this run (metrics.jsonl has the same numbers)\n", err)
		l.w.Close()
		l.w = nil
	}
}

// close ends the event file.
func (l *tbLog) close() {
	if l != nil && l.w != nil {
		l.w.Close()
		l.w = nil
	}
}
