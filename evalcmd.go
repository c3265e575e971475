package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"

	"distflash/ckpt"
	"distflash/data"
	"distflash/kernels"
	"distflash/model"
	"distflash/parallel"
)

// Evaluation: `distflash eval` and the evaluate function that train calls every eval.interval
// steps.
//
// What is measured. Each sample is one document: its tokens, with the model's BOS token
// prepended when it has one, cut to seq_len+1 tokens; the model reads the first seq_len (or
// fewer) and predicts each next token. The loss is the mean next-token cross-entropy, in nats,
// over every predicted token of every sample; perplexity is exp(loss); bits per byte is the
// summed cross-entropy / ln 2 / the UTF-8 bytes that the predicted tokens decode to (the
// document's scored text: for the byte tokenizer exactly the first seq_len bytes with a BOS,
// or bytes 2..seq_len+1 without one, since the first token is then not predicted). The BOS
// token itself is never predicted and never counted.
//
// Sequence parallelism. With parallelism.sequence_parallel_degree P > 1, P in-process ranks
// share every sample, as in training: each holds its tokens of the configured schedule's
// layout and runs the schedule's attention. A sample of n tokens is padded to a multiple of
// the layout's divisor (P, or 2P for zig-zag) with targets -1, which the loss ignores; the
// padding sits after the sample, so causal attention keeps the real tokens from seeing it.

// EvalResult is what one evaluation measured.
type EvalResult struct {
	Loss             float64 `json:"loss"`                     // mean next-token cross-entropy, nats per predicted token
	Perplexity       float64 `json:"perplexity"`               // exp(loss)
	BitsPerByte      float64 `json:"bits_per_byte"`            // summed cross-entropy / ln 2 / Bytes
	Tokens           int64   `json:"tokens"`                   // predicted tokens
	Bytes            int64   `json:"bytes"`                    // UTF-8 bytes the predicted tokens decode to
	Samples          int     `json:"samples"`                  // documents evaluated
	SeqLen           int     `json:"seq_len"`                  // tokens read per sample at most (the caller's limit)
	SequenceParallel int     `json:"sequence_parallel_degree"` // ranks sharing each sample
	Attention        string  `json:"attention,omitempty"`      // the schedule, when SequenceParallel > 1
	ElapsedSec       float64 `json:"elapsed_s"`
	TokensPerSec     float64 `json:"tokens_per_s"`
}

// evalSample is one document prepared for evaluation.
type evalSample struct {
	ids, targets []int32 // model inputs and next-token targets, the same length (<= seq_len)
	bytes        int     // UTF-8 bytes the targets decode to
}

// newEvalSample tokenizes doc into a sample: bos (when >= 0) and the document's tokens, cut to
// seqLen+1 tokens. It reports false for a document too short to predict any token.
func newEvalSample(doc []byte, tok data.Tokenizer, bos int32, seqLen, vocab int) (evalSample, bool, error) {
	ids := tok.Encode(doc)
	if bos >= 0 {
		ids = append([]int32{bos}, ids...)
	}
	ids = ids[:min(len(ids), seqLen+1)]
	if len(ids) < 2 {
		return evalSample{}, false, nil
	}
	for _, id := range ids {
		if id < 0 || int(id) >= vocab {
			return evalSample{}, false, fmt.Errorf("token id %d (tokenizer %s) is outside the model's vocabulary of %d", id, tok.Name(), vocab)
		}
	}
	s := evalSample{ids: ids[:len(ids)-1], targets: ids[1:]}
	s.bytes = len(tok.Decode(s.targets))
	return s, true, nil
}

// collectSamples turns documents into at most n samples, skipping documents that predict no
// token.
func collectSamples(docs [][]byte, tok data.Tokenizer, bos int32, seqLen, vocab, n int) ([]evalSample, error) {
	var out []evalSample
	for i, doc := range docs {
		s, ok, err := newEvalSample(doc, tok, bos, seqLen, vocab)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if ok {
			out = append(out, s)
		}
		if len(out) == n {
			break
		}
	}
	return out, nil
}

// loadEvalSamples reads the first n documents of the evaluation data at path (data.eval for
// train, --data for eval) in data.format, in path order (data.ReadDocuments), and makes
// samples of them. Documents with no token to predict are passed over, so it reads on
// until it has n samples or the data ends.
func loadEvalSamples(path string, d DataConfig, tok data.Tokenizer, bos int32, seqLen, vocab, n int) ([]evalSample, error) {
	p, err := data.ExpandPath(path)
	if err != nil {
		return nil, fmt.Errorf("eval: data %q: %w", path, err)
	}
	src := data.Source{Path: p, Format: d.Format, Include: d.Include}
	for k := n; ; k *= 2 {
		docs, err := data.ReadDocuments(src, k)
		if err != nil {
			return nil, fmt.Errorf("eval: %w", err)
		}
		samples, err := collectSamples(docs, tok, bos, seqLen, vocab, n)
		if err != nil {
			return nil, fmt.Errorf("eval: %s: %w", path, err)
		}
		if len(samples) >= n || len(docs) < k {
			if len(samples) == 0 {
				return nil, fmt.Errorf("eval: %s: no document with a token to predict", path)
			}
			return samples, nil
		}
	}
}

// evaluator runs forward passes of one model on P in-process sequence-parallel ranks, each
// with its own backend and copy of the parameters, as train's ranks.
type evaluator struct {
	cfg    model.Config
	P      int
	attn   string // schedule, when P > 1
	layout parallel.Layout
	world  *parallel.World
	models []*model.Model
}

// newEvaluator builds the ranks for model mc under the [parallelism] section par (P =
// sequence_parallel_degree; world_size beyond it would be data-parallel replicas, which an
// evaluation does not need). The models keep only each block's input (the forward never
// needs more), so activation memory is that of CheckpointLayer.
func newEvaluator(mc model.Config, par ParallelismConfig) (*evaluator, error) {
	if par.Backend != "inproc" {
		return nil, fmt.Errorf("eval: parallelism.backend = %q: this build evaluates on in-process ranks (\"inproc\")", par.Backend)
	}
	if err := mc.Resolve(); err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	P := max(par.SequenceParallelDegree, 1)
	e := &evaluator{cfg: mc, P: P, world: parallel.NewWorld(P)}
	if P > 1 {
		if err := parallel.CheckHybrid(par.Attention, model.Heads{N: mc.NHeads, KV: mc.NKVHeads, Dim: mc.HeadDim}, P, max(par.UlyssesDegree, 1)); err != nil {
			return nil, fmt.Errorf("eval: parallelism.attention = %q on %d sequence-parallel ranks: %w", par.Attention, P, err)
		}
		l, err := parallel.LayoutOf(par.Attention)
		if err != nil {
			return nil, fmt.Errorf("eval: %w", err)
		}
		e.attn, e.layout = par.Attention, l
	}
	for r := 0; r < P; r++ {
		be := kernels.NewCPU()
		m := model.New(mc, model.CheckpointLayer, be)
		if P > 1 {
			a, err := parallel.NewAttention(par.Attention, e.world.Comm(r), be, parallel.Options{Overlap: par.OverlapComm, UlyssesDegree: par.UlyssesDegree})
			if err != nil {
				return nil, fmt.Errorf("eval: %w", err)
			}
			m.Attn = a
		}
		e.models = append(e.models, m)
	}
	return e, nil
}

// load copies params (in model.NewLayout order) into every rank.
func (e *evaluator) load(params []float32) error {
	if n := e.models[0].Layout.Size; len(params) != n {
		return fmt.Errorf("eval: %d parameter values for a model of %d", len(params), n)
	}
	for _, m := range e.models {
		m.LoadParams(params)
	}
	return nil
}

// sample returns the summed loss of one sample's targets and their count.
func (e *evaluator) sample(s evalSample) (lossSum float64, count int, err error) {
	n := len(s.ids)
	if e.P == 1 {
		lossSum, count = e.models[0].Forward(s.ids, s.targets, 1, model.Positions(n))
		return lossSum, count, nil
	}
	d := e.layout.Divisor(e.P)
	T := (n + d - 1) / d * d
	ids := make([]int32, T) // padding: token 0, target -1 (ignored)
	targets := slices.Repeat([]int32{-1}, T)
	copy(ids, s.ids)
	copy(targets, s.targets)
	sums := make([]float64, e.P)
	counts := make([]int, e.P)
	err = e.world.Run(func(c parallel.Comm) error {
		r := c.Rank()
		pos, err := e.layout.Positions(T, e.P, r)
		if err != nil {
			return err
		}
		e.models[r].SeqLen = n // the sample's length, not the padded T nor the rank's slice (dynamic RoPE)
		sums[r], counts[r] = e.models[r].Forward(parallel.Shard(ids, 1, T, 1, pos), parallel.Shard(targets, 1, T, 1, pos), 1, pos)
		return nil
	})
	for r := range sums { // in rank order: deterministic
		lossSum += sums[r]
		count += counts[r]
	}
	return lossSum, count, err
}

// evaluate runs every sample and returns the result; progress, when not nil, is called after
// each sample with the number done and the running mean loss. A cancelled ctx stops it between
// samples with an error.
func (e *evaluator) evaluate(ctx context.Context, samples []evalSample, progress func(done int, loss float64)) (EvalResult, error) {
	start := time.Now()
	var lossSum float64
	var tokens, nbytes int64
	for i, s := range samples {
		if err := ctx.Err(); err != nil {
			return EvalResult{}, fmt.Errorf("eval: stopped after %d of %d samples: %w", i, len(samples), err)
		}
		l, n, err := e.sample(s)
		if err != nil {
			return EvalResult{}, fmt.Errorf("eval: sample %d: %w", i+1, err)
		}
		if n != len(s.targets) {
			return EvalResult{}, fmt.Errorf("eval: sample %d: %d targets scored, want %d", i+1, n, len(s.targets))
		}
		lossSum += l
		tokens += int64(n)
		nbytes += int64(s.bytes)
		if progress != nil {
			progress(i+1, lossSum/float64(tokens))
		}
	}
	if tokens == 0 {
		return EvalResult{}, errors.New("eval: no tokens to evaluate")
	}
	elapsed := time.Since(start).Seconds()
	loss := lossSum / float64(tokens)
	r := EvalResult{Loss: loss, Perplexity: math.Exp(loss), Tokens: tokens, Bytes: nbytes,
		Samples: len(samples), SequenceParallel: e.P, Attention: e.attn,
		ElapsedSec: elapsed, TokensPerSec: float64(tokens) / elapsed}
	if nbytes > 0 {
		r.BitsPerByte = lossSum / math.Ln2 / float64(nbytes)
	}
	return r, nil
}

// evalSeqLen is the configured evaluation sequence length: eval.seq_len, else data.seq_len.
func evalSeqLen(cfg Config) int { return cmp.Or(cfg.Eval.SeqLen, cfg.Data.SeqLen) }

// evalModel is a model ready to evaluate.
type evalModel struct {
	cfg    model.Config
	params []float32      // in model.NewLayout(cfg) order
	tok    data.Tokenizer // the model's tokenizer
	bos    int32          // BOS token prepended to every sample; -1: none
	source string         // "hf", "safetensors" or "checkpoint"
	path   string         // what was evaluated: the step directory of a checkpoint, else --model
	step   int            // a checkpoint's step; -1 for other models
	saved  *Config        // a checkpoint's training config; nil for other models
}

// loadEvalModel loads --model: a Hugging Face LLaMA directory (a config.json that is not
// distflash's own, see ckpt.IsHFDir, and safetensors weights), a .safetensors file holding
// distflash's parameter names for the config's [model] shape, or a checkpoint directory of
// this program.
func loadEvalModel(path string, cfg Config, stderr io.Writer) (evalModel, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return evalModel{}, fmt.Errorf("eval: --model: %w", err)
	}
	switch {
	case fi.IsDir() && ckpt.IsHFDir(path):
		return loadHFModel(path, cfg)
	case fi.IsDir():
		saved, params, dir, step, err := loadCheckpointParams(path, stderr)
		if err != nil {
			return evalModel{}, fmt.Errorf("eval: --model %w", err)
		}
		tok, err := configTokenizer(saved) // the tokenizer the model was trained with
		if err != nil {
			return evalModel{}, err
		}
		return evalModel{cfg: saved.Model, params: params, tok: tok, bos: -1, source: "checkpoint",
			path: dir, step: step, saved: &saved}, nil
	case strings.HasSuffix(path, ".safetensors"):
		if err := cfg.Model.Resolve(); err != nil {
			return evalModel{}, fmt.Errorf("eval: %s: the config's [model] gives its shape: %w", path, err)
		}
		params, err := loadSafetensorsParams(path, cfg.Model)
		if err != nil {
			return evalModel{}, err
		}
		tok, err := configTokenizer(cfg)
		if err != nil {
			return evalModel{}, err
		}
		return evalModel{cfg: cfg.Model, params: params, tok: tok, bos: -1, source: "safetensors", path: path, step: -1}, nil
	}
	return evalModel{}, fmt.Errorf("eval: --model %s: want a Hugging Face LLaMA directory (config.json and *.safetensors), a checkpoint directory of distflash, or a .safetensors file", path)
}

// loadCheckpointParams reads a checkpoint written by distflash train: a step directory, or a
// run directory, meaning its newest intact checkpoint (its latest, or, when that is damaged,
// the newest older one that verifies, as --resume auto chooses, each one passed over named on
// stderr). It returns the config the model was trained with, its parameters in
// model.NewLayout order, verified (every shard's checksum) before use, and the step
// directory and step read.
func loadCheckpointParams(path string, stderr io.Writer) (cfg Config, params []float32, dir string, step int, err error) {
	spec := path
	if _, err := os.Stat(filepath.Join(path, ckpt.ManifestFile)); err != nil {
		spec = "auto" // a run directory
	}
	c, skipped, err := ckpt.ResolveOpen(path, spec)
	for _, s := range skipped {
		fmt.Fprintf(stderr, "skipping damaged checkpoint: %v\n", s)
	}
	if err == nil && c == nil {
		err = fmt.Errorf("%s holds no checkpoint (no %s, no step-NNNNNN directory)", path, ckpt.ManifestFile)
	}
	if err != nil {
		return Config{}, nil, "", 0, fmt.Errorf("%s: not a Hugging Face directory (no config.json of one) nor a readable distflash checkpoint: %w", path, err)
	}
	defer c.Close()
	dir, step = c.Dir(), c.Manifest().Step
	saved := DefaultConfig()
	if err := json.Unmarshal(c.Manifest().Config, &saved); err != nil {
		return Config{}, nil, "", 0, fmt.Errorf("%s: config in the manifest: %w", c.Dir(), err)
	}
	if err := saved.Model.Resolve(); err != nil {
		return Config{}, nil, "", 0, fmt.Errorf("%s: model in the manifest: %w", c.Dir(), err)
	}
	m := saved.Model
	what := fmt.Sprintf("the model of %s (model.dim %d, model.ffn_dim %d, model.n_layers %d, model.vocab_size %d)",
		filepath.Join(c.Dir(), ckpt.ManifestFile), m.Dim, m.FFNDim, m.NLayers, m.VocabSize)
	if err := checkModelMemory(what, m, 1, weightBytesPerParam); err != nil {
		return Config{}, nil, "", 0, err
	}
	params, err = c.ReadTensor("params")
	if err != nil {
		return Config{}, nil, "", 0, err
	}
	if want := model.NewLayout(saved.Model).Size; len(params) != want {
		return Config{}, nil, "", 0, fmt.Errorf("%s: %d parameters, the model in its manifest has %d", c.Dir(), len(params), want)
	}
	return saved, params, dir, step, nil
}

// configTokenizer is the tokenizer named by data.tokenizer.
func configTokenizer(cfg Config) (data.Tokenizer, error) {
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("eval: data.tokenizer: %w", err)
	}
	return tok, nil
}

// hfModelConfig is the model.Config of a Hugging Face LLaMA config.
func hfModelConfig(h ckpt.HFConfig) model.Config {
	return model.Config{Dim: h.HiddenSize, NLayers: h.NumHiddenLayers, NHeads: h.NumAttentionHeads,
		NKVHeads: h.NumKeyValueHeads, HeadDim: h.HeadDim, FFNDim: h.IntermediateSize, VocabSize: h.VocabSize,
		NormEps: h.RMSNormEps, RopeTheta: h.RopeTheta, MaxSeqLen: h.ContextLength(), RopeScaling: model.RopeScaling(h.RopeScaling)}
}

// hfShape names an HF directory's config.json with the keys that size its model.
func hfShape(dir string, c ckpt.HFConfig) string {
	return fmt.Sprintf("%s (hidden_size %d, intermediate_size %d, num_hidden_layers %d, num_attention_heads %d, num_key_value_heads %d, vocab_size %d)",
		filepath.Join(dir, ckpt.HFConfigFile), c.HiddenSize, c.IntermediateSize, c.NumHiddenLayers, c.NumAttentionHeads, c.NumKeyValueHeads, c.VocabSize)
}

// loadHFModel loads a Hugging Face LLaMA directory: the shape from config.json, the weights
// as they are (HF's q/k layout is distflash's, see package ckpt), the directory's tokenizer
// when it has one (else data.tokenizer), and config.json's bos_token_id.
func loadHFModel(dir string, cfg Config) (evalModel, error) {
	h, err := ckpt.OpenHF(dir)
	if err != nil {
		return evalModel{}, err
	}
	mc := hfModelConfig(h.Config)
	if err := mc.Resolve(); err != nil {
		return evalModel{}, fmt.Errorf("eval: %s: %w", filepath.Join(dir, ckpt.HFConfigFile), err)
	}
	// The weights as read, and a copy in each sequence-parallel rank's model.
	copies := 1 + float64(max(cfg.Parallelism.SequenceParallelDegree, 1))
	if err := checkModelMemory("eval: the model of "+hfShape(dir, h.Config), mc, copies, weightBytesPerParam); err != nil {
		return evalModel{}, err
	}
	layout := model.NewLayout(mc)
	params := make([]float32, layout.Size)
	dsts := make([]ckpt.Dest, len(layout.Tensors))
	for i, t := range layout.Tensors {
		dsts[i] = ckpt.Dest{Name: t.Name, Shape: t.Shape, Data: params[t.Off : t.Off+t.Size()]}
	}
	if err := h.Load(dsts); err != nil {
		return evalModel{}, err
	}
	tokName := cfg.Data.Tokenizer
	if h.Tokenizer != "" {
		tokName = h.Tokenizer
	}
	tok, err := data.NewTokenizer(tokName)
	if err != nil {
		return evalModel{}, fmt.Errorf("eval: tokenizer %s: %w", tokName, err)
	}
	return evalModel{cfg: mc, params: params, tok: tok, bos: int32(h.Config.BOSTokenID), source: "hf", path: dir, step: -1}, nil
}

// loadSafetensorsParams reads a safetensors file holding every parameter of the model shape
// mc under distflash's (Hugging Face) names, and nothing else.
func loadSafetensorsParams(path string, mc model.Config) ([]float32, error) {
	st, err := ckpt.ReadSafetensors(path)
	if err != nil {
		return nil, err
	}
	layout := model.NewLayout(mc)
	params := make([]float32, layout.Size)
	for _, t := range layout.Tensors {
		v, shape, err := st.Float32(t.Name)
		if err != nil {
			return nil, fmt.Errorf("eval: %w (the config's [model] must be the file's shape)", err)
		}
		if !slices.Equal(shape, t.Shape) {
			return nil, fmt.Errorf("eval: %s: tensor %q has shape %v, the config's [model] needs %v", path, t.Name, shape, t.Shape)
		}
		copy(params[t.Off:], v)
	}
	for _, name := range st.Names() {
		if _, ok := layout.Lookup(name); !ok {
			return nil, fmt.Errorf("eval: %s: tensor %q is not a parameter of the config's [model]", path, name)
		}
	}
	return params, nil
}

// evalReport is the JSON file eval writes: the result and what produced it.
type evalReport struct {
	EvalResult
	Model     string `json:"model"`
	Source    string `json:"source"`         // hf | safetensors | checkpoint
	Evaluated string `json:"evaluated"`      // the step directory of a checkpoint, else the model
	Step      *int   `json:"step,omitempty"` // a checkpoint's step
	Data      string `json:"data"`
	Tokenizer string `json:"tokenizer"`
	BOS       int32  `json:"bos_token_id"` // -1: none
	Params    int64  `json:"params"`
}

// loadEvalConfig reads the config file at path (the built-in defaults when path is "") with
// the overrides, without validating it: the model evaluated decides its shape (ValidateEval).
func loadEvalConfig(path string, sets []string) (Config, error) {
	return readConfig(path, sets)
}

// evalConfig is the config an evaluation of em runs under: cfg with em's model shape. A
// checkpoint evaluated without --config brings its training run's [data] and [eval]
// sections (data.eval, data.format, data.seq_len…) as the defaults that --set overrides.
func evalConfig(cfg Config, em evalModel, configPath string, sets []string) (Config, error) {
	if em.saved != nil && configPath == "" {
		cfg.Data, cfg.Eval = em.saved.Data, em.saved.Eval
		for _, o := range sets {
			if err := cfg.Set(o); err != nil {
				return Config{}, err
			}
		}
	}
	cfg.Model = em.cfg
	if err := cfg.ValidateEval(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// parseBOS reads --bos: "auto" (def), "none" or a token id.
func parseBOS(s string, def int32) (int32, error) {
	switch s {
	case "auto":
		return def, nil
	case "none":
		return -1, nil
	}
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("eval: --bos %q: want auto, none or a token id >= 0", s)
	}
	return int32(n), nil
}

// runEval is `distflash eval`.
func runEval(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("eval", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "TOML config file: [parallelism], [data] tokenizer and format, [eval] (default: the built-in defaults, as configs/tiny.toml)")
	modelPath := fs.String("model", "", "Hugging Face LLaMA directory, distflash checkpoint directory, or .safetensors file with the config's [model] shape (required)")
	dataPath := fs.String("data", "", "evaluation data: file, directory or glob in data.format (text: one document per file; jsonl, c4: one per line) (default: data.eval)")
	samples := fs.Int("samples", 0, "documents evaluated, the first ones in path order (default: eval.samples)")
	seqLen := fs.Int("seq-len", 0, "tokens read per sample at most; longer documents are cut (default: eval.seq_len, else data.seq_len)")
	out := fs.String("out", "", "JSON result file (default: beside the model: <step directory>.eval.json for a checkpoint, <model>.eval.json otherwise)")
	bosFlag := fs.String("bos", "auto", "BOS token prepended to each sample: auto (a Hugging Face model's bos_token_id; none for distflash's own models, which train without one), none, or an id")
	progress := fs.Bool("progress", isTerminal(stderr), "show a progress bar on stderr (default: when stderr is a terminal)")
	var sets setFlags
	fs.Var(&sets, "set", "override a config value, e.g. --set parallelism.sequence_parallel_degree=4 (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("eval: unexpected arguments %q", fs.Args())
	}
	if *modelPath == "" {
		return errors.New("eval: --model is required: a Hugging Face LLaMA directory, a checkpoint directory or a .safetensors file")
	}
	cfg, err := loadEvalConfig(*configPath, sets)
	if err != nil {
		return err
	}
	em, err := loadEvalModel(*modelPath, cfg, stderr)
	if err != nil {
		return err
	}
	if cfg, err = evalConfig(cfg, em, *configPath, sets); err != nil {
		return err
	}
	if cfg.Device.Kind != "cpu" {
		return fmt.Errorf("eval: device.kind = %q needs a build with -tags %s (this build runs on the CPU)", cfg.Device.Kind, cfg.Device.Kind)
	}
	if *dataPath == "" {
		*dataPath = cfg.Data.Eval
	}
	if *dataPath == "" {
		return errors.New("eval: no evaluation data: pass --data FILE or set data.eval in the config")
	}
	if *samples == 0 {
		*samples = cfg.Eval.Samples
	}
	if *seqLen == 0 {
		*seqLen = evalSeqLen(cfg)
	}
	if *samples < 1 || *seqLen < 1 {
		return fmt.Errorf("eval: --samples %d, --seq-len %d: both must be >= 1", *samples, *seqLen)
	}
	if *out == "" {
		*out = filepath.Clean(em.path) + ".eval.json"
	}
	bos, err := parseBOS(*bosFlag, em.bos)
	if err != nil {
		return err
	}
	mc := em.cfg
	if *seqLen > mc.MaxSeqLen {
		return fmt.Errorf("eval: --seq-len %d exceeds the model's longest sequence, %d (max_seq_len / max_position_embeddings)", *seqLen, mc.MaxSeqLen)
	}
	if v := em.tok.VocabSize(); v > mc.VocabSize {
		return fmt.Errorf("eval: tokenizer %s has %d tokens, the model's vocabulary only %d", em.tok.Name(), v, mc.VocabSize)
	}
	if bos >= int32(mc.VocabSize) {
		return fmt.Errorf("eval: BOS token %d is outside the model's vocabulary of %d", bos, mc.VocabSize)
	}
	ev, err := newEvaluator(mc, cfg.Parallelism)
	if err != nil {
		return err
	}
	if err := ev.load(em.params); err != nil {
		return err
	}
	em.params = nil
	ss, err := loadEvalSamples(*dataPath, cfg.Data, em.tok, bos, *seqLen, mc.VocabSize, *samples)
	if err != nil {
		return err
	}
	if len(ss) < *samples {
		fmt.Fprintf(stderr, "eval: %s has %d documents to evaluate, fewer than --samples %d\n", *dataPath, len(ss), *samples)
	}
	world := "1 worker"
	if ev.P > 1 {
		world = fmt.Sprintf("%d sequence-parallel ranks (%s)", ev.P, ev.attn)
	}
	fmt.Fprintf(stderr, "eval: %s (%s, LLaMA %s params, dim %d, %d layers, %d/%d heads, vocab %d) on %d samples of %s, seq_len %d, %s; tokenizer %s\n",
		em.describe(), em.source, count(mc.NumParams()), mc.Dim, mc.NLayers, mc.NHeads, mc.NKVHeads, mc.VocabSize,
		len(ss), *dataPath, *seqLen, world, em.tok.Name())

	bar := progressbar.NewOptions(len(ss),
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetVisibility(*progress),
		progressbar.OptionSetWidth(24),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := ev.evaluate(ctx, ss, func(done int, loss float64) {
		bar.Describe(fmt.Sprintf("loss %.4f", loss))
		_ = bar.Add(1)
	})
	_ = bar.Finish()
	if err != nil {
		return err
	}
	res.SeqLen = *seqLen
	rep := evalReport{EvalResult: res, Model: *modelPath, Source: em.source, Evaluated: em.path, Data: *dataPath,
		Tokenizer: em.tok.Name(), BOS: bos, Params: mc.NumParams()}
	if em.step >= 0 {
		rep.Step = &em.step
	}
	// The result first, so that a file that cannot be written loses nothing.
	fmt.Fprintf(stdout, "eval: %s: loss %.6f  perplexity %.4f  bits/byte %.4f  over %d tokens (%d bytes) of %d samples in %.1fs (%.0f tokens/s)\n",
		em.describe(), res.Loss, res.Perplexity, res.BitsPerByte, res.Tokens, res.Bytes, res.Samples, res.ElapsedSec, res.TokensPerSec)
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("eval: encode result: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return fmt.Errorf("eval: %w", err)
	}
	if err := ckpt.WriteFileAtomic(*out, append(js, '\n')); err != nil {
		return fmt.Errorf("eval: write result: %w", err)
	}
	fmt.Fprintf(stdout, "eval: wrote %s\n", *out)
	return nil
}

// describe names what was evaluated: "runs/tiny/step-000600 (step 600)" for a checkpoint.
func (em evalModel) describe() string {
	if em.step >= 0 {
		return fmt.Sprintf("%s (step %d)", em.path, em.step)
	}
	return em.path
}
