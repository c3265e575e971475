package evaluate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"distflash/ckpt"
	"distflash/config"
	"distflash/data"
	"distflash/plan"
	"distflash/weights"
	"distflash/world"
)

// Request is what `distflash eval` is asked to do; zero values take the config's defaults.
type Request struct {
	ConfigPath string   // TOML config file; "" = the built-in defaults
	Sets       []string // overrides, section.key=value
	Model      string   // Hugging Face directory, checkpoint directory or .safetensors file
	Data       string   // evaluation data; "" = data.eval (the loss task)
	Samples    int      // documents; 0 = eval.samples
	SeqLen     int      // tokens per sample at most; 0 = eval.seq_len, else data.seq_len
	BOS        string   // auto, none or a token id (ParseBOS); "" = auto
	Out        string   // JSON result file; "" = beside the model (<model>.eval.json, <model>.passkey.json)
	Task       string   // "loss" (the default: loss, perplexity, bits per byte) or "passkey"
	Scoring    EvalOptions
	Passkey    PasskeyOptions
}

// Job is an evaluation ready to run: the request with every default filled in, the config
// it runs under, the model loaded into the evaluator's ranks and, for the loss task, the
// samples tokenized.
type Job struct {
	Req       Request
	Config    config.Config
	Model     weights.Model // Params released once loaded into Evaluator
	BOS       int32
	Stop      []int32 // the tokens that end a generation: the tokenizer's EOS
	Evaluator *Evaluator
	World     *world.World // the ranks the evaluator runs on; Close ends it
	Samples   []Sample     // every sample, of all Sets in order
	// Sets, when the evaluation is of several held-out sets (no --data, and [[data.sources]]
	// with evals: data.eval's when set, then each source's), are the sets; nil for one.
	Sets []EvalSet
}

// Leader reports whether this process speaks for the job: it holds rank 0 (under mpirun the
// other processes evaluate alike and say nothing).
func (j *Job) Leader() bool { return j.World.Leader() }

// Close releases the job's communicators and ends MPI when the job ran over it.
func (j *Job) Close() error { return closeWorld(j.World) }

// closeWorld ends a job's world: its communicators, then MPI.
func closeWorld(w *world.World) error {
	if err := w.CloseComms(); err != nil {
		return err
	}
	return w.Finalize()
}

// loaded is a model on an evaluator's ranks under its config: what eval, generate and their
// tasks share.
type loaded struct {
	cfg    config.Config
	em     weights.Model
	bos    int32
	stop   []int32
	w      *world.World
	ev     *Evaluator
	stderr io.Writer // the process's stderr on the leader, io.Discard on the other processes
}

// loadModel reads the config and the model of an eval or generate request (the config a
// checkpoint brings, see ConfigFor) and checks that the tokenizer and BOS fit the model. out,
// when given, is the file the command writes at the end (rank 0): checked before the model
// is read, so that a name that cannot be written is refused before the work.
func loadModel(configPath string, sets []string, modelPath, bosFlag, out, what string, stderr io.Writer) (loaded, error) {
	if modelPath == "" {
		return loaded{}, fmt.Errorf("%s: --model is required: a Hugging Face LLaMA directory, a checkpoint directory or a .safetensors file", what)
	}
	// Under MPI any error here reaches the user once, whichever ranks meet it (package main's
	// job: rank 0 says it).
	cfg, err := LoadConfig(configPath, sets)
	if err != nil {
		return loaded{}, err
	}
	if err := cfg.ValidateWorld(); err != nil { // as train says it, before the world is launched
		return loaded{}, err
	}
	if reqs := cfg.Requirements(); len(reqs) > 0 {
		return loaded{}, fmt.Errorf("%s: this build cannot run the config; it needs:\n  - %s", what, strings.Join(reqs, "\n  - "))
	}
	// the world first: under mpirun every process loads the model, and only rank 0 speaks
	w, err := world.Launch(&cfg, stderr)
	if err != nil {
		return loaded{}, fmt.Errorf("%s: %w", what, err)
	}
	if !w.Leader() {
		stderr = io.Discard
	} else if out != "" {
		if err := ckpt.CheckWritable(out); err != nil {
			return loaded{}, fmt.Errorf("%s: --out %s: %w", what, out, err)
		}
	}
	em, err := weights.Load(modelPath, cfg, stderr)
	if err != nil {
		return loaded{}, fmt.Errorf("%s: %w", what, err)
	}
	if cfg, err = ConfigFor(cfg, em, configPath, sets, what); err != nil {
		return loaded{}, err
	}
	if bosFlag == "" {
		bosFlag = "auto"
	}
	bos, err := ParseBOS(bosFlag, em.BOS)
	if err != nil {
		return loaded{}, err
	}
	mc := em.Config
	if v := em.Tokenizer.VocabSize(); v > mc.VocabSize {
		return loaded{}, fmt.Errorf("%s: tokenizer %s has %d tokens, the model's vocabulary only %d", what, em.Tokenizer.Name(), v, mc.VocabSize)
	}
	if bos >= int32(mc.VocabSize) {
		return loaded{}, fmt.Errorf("%s: BOS token %d is outside the model's vocabulary of %d", what, bos, mc.VocabSize)
	}
	var stop []int32
	if sp, ok := em.Tokenizer.(data.SpecialTokens); ok {
		if _, eos := sp.Specials(); eos >= 0 {
			stop = []int32{eos}
		}
	}
	return loaded{cfg: cfg, em: em, bos: bos, stop: stop, w: w, stderr: stderr}, nil
}

// build checks that sequences of tokens tokens fit the model, opens the world's devices,
// checks that such a sequence (sample: "a sample", "a prompt"; knob: the flag that sets its
// length) fits the memory each rank has, then puts the model on the ranks
// (forward only: each block's input kept, float32, FSDP-sharded when parallelism.fsdp says
// so) and drops the host copy of the weights.
func (l *loaded) build(tokens int, what, sample, knob string) error {
	if longest := l.em.Config.MaxSeqLen; tokens > longest {
		return fmt.Errorf("%s: %d tokens exceed the model's longest sequence, %d (max_seq_len / max_position_embeddings)", what, tokens, longest)
	}
	if err := l.w.Open(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := checkMemory(l.cfg, l.w, tokens, what, sample, knob); err != nil {
		return err // as train's: the ranks' memory is counted alike
	}
	if err := l.w.Build(forwardSpec(l.em.Config, l.cfg.Parallelism.FSDP, l.em.Params)); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	l.em.Params, l.ev = nil, NewEvaluator(l.w)
	return nil
}

// Prepare loads the config, the model and (for the loss task) the samples of req and checks
// that they fit together (sequence length, vocabulary, BOS, the task's options). A short data
// set is reported on stderr.
func Prepare(req Request, stderr io.Writer) (*Job, error) {
	switch req.Task {
	case "", "loss":
		req.Task = "loss"
		if err := req.Scoring.Validate(); err != nil {
			return nil, err
		}
	case "passkey":
		if req.Scoring != (EvalOptions{}) {
			return nil, errors.New("eval: --positions, --sliding-window and --stride belong to the loss task, not --task passkey")
		}
	default:
		return nil, fmt.Errorf("eval: --task %q: want loss or passkey", req.Task)
	}
	l, err := loadModel(req.ConfigPath, req.Sets, req.Model, req.BOS, req.Out, "eval", stderr)
	if err != nil {
		return nil, err
	}
	if req.Task == "passkey" {
		if err := req.Passkey.Validate(l.em.Config.MaxSeqLen); err != nil {
			return nil, err
		}
		if err := l.build(req.Passkey.Lengths[len(req.Passkey.Lengths)-1], "eval", "a sample", "length (--lengths)"); err != nil {
			return nil, err
		}
		if req.Out == "" {
			req.Out = filepath.Clean(l.em.Path) + ".passkey.json"
		}
		return &Job{Req: req, Config: l.cfg, Model: l.em, BOS: l.bos, Stop: l.stop, Evaluator: l.ev, World: l.w}, nil
	}
	cfg, em := l.cfg, l.em
	perSource := false
	if req.Data == "" {
		req.Data = cfg.Data.HeldOut()
		perSource = slices.ContainsFunc(cfg.Data.Sources, func(s config.SourceConfig) bool { return s.Eval != "" })
	}
	if req.Data == "" && !perSource {
		return nil, errors.New("eval: no evaluation data: pass --data FILE or set data.eval (or a [[data.sources]] table's eval) in the config")
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
	longest, knob := req.SeqLen, "--seq-len" // the longest forward: a sample, or a window of the sliding scoring
	if w := req.Scoring.Window; w > 0 && w < longest {
		longest, knob = w, "--sliding-window"
	}
	if req.SeqLen > em.Config.MaxSeqLen && req.Scoring.Window == 0 {
		return nil, fmt.Errorf("eval: --seq-len %d exceeds the model's longest sequence, %d (max_seq_len / max_position_embeddings); --sliding-window W scores longer samples in windows of W", req.SeqLen, em.Config.MaxSeqLen)
	}
	if err := l.build(longest, "eval", "a sample", knob); err != nil {
		return nil, err
	}
	job := &Job{Req: req, Config: cfg, Model: em, BOS: l.bos, Stop: l.stop, Evaluator: l.ev, World: l.w}
	if perSource {
		if job.Sets, err = LoadSets(cfg.Data, em.Tokenizer, l.bos, req.SeqLen, em.Config.VocabSize, req.Samples); err != nil {
			return nil, fmt.Errorf("eval: %w", err)
		}
	} else {
		ss, err := LoadSamples(req.Data, cfg.Data, em.Tokenizer, l.bos, req.SeqLen, em.Config.VocabSize, req.Samples)
		if err != nil {
			return nil, err
		}
		job.Sets = []EvalSet{{Path: req.Data, Samples: ss}}
	}
	for _, set := range job.Sets {
		if len(set.Samples) < req.Samples {
			fmt.Fprintf(l.stderr, "eval: %s has %d documents to evaluate, fewer than --samples %d\n", set.Path, len(set.Samples), req.Samples)
		}
		job.Samples = append(job.Samples, set.Samples...)
	}
	if !perSource {
		job.Sets = nil
	}
	return job, nil
}

// Describe is the line that says what the job evaluates, on what and how.
func (j *Job) Describe() string {
	mc, world := j.Model.Config, j.Evaluator.Describe()
	what := fmt.Sprintf("%s (%s, LLaMA %s params, dim %d, %d layers, %d/%d heads, vocab %d)",
		j.Model.Describe(), j.Model.Source, data.Count(mc.NumParams()), mc.Dim, mc.NLayers, mc.NHeads, mc.NKVHeads, mc.VocabSize)
	if j.Req.Task == "passkey" {
		p := j.Req.Passkey
		return fmt.Sprintf("eval: passkey retrieval of %s: %d trials at each of %s tokens, %d depth bins, seed %d, %s; tokenizer %s",
			what, p.Trials, lengthList(p.Lengths), p.DepthBins, p.Seed, world, j.Model.Tokenizer.Name())
	}
	scoring := ""
	if o := j.Req.Scoring; o.Window > 0 {
		scoring = fmt.Sprintf(", sliding windows of %d every %d", o.Window, o.Stride)
	}
	of := data.ShowPath(j.Req.Data)
	if j.Sets != nil {
		var parts []string
		for _, s := range j.Sets {
			name := "data.eval"
			if s.Name != "" {
				name = "source " + s.Name
			}
			parts = append(parts, fmt.Sprintf("%s's %s (%d)", name, data.ShowPath(s.Path), len(s.Samples)))
		}
		of = strings.Join(parts, ", ")
	}
	return fmt.Sprintf("eval: %s on %d samples of %s, seq_len %d%s, %s; tokenizer %s",
		what, len(j.Samples), of, j.Req.SeqLen, scoring, world, j.Model.Tokenizer.Name())
}

// lengthList writes lengths as 1K,2K,4K.
func lengthList(ls []int) string {
	var s []string
	for _, l := range ls {
		if l >= 1024 && l%1024 == 0 {
			s = append(s, fmt.Sprintf("%dK", l/1024))
		} else {
			s = append(s, fmt.Sprint(l))
		}
	}
	return strings.Join(s, ",")
}

// Run evaluates the samples (progress is called after each) and returns the report eval
// writes. A cancelled ctx stops it between samples with an error.
func (j *Job) Run(ctx context.Context, progress func(done int, loss float64)) (Report, error) {
	var (
		res     Result
		pos     *PositionResult
		err     error
		sources []SourceResult
	)
	if j.Sets == nil {
		res, pos, err = j.Evaluator.EvaluateWith(ctx, j.Samples, j.Req.Scoring, progress)
		if err != nil {
			return Report{}, err
		}
	} else {
		// Each set on its own, its result and loss by position in the report's sources;
		// the whole result is data.eval's when it is one of them, else all samples pooled.
		var all []Result
		done := 0
		for _, s := range j.Sets {
			p := func(d int, loss float64) {
				if progress != nil {
					progress(done+d, loss)
				}
			}
			r, ps, err := j.Evaluator.EvaluateWith(ctx, s.Samples, j.Req.Scoring, p)
			if err != nil {
				return Report{}, err
			}
			done += len(s.Samples)
			r.SeqLen = j.Req.SeqLen
			all = append(all, r)
			if s.Name == "" {
				res, pos = r, ps
				continue
			}
			sources = append(sources, SourceResult{Name: s.Name, Data: s.Path, Result: r, Positions: ps})
		}
		if j.Sets[0].Name != "" {
			res = Pool(all...)
		}
	}
	res.SeqLen = j.Req.SeqLen
	rep := Report{Result: res, Sources: sources, Model: j.Req.Model, Source: j.Model.Source, Evaluated: j.Model.Path, Data: j.Req.Data,
		Tokenizer: j.Model.Tokenizer.Name(), BOS: j.BOS, Params: j.Model.Config.NumParams(), Scoring: j.Req.Scoring.Mode(),
		Positions: pos, TrainSeqLen: j.trainSeqLen()}
	if j.Req.Scoring.Window > 0 {
		rep.Window, rep.Stride = j.Req.Scoring.Window, j.Req.Scoring.Stride
	}
	if j.Model.Step >= 0 {
		step := j.Model.Step
		rep.Step = &step
	}
	return rep, nil
}

// trainSeqLen is the sequence length a checkpoint was trained at (0: not known).
func (j *Job) trainSeqLen() int {
	if j.Model.Saved != nil {
		return j.Model.Saved.Data.SeqLen
	}
	return 0
}

// PasskeyReport is what `eval --task passkey` writes.
type PasskeyReport struct {
	Task             string        `json:"task"` // "passkey"
	Model            string        `json:"model"`
	Source           string        `json:"source"`
	Evaluated        string        `json:"evaluated"`
	Step             *int          `json:"step,omitempty"`
	TrainSeqLen      int           `json:"train_seq_len,omitempty"` // a checkpoint's data.seq_len
	Tokenizer        string        `json:"tokenizer"`
	BOS              int32         `json:"bos_token_id"`
	Params           int64         `json:"params"`
	SequenceParallel int           `json:"sequence_parallel_degree"`
	Attention        string        `json:"attention,omitempty"`
	ElapsedSec       float64       `json:"elapsed_s"`
	Passkey          PasskeyResult `json:"passkey"`
}

// RunPasskey runs the passkey trials (progress is called after each) and returns the report.
func (j *Job) RunPasskey(ctx context.Context, progress func(done, total int)) (PasskeyReport, error) {
	start := time.Now()
	res, err := j.Evaluator.Passkey(ctx, j.Model.Tokenizer, j.BOS, j.Stop, j.Req.Passkey, progress)
	if err != nil {
		return PasskeyReport{}, err
	}
	rep := PasskeyReport{Task: "passkey", Model: j.Req.Model, Source: j.Model.Source, Evaluated: j.Model.Path,
		TrainSeqLen: j.trainSeqLen(), Tokenizer: j.Model.Tokenizer.Name(), BOS: j.BOS, Params: j.Model.Config.NumParams(),
		SequenceParallel: j.Evaluator.P(), Attention: j.Evaluator.Attn(), ElapsedSec: time.Since(start).Seconds(), Passkey: res}
	if j.Model.Step >= 0 {
		step := j.Model.Step
		rep.Step = &step
	}
	return rep, nil
}

// Replaces says what the report already at path holds when it is an evaluation of other data,
// length or scoring than rep ("" when there is none, or it is the same evaluation again), so
// that an eval that replaces it by default can say so.
func Replaces(path string, rep Report) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var old Report
	if json.Unmarshal(b, &old) != nil {
		return "a file that is not an eval report"
	}
	if old.Data == rep.Data && old.SeqLen == rep.SeqLen && old.Scoring == rep.Scoring && old.Samples == rep.Samples {
		return ""
	}
	return fmt.Sprintf("an eval of %d samples of %s at seq_len %d (%s)", old.Samples, old.Data, old.SeqLen, old.Scoring)
}

// WriteReport writes rep (a Report or a PasskeyReport) as indented JSON to path, creating
// its directory, atomically (a reader never sees half a file).
func WriteReport(path string, rep any) error {
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

// Text is what eval prints of the report of the model named model: the result, a result that
// is not a finite number said to be one, and the loss by position when it was asked for.
func (r Report) Text(model string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "eval: %s: loss %.6f  perplexity %.4f  bits/byte %.4f  over %d tokens (%d bytes) of %d samples in %.1fs (%.0f tokens/s)\n",
		model, r.Loss, r.Perplexity, r.BitsPerByte, r.Tokens, r.Bytes, r.Samples, r.ElapsedSec, r.TokensPerSec)
	if bad := r.NonFinite(); len(bad) > 0 {
		fmt.Fprintf(&b, "eval: %s not a finite number: the model's arithmetic overflowed on this data (its weights are finite; they were checked when read); the report holds null for %s\n",
			strings.Join(bad, ", "), strings.Join(bad, ", "))
	}
	if p := r.Positions; p != nil {
		for i := range p.Lo {
			fmt.Fprintf(&b, "eval: positions [%d, %d): loss %.4f over %d tokens\n", p.Lo[i], p.Hi[i], p.Loss[i], p.Tokens[i])
		}
	}
	for _, s := range r.Sources {
		fmt.Fprintf(&b, "eval: %s: source %s (%s): loss %.6f  perplexity %.4f  bits/byte %.4f  over %d tokens (%d bytes) of %d samples\n",
			model, s.Name, s.Data, s.Loss, s.Perplexity, s.BitsPerByte, s.Tokens, s.Bytes, s.Samples)
		if p := s.Positions; p != nil {
			for i := range p.Lo {
				fmt.Fprintf(&b, "eval: source %s: positions [%d, %d): loss %.4f over %d tokens\n", s.Name, p.Lo[i], p.Hi[i], p.Loss[i], p.Tokens[i])
			}
		}
	}
	return b.String()
}

// Text is what eval prints of a passkey report: the accuracy of each length, both ways.
func (r PasskeyReport) Text() string {
	var b strings.Builder
	p := r.Passkey
	for i, l := range p.Lengths {
		fmt.Fprintf(&b, "eval: passkey %d tokens: generated %.2f, teacher-forced %.2f over %d trials\n",
			l, p.Generated.Accuracy[i], p.Forced.Accuracy[i], p.Trials)
	}
	return b.String()
}

// NonFinite names the results of r that are not finite numbers (a model whose arithmetic
// overflowed on the data): "loss", "perplexity", "bits_per_byte".
func (r Result) NonFinite() []string {
	var out []string
	for _, f := range []struct {
		name string
		v    float64
	}{{"loss", r.Loss}, {"perplexity", r.Perplexity}, {"bits_per_byte", r.BitsPerByte}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			out = append(out, f.name)
		}
	}
	return out
}

// MarshalJSON writes the report with null for a result that is not a finite number (JSON has
// none) and names such results in "non_finite", so that a damaged evaluation is written and
// read as one rather than failing to encode.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report // without this method
	p := plain(r)
	return finiteJSON(&p, &p.Result)
}

// MarshalJSON writes a source's result as Report's MarshalJSON writes the whole one.
func (s SourceResult) MarshalJSON() ([]byte, error) {
	type plain SourceResult // without this method
	p := plain(s)
	return finiteJSON(&p, &p.Result)
}

// finiteJSON encodes v, a report whose result is res, with null for each result that is not a
// finite number and those named in "non_finite".
func finiteJSON(v any, res *Result) ([]byte, error) {
	bad := res.NonFinite()
	for _, f := range []*float64{&res.Loss, &res.Perplexity, &res.BitsPerByte} {
		if math.IsNaN(*f) || math.IsInf(*f, 0) {
			*f = 0
		}
	}
	b, err := json.Marshal(v)
	if err != nil || len(bad) == 0 {
		return b, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	for _, k := range bad {
		m[k] = nil
	}
	m["non_finite"] = bad
	return json.Marshal(m)
}

// checkMemory refuses, before the model is put on the ranks, an evaluation whose sequences of
// seqLen tokens do not fit in the memory each rank has (world.Memory: the host's shared by
// the process's ranks, or the GPU's): plan.EvalMemoryFor of the rank's share. The error, the
// command what's, names what is needed and available for sample and the longest length of it
// that fits, by the flag that sets it (knob).
func checkMemory(cfg config.Config, w *world.World, seqLen int, what, sample, knob string) error {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(10) // as train: a few large buffers live for the whole run
	}
	avail, source, ok := w.Memory()
	if !ok {
		return nil
	}
	cfg.Data.SeqLen = seqLen
	m := plan.EvalMemoryFor(cfg, avail)
	if m.Fits {
		return nil
	}
	gib := func(x float64) string { return fmt.Sprintf("%.1f GiB", x/(1<<30)) }
	msg := fmt.Sprintf("%s: %s of %d tokens needs %s per rank (the weights %s, activations %s, logits %s, attention %s, collector headroom %s, the process outside its tensors %s), a rank has %s available (%s)",
		what, sample, seqLen, gib(m.Peak), gib(m.Params), gib(m.Activations), gib(m.Logits), gib(m.AttnWork), gib(m.Runtime), gib(m.Process), gib(avail), source)
	if longest := plan.MaxEvalSeqLen(cfg, plan.SafeCapacity(avail)); longest > 0 {
		msg += fmt.Sprintf("; the longest %s that fits is %d tokens (%.0f%% of the memory left for what the estimate misses)", knob, longest, 100*plan.EstimateError)
	}
	return errors.New(msg)
}
