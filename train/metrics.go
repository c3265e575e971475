package train

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"syscall"

	"distflash/ckpt"
	"distflash/sysmem"
	"distflash/world"
)

// MarshalJSON writes m as one metrics.jsonl object, with null for a loss, gradient norm or
// evaluation result that is not a finite number (a diverged step), so that the file stays
// valid JSON whatever a step computed.
func (m Metrics) MarshalJSON() ([]byte, error) {
	type plain Metrics
	num := func(v float64, omitZero bool) json.RawMessage {
		switch {
		case math.IsNaN(v) || math.IsInf(v, 0):
			return json.RawMessage("null")
		case v == 0 && omitZero:
			return nil
		}
		b, _ := json.Marshal(v)
		return b
	}
	return json.Marshal(struct {
		plain
		Loss            json.RawMessage `json:"loss"`
		GradNorm        json.RawMessage `json:"grad_norm"`
		EvalLoss        json.RawMessage `json:"eval_loss,omitempty"`
		EvalPerplexity  json.RawMessage `json:"eval_perplexity,omitempty"`
		EvalBitsPerByte json.RawMessage `json:"eval_bits_per_byte,omitempty"`
	}{plain(m), num(m.Loss, false), num(m.GradNorm, false),
		num(m.EvalLoss, true), num(m.EvalPerplexity, true), num(m.EvalBitsPerByte, true)})
}

// metricsFile is a run's metrics.jsonl, open for appending. Each step is one line written
// whole or not at all: a write that fails part-way (a full disk) is cut back to the end of
// the previous line, so a reader never meets half a line.
type metricsFile struct {
	f     *os.File
	path  string
	end   int64 // bytes of complete lines
	whole int   // the step of the last complete line; 0: none
}

// openMetrics opens metrics.jsonl for a run that starts after step done: a fresh run
// truncates it; a resumed one keeps the lines of steps up to done (a crashed run may have
// written later ones, which the resumed run writes again) and appends.
func openMetrics(path string, done int) (*metricsFile, error) {
	var keep []byte
	if done > 0 {
		old, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("train: %w", err)
		}
		for _, line := range bytes.SplitAfter(old, []byte("\n")) {
			var m struct {
				Step int `json:"step"`
			}
			if bytes.HasSuffix(line, []byte("\n")) && json.Unmarshal(line, &m) == nil && m.Step >= 1 && m.Step <= done {
				keep = append(keep, line...)
			}
		}
	}
	if err := ckpt.WriteFileAtomic(path, keep); err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	return &metricsFile{f: f, path: path, end: int64(len(keep)), whole: done}, nil
}

// write appends m as one line. A line that cannot be written is a *metricsError, which stops
// the run (session.metricsFailed).
func (w *metricsFile) write(m Metrics) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("train: encode step %d's metrics: %w", m.Step, err)
	}
	b = append(b, '\n')
	n, err := w.f.Write(b)
	if err != nil {
		if n > 0 {
			_ = w.f.Truncate(w.end) // no half line
		}
		e := &metricsError{step: m.Step, path: w.path, whole: w.whole, what: "could not write", err: err}
		if errors.Is(err, syscall.ENOSPC) {
			e.what = "disk full"
			if free, ok := sysmem.DiskFree(filepath.Dir(w.path)); ok {
				e.what = fmt.Sprintf("disk full (%.1f KB free)", float64(free)/1e3)
			}
		}
		return e
	}
	w.end += int64(n)
	w.whole = m.Step
	return nil
}

// metricsError is a line of metrics.jsonl that could not be written.
type metricsError struct {
	step  int    // the step whose line is not written
	path  string // metrics.jsonl
	whole int    // the step of the last complete line; 0: none
	what  string // "disk full (3.1 KB free)", "could not write"
	err   error
}

func (e *metricsError) Error() string { return e.explain("").Error() }

func (e *metricsError) Unwrap() error { return e.err }

// explain says what failed, which lines stay whole, and what the run keeps: kept, which names
// its newest checkpoint or says there is none.
func (e *metricsError) explain(kept string) error {
	whole := "no line is"
	if e.whole > 0 {
		whole = fmt.Sprintf("the lines of steps up to %d are", e.whole)
	}
	if kept != "" {
		kept = ", and " + kept
	}
	return fmt.Errorf("train: %s: step %d's line of %s is not written and %s whole; the run stops%s: %w",
		e.what, e.step, e.path, whole, kept, e.err)
}

// close closes the file.
func (w *metricsFile) close() error {
	if w == nil || w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	if err != nil {
		return fmt.Errorf("train: write %s: %w", w.path, err)
	}
	return nil
}

// Metrics is one line of runs/<name>/metrics.jsonl.
type Metrics struct {
	Step         int     `json:"step"`
	Loss         float64 `json:"loss"`
	LR           float64 `json:"lr"`
	GradNorm     float64 `json:"grad_norm"`
	TokensPerSec float64 `json:"tokens_per_s"`
	Tokens       int64   `json:"tokens"`
	ElapsedSec   float64 `json:"elapsed_s"`
	AttnForwards int64   `json:"attn_forwards"`
	AttnBytes    int64   `json:"attn_bytes"`           // the bytes the busiest rank sent for attention (sequence-parallel blocks, statistics, all-to-alls)
	FLOPsPerSec  float64 `json:"flops_per_s"`          // the model FLOPs of the step's tokens (plan.FLOPsPerToken) per second, all ranks together
	MFU          float64 `json:"mfu,omitempty"`        // FLOPsPerSec over the peak of all devices (device.peak_tflops or the GPU's); absent when the peak is not known (CPU)
	Skipped      bool    `json:"skipped,omitempty"`    // fp16: gradients overflowed, the update was skipped
	LossScale    float64 `json:"loss_scale,omitempty"` // fp16: the scale this step's loss was multiplied by
	// Spikes (spike.go), on the steps that have one: which, the medians of the steps before
	// that they were measured against, whether training.skip_spikes skipped the update, and
	// the loader's windows of the step's sequences (tokens window·seq_len .. +seq_len).
	LossSpike      bool    `json:"loss_spike,omitempty"`
	GradNormSpike  bool    `json:"grad_norm_spike,omitempty"`
	LossMedian     float64 `json:"loss_median,omitempty"`
	GradNormMedian float64 `json:"grad_norm_median,omitempty"`
	SpikeSkipped   bool    `json:"spike_skipped,omitempty"`
	Windows        []int   `json:"windows,omitempty"`
	// Sources, on a spike's step of a mixture, names each sequence's source, whose window
	// Windows gives.
	Sources []string `json:"sources,omitempty"`
	Memory  []Memory `json:"memory"` // per rank
	// A mixture of sources ([[data.sources]]): the tokens each source has given the run so far
	// (its sequences × data.seq_len) and the times each has been read through (its completed
	// epochs).
	SourceTokens map[string]int64 `json:"source_tokens,omitempty"`
	SourceEpochs map[string]int64 `json:"source_epochs,omitempty"`
	// Held-out evaluation, on the steps where it runs (eval.interval).
	EvalLoss        float64 `json:"eval_loss,omitempty"`
	EvalPerplexity  float64 `json:"eval_perplexity,omitempty"`
	EvalBitsPerByte float64 `json:"eval_bits_per_byte,omitempty"`
	// EvalSources is the held-out evaluation of each source of a mixture that has an eval (the
	// eval_loss above is then of all their samples together, unless data.eval is set).
	EvalSources map[string]EvalSource `json:"eval_sources,omitempty"`
	// EvalSec is the time the step's held-out evaluation and sample took on the training ranks
	// (not counted in TokensPerSec).
	EvalSec float64 `json:"eval_s,omitempty"`

	stop     bool  // some rank was asked to stop after this step (all ranks stop together)
	ranOut   []int // the mixture's sources that ran out for the first time at this step
	diverged bool  // fp32/bf16: the gradients hold Inf or NaN; no update was applied
	spike    spike
}

// EvalSource is one source's held-out result in metrics.jsonl.
type EvalSource struct {
	Loss        float64 `json:"loss"`
	Perplexity  float64 `json:"perplexity"`
	BitsPerByte float64 `json:"bits_per_byte"`
	Tokens      int64   `json:"tokens"`
}

// MarshalJSON writes e with null for a result that is not a finite number, as Metrics does.
func (e EvalSource) MarshalJSON() ([]byte, error) {
	num := func(v float64) json.RawMessage {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return json.RawMessage("null")
		}
		b, _ := json.Marshal(v)
		return b
	}
	return json.Marshal(struct {
		Loss        json.RawMessage `json:"loss"`
		Perplexity  json.RawMessage `json:"perplexity"`
		BitsPerByte json.RawMessage `json:"bits_per_byte"`
		Tokens      int64           `json:"tokens"`
	}{num(e.Loss), num(e.Perplexity), num(e.BitsPerByte), e.Tokens})
}

// Memory is what one rank holds, in bytes (metrics.jsonl "memory", one entry per rank).
type Memory struct {
	Params      int64 `json:"params"`      // fp32 master weights: all of them, or the rank's FSDP chunks
	Grads       int64 `json:"grads"`       // fp32 gradients, likewise
	Optimizer   int64 `json:"optimizer"`   // AdamW first and second moments (fp32, same extent as Params)
	Compute     int64 `json:"compute"`     // per-unit working buffers: FSDP's gathered units (peak) and unit gradient, or the 16-bit compute copy
	Activations int64 `json:"activations"` // the model's activation buffers of the step (peak)
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

// WriteTraffic writes, when DISTFLASH_TRAFFIC names a path prefix, the bytes this MPI rank
// sent by call site over the whole run to PREFIX.rankN as JSON (bench/netns_overlap.sh
// reads them). The in-process world writes nothing.
func WriteTraffic(w *world.World) error {
	prefix := os.Getenv("DISTFLASH_TRAFFIC")
	if prefix == "" || !w.MPI() {
		return nil
	}
	r := w.First()
	b, err := json.Marshal(r.Comm.Traffic())
	if err != nil {
		return fmt.Errorf("DISTFLASH_TRAFFIC: %w", err)
	}
	path := fmt.Sprintf("%s.rank%d", prefix, r.ID)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("DISTFLASH_TRAFFIC=%s: %w", prefix, err)
	}
	return nil
}
