package train

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"

	"distflash/ckpt"
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
	f    *os.File
	path string
	end  int64 // bytes of complete lines
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
	return &metricsFile{f: f, path: path, end: int64(len(keep))}, nil
}

// write appends m as one line.
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
		return fmt.Errorf("train: write step %d to %s: %w", m.Step, w.path, err)
	}
	w.end += int64(n)
	return nil
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
