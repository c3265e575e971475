package train

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"distflash/config"
	"distflash/data"
	"distflash/model"
	"distflash/weights/safetensors"
)

// TraceEnv names the environment variable that makes train write what a reference trainer
// needs to repeat the run step for step (bench/torch_train.py): into that directory,
// init.safetensors (the weights before the session's first step, under the Hugging Face
// names of model.NewLayout, float32), config.json (the resolved config) and batches.jsonl
// (one line per step: its learning rate, and the token ids and data windows of every
// sequence it trained on, every micro-batch of every replica in that order).
const TraceEnv = "DISTFLASH_TRACE"

// tracer writes the trace of TraceEnv (rank 0); nil: none.
type tracer struct {
	f   *os.File
	w   *bufio.Writer
	dir string
}

// openTrace starts the trace when TraceEnv is set: the weights as they are now (after any
// resume: start is the step they are at), and the config. It is collective (with FSDP every
// rank sends its chunks of the weights); only the leader writes.
func openTrace(t *trainer, cfg config.Config, start int, leader bool) (*tracer, error) {
	dir := os.Getenv(TraceEnv)
	if dir == "" {
		return nil, nil
	}
	params := t.fullParams()
	if !leader {
		return nil, nil
	}
	fail := func(err error) (*tracer, error) { return nil, fmt.Errorf("train: %s=%s: %w", TraceEnv, dir, err) }
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(err)
	}
	layout := model.NewLayout(cfg.Model)
	var ts []safetensors.WTensor
	for _, x := range layout.Tensors {
		ts = append(ts, safetensors.WTensor{Name: x.Name, Shape: x.Shape, Data: params[x.Off : x.Off+x.Size()]})
	}
	if err := safetensors.Write(filepath.Join(dir, "init.safetensors"), ts, safetensors.DTypeF32,
		map[string]string{"step": strconv.Itoa(start)}); err != nil {
		return fail(err)
	}
	j, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), append(j, '\n'), 0o644); err != nil {
		return fail(err)
	}
	f, err := os.Create(filepath.Join(dir, "batches.jsonl"))
	if err != nil {
		return fail(err)
	}
	return &tracer{f: f, w: bufio.NewWriterSize(f, 1<<20), dir: dir}, nil
}

// traceStep is one line of batches.jsonl.
type traceStep struct {
	Step    int       `json:"step"`
	LR      float64   `json:"lr"`
	Windows []int     `json:"windows"` // per sequence, the loader's window (tokens window·T .. window·T+T)
	Inputs  [][]int32 `json:"inputs"`  // per sequence, its T input ids
	Targets [][]int32 `json:"targets"` // per sequence, its T target ids
}

// batch writes the sequences step (1-based) trained on at learning rate lr.
func (tr *tracer) batch(step int, lr float64, batches [][]data.Batch) error {
	if tr == nil {
		return nil
	}
	ts := traceStep{Step: step, LR: lr}
	for _, mb := range batches {
		for _, b := range mb {
			for s := range b.B {
				ts.Windows = append(ts.Windows, b.Windows[s])
				ts.Inputs = append(ts.Inputs, b.Inputs[s*b.T:(s+1)*b.T])
				ts.Targets = append(ts.Targets, b.Targets[s*b.T:(s+1)*b.T])
			}
		}
	}
	line, err := json.Marshal(ts)
	if err == nil {
		_, err = tr.w.Write(append(line, '\n'))
	}
	if err == nil {
		err = tr.w.Flush()
	}
	if err != nil {
		return fmt.Errorf("train: %s=%s: %w", TraceEnv, tr.dir, err)
	}
	return nil
}

// close ends batches.jsonl.
func (tr *tracer) close() {
	if tr != nil {
		_ = tr.w.Flush()
		_ = tr.f.Close()
	}
}
