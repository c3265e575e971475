package evaluate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"

	"distflash/ckpt"
	"distflash/config"
	"distflash/plan"
	"distflash/sysmem"
)

// Request is what `distflash eval` is asked to do; zero values take the config's defaults.
type Request struct {
	ConfigPath string   // TOML config file; "" = the built-in defaults
	Sets       []string // overrides, section.key=value
	Model      string   // Hugging Face directory, checkpoint directory or .safetensors file
	Data       string   // evaluation data; "" = data.eval
	Samples    int      // documents; 0 = eval.samples
	SeqLen     int      // tokens per sample at most; 0 = eval.seq_len, else data.seq_len
	BOS        string   // auto, none or a token id (ParseBOS); "" = auto
	Out        string   // JSON result file; "" = beside the model (<model>.eval.json)
}

// Job is an evaluation ready to run: the request with every default filled in, the config
// it runs under, the model loaded into the evaluator's ranks and the samples tokenized.
type Job struct {
	Req       Request
	Config    config.Config
	Model     Model // Params released once loaded into Evaluator
	BOS       int32
	Evaluator *Evaluator
	Samples   []Sample
}

// Prepare loads the config, the model and the samples of req and checks that they fit
// together (sequence length, vocabulary, BOS). A short data set is reported on stderr.
func Prepare(req Request, stderr io.Writer) (*Job, error) {
	if req.Model == "" {
		return nil, errors.New("eval: --model is required: a Hugging Face LLaMA directory, a checkpoint directory or a .safetensors file")
	}
	cfg, err := LoadConfig(req.ConfigPath, req.Sets)
	if err != nil {
		return nil, err
	}
	em, err := LoadModel(req.Model, cfg, stderr)
	if err != nil {
		return nil, err
	}
	if cfg, err = ConfigFor(cfg, em, req.ConfigPath, req.Sets); err != nil {
		return nil, err
	}
	if cfg.Device.Kind != "cpu" {
		return nil, fmt.Errorf("eval: device.kind = %q needs a build with -tags %s (this build runs on the CPU)", cfg.Device.Kind, cfg.Device.Kind)
	}
	if req.Data == "" {
		req.Data = cfg.Data.Eval
	}
	if req.Data == "" {
		return nil, errors.New("eval: no evaluation data: pass --data FILE or set data.eval in the config")
	}
	if req.Samples == 0 {
		req.Samples = cfg.Eval.Samples
	}
	if req.SeqLen == 0 {
		req.SeqLen = SeqLen(cfg)
	}
	if req.Samples < 1 || req.SeqLen < 1 {
		return nil, fmt.Errorf("eval: --samples %d, --seq-len %d: both must be >= 1", req.Samples, req.SeqLen)
	}
	if req.Out == "" {
		req.Out = filepath.Clean(em.Path) + ".eval.json"
	}
	if req.BOS == "" {
		req.BOS = "auto"
	}
	bos, err := ParseBOS(req.BOS, em.BOS)
	if err != nil {
		return nil, err
	}
	mc := em.Config
	if req.SeqLen > mc.MaxSeqLen {
		return nil, fmt.Errorf("eval: --seq-len %d exceeds the model's longest sequence, %d (max_seq_len / max_position_embeddings)", req.SeqLen, mc.MaxSeqLen)
	}
	if v := em.Tokenizer.VocabSize(); v > mc.VocabSize {
		return nil, fmt.Errorf("eval: tokenizer %s has %d tokens, the model's vocabulary only %d", em.Tokenizer.Name(), v, mc.VocabSize)
	}
	if bos >= int32(mc.VocabSize) {
		return nil, fmt.Errorf("eval: BOS token %d is outside the model's vocabulary of %d", bos, mc.VocabSize)
	}
	if err := checkMemory(cfg, req.SeqLen); err != nil {
		return nil, err
	}
	ev, err := NewEvaluator(mc, cfg.Parallelism)
	if err != nil {
		return nil, err
	}
	if err := ev.Load(em.Params); err != nil {
		return nil, err
	}
	em.Params = nil
	ss, err := LoadSamples(req.Data, cfg.Data, em.Tokenizer, bos, req.SeqLen, mc.VocabSize, req.Samples)
	if err != nil {
		return nil, err
	}
	if len(ss) < req.Samples {
		fmt.Fprintf(stderr, "eval: %s has %d documents to evaluate, fewer than --samples %d\n", req.Data, len(ss), req.Samples)
	}
	return &Job{Req: req, Config: cfg, Model: em, BOS: bos, Evaluator: ev, Samples: ss}, nil
}

// Describe is the line that says what the job evaluates, on what and how.
func (j *Job) Describe() string {
	mc, ev := j.Model.Config, j.Evaluator
	world := "1 worker"
	if ev.P > 1 {
		world = fmt.Sprintf("%d sequence-parallel ranks (%s)", ev.P, ev.Attn)
	}
	return fmt.Sprintf("eval: %s (%s, LLaMA %s params, dim %d, %d layers, %d/%d heads, vocab %d) on %d samples of %s, seq_len %d, %s; tokenizer %s",
		j.Model.Describe(), j.Model.Source, config.Count(mc.NumParams()), mc.Dim, mc.NLayers, mc.NHeads, mc.NKVHeads, mc.VocabSize,
		len(j.Samples), j.Req.Data, j.Req.SeqLen, world, j.Model.Tokenizer.Name())
}

// Run evaluates the samples (progress is called after each) and returns the report eval
// writes. A cancelled ctx stops it between samples with an error.
func (j *Job) Run(ctx context.Context, progress func(done int, loss float64)) (Report, error) {
	res, err := j.Evaluator.Evaluate(ctx, j.Samples, progress)
	if err != nil {
		return Report{}, err
	}
	res.SeqLen = j.Req.SeqLen
	rep := Report{Result: res, Model: j.Req.Model, Source: j.Model.Source, Evaluated: j.Model.Path, Data: j.Req.Data,
		Tokenizer: j.Model.Tokenizer.Name(), BOS: j.BOS, Params: j.Model.Config.NumParams()}
	if j.Model.Step >= 0 {
		step := j.Model.Step
		rep.Step = &step
	}
	return rep, nil
}

// WriteReport writes rep as indented JSON to path, creating its directory, atomically (a
// reader never sees half a file).
func WriteReport(path string, rep Report) error {
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("eval: encode result: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("eval: %w", err)
	}
	if err := ckpt.WriteFileAtomic(path, append(js, '\n')); err != nil {
		return fmt.Errorf("eval: write result: %w", err)
	}
	return nil
}

// checkMemory refuses, before the evaluator's ranks are built, an evaluation whose
// sequence-parallel ranks (all in this process) do not fit in the memory the process has:
// plan.EvalMemoryFor of a sample of seqLen tokens, times the ranks. The error names what is
// needed and available and the longest --seq-len that fits.
func checkMemory(cfg config.Config, seqLen int) error {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(10) // as train: a few large buffers live for the whole run
	}
	avail, source, ok := sysmem.Available()
	if !ok {
		return nil
	}
	P := max(cfg.Parallelism.SequenceParallelDegree, 1)
	cfg.Data.SeqLen = seqLen
	m := plan.EvalMemoryFor(cfg, float64(avail)/float64(P))
	if m.Fits {
		return nil
	}
	gib := func(x float64) string { return fmt.Sprintf("%.1f GiB", x/(1<<30)) }
	msg := fmt.Sprintf("eval: a sample of %d tokens needs %s per rank × %d ranks (the weights %s, activations %s, logits %s, attention %s, collector headroom %s), this machine has %s available (%s)",
		seqLen, gib(m.Peak), P, gib(m.Params), gib(m.Activations), gib(m.Logits), gib(m.AttnWork), gib(m.Runtime), gib(float64(avail)), source)
	if longest := plan.MaxEvalSeqLen(cfg, float64(avail)/float64(P)); longest > 0 {
		msg += fmt.Sprintf("; the longest --seq-len that fits is %d", longest)
	}
	return errors.New(msg)
}
