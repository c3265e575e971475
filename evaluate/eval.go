// Package evaluate measures a model on held-out text: it takes a model loaded from any format
// distflash reads (package weights: a Hugging Face LLaMA directory, a .safetensors file, a
// distflash checkpoint), tokenizes documents into samples, and runs them on
// sequence-parallel ranks (Evaluator) for loss, perplexity and bits per byte; Prepare and Job
// are the eval command after its flags.
//
// Layer: evaluate imports config, plan (its memory check), weights (the model it measures),
// ckpt (its report's atomic write), data, model, parallel and kernels. Package train (which
// evaluates during training) and the command import it.
package evaluate

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"

	"distflash/config"
	"distflash/data"
	"distflash/kernels"
	"distflash/model"
	"distflash/parallel"
	"distflash/parallel/transport"
	"distflash/weights"
)

// Evaluation: `distflash eval` (Prepare, Job) and the Evaluator that train calls every
// eval.interval steps.
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

// Result is what one evaluation measured.
type Result struct {
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

// Sample is one document prepared for evaluation.
type Sample struct {
	IDs, Targets []int32 // model inputs and next-token targets, the same length (<= seq_len)
	Bytes        int     // UTF-8 bytes the targets decode to
}

// NewSample tokenizes doc into a sample: bos (when >= 0) and the document's tokens, cut to
// seqLen+1 tokens. It reports false for a document too short to predict any token.
func NewSample(doc []byte, tok data.Tokenizer, bos int32, seqLen, vocab int) (Sample, bool, error) {
	ids := tok.Encode(doc)
	if bos >= 0 {
		ids = append([]int32{bos}, ids...)
	}
	ids = ids[:min(len(ids), seqLen+1)]
	if len(ids) < 2 {
		return Sample{}, false, nil
	}
	for _, id := range ids {
		if id < 0 || int(id) >= vocab {
			return Sample{}, false, fmt.Errorf("token id %d (tokenizer %s) is outside the model's vocabulary of %d", id, tok.Name(), vocab)
		}
	}
	s := Sample{IDs: ids[:len(ids)-1], Targets: ids[1:]}
	s.Bytes = len(tok.Decode(s.Targets))
	return s, true, nil
}

// collectSamples turns documents into at most n samples, skipping documents that predict no
// token.
func CollectSamples(docs [][]byte, tok data.Tokenizer, bos int32, seqLen, vocab, n int) ([]Sample, error) {
	var out []Sample
	for i, doc := range docs {
		s, ok, err := NewSample(doc, tok, bos, seqLen, vocab)
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

// LoadSamples reads the first n documents of the evaluation data at path (data.eval for
// train, --data for eval) in data.format, in path order (data.ReadDocuments), and makes
// samples of them. Documents with no token to predict are passed over, so it reads on
// until it has n samples or the data ends.
func LoadSamples(path string, d config.DataConfig, tok data.Tokenizer, bos int32, seqLen, vocab, n int) ([]Sample, error) {
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
		samples, err := CollectSamples(docs, tok, bos, seqLen, vocab, n)
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

// Evaluator runs forward passes of one model on P in-process sequence-parallel ranks, each
// with its own backend and copy of the parameters, as train's ranks.
type Evaluator struct {
	Config model.Config
	P      int
	Attn   string // schedule, when P > 1
	layout parallel.Layout
	world  *transport.World
	models []*model.Model
}

// NewEvaluator builds the ranks for model mc under the [parallelism] section par (P =
// sequence_parallel_degree; world_size beyond it would be data-parallel replicas, which an
// evaluation does not need). The models keep only each block's input (the forward never
// needs more), so activation memory is that of CheckpointLayer.
func NewEvaluator(mc model.Config, par config.ParallelismConfig) (*Evaluator, error) {
	if par.Backend != "inproc" {
		return nil, fmt.Errorf("eval: parallelism.backend = %q: this build evaluates on in-process ranks (\"inproc\")", par.Backend)
	}
	if err := mc.Resolve(); err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	P := max(par.SequenceParallelDegree, 1)
	e := &Evaluator{Config: mc, P: P, world: transport.NewWorld(P)}
	if P > 1 {
		if err := parallel.CheckHybrid(par.Attention, model.Heads{N: mc.NHeads, KV: mc.NKVHeads, Dim: mc.HeadDim}, P, max(par.UlyssesDegree, 1)); err != nil {
			return nil, fmt.Errorf("eval: parallelism.attention = %q on %d sequence-parallel ranks: %w", par.Attention, P, err)
		}
		l, err := parallel.LayoutOf(par.Attention)
		if err != nil {
			return nil, fmt.Errorf("eval: %w", err)
		}
		e.Attn, e.layout = par.Attention, l
	}
	for r := 0; r < P; r++ {
		be := kernels.NewCPU()
		m := model.New(mc, model.CheckpointLayer, be)
		m.LossChunk, m.MLPTile = config.AutoLossChunk(mc.VocabSize), config.AutoMLPTile(mc.FFNDim) // as training's defaults
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
func (e *Evaluator) Load(params []float32) error {
	if n := e.models[0].Layout.Size; len(params) != n {
		return fmt.Errorf("eval: %d parameter values for a model of %d", len(params), n)
	}
	for _, m := range e.models {
		m.LoadParams(params)
	}
	return nil
}

// Score returns the summed loss of one sample's targets and their count.
func (e *Evaluator) Score(s Sample) (lossSum float64, count int, err error) {
	losses, _, err := e.Forward(s.IDs, s.Targets, nil)
	if err != nil {
		return 0, 0, err
	}
	for i, t := range s.Targets { // in sequence order: the same sum on any number of ranks
		if t >= 0 {
			lossSum += float64(losses[i])
			count++
		}
	}
	return lossSum, count, nil
}

// Forward runs one forward of the sequence ids (one sample, positions from 0) on the ranks,
// with next-token targets (negative: not scored), and returns each position's loss (0 where
// the target is negative) in sequence order, and the argmax of the logits at each position of
// at (ties: the lowest id), for a teacher-forced check of what the model predicts there.
func (e *Evaluator) Forward(ids, targets []int32, at []int) (losses []float32, argmaxAt []int32, err error) {
	n := len(ids)
	if len(targets) != n {
		return nil, nil, fmt.Errorf("eval: %d tokens and %d targets", n, len(targets))
	}
	losses, argmaxAt = make([]float32, n), make([]int32, len(at))
	want := map[int32]int{} // position → index in at
	for i, p := range at {
		if p < 0 || p >= n {
			return nil, nil, fmt.Errorf("eval: argmax at position %d of %d", p, n)
		}
		want[int32(p)] = i
	}
	T := n
	if e.P > 1 {
		d := e.layout.Divisor(e.P)
		T = (n + d - 1) / d * d
	}
	ids2 := make([]int32, T) // padding: token 0, target -1 (ignored), after the sample
	tg2 := slices.Repeat([]int32{-1}, T)
	copy(ids2, ids)
	copy(tg2, targets)
	V := e.Config.VocabSize
	err = e.world.Run(func(c transport.Comm) error {
		r := c.Rank()
		pos, err := e.positions(T, r)
		if err != nil {
			return err
		}
		m := e.models[r]
		if len(at) > 0 {
			row := make([]float32, V)
			be := m.Backend()
			m.RowHook = func(row0 int, lg kernels.Buf, rows int) {
				for i := row0; i < row0+rows; i++ {
					if j, ok := want[pos[i]]; ok {
						be.Download(row, be.Slice(lg, (i-row0)*V, V))
						argmaxAt[j] = argmax(row)
					}
				}
			}
			defer func() { m.RowHook = nil }()
		}
		// SeqLen: the sample's length, not the padded T nor the rank's slice (dynamic RoPE)
		m.Forward(model.Batch{IDs: parallel.Shard(ids2, 1, T, 1, pos), Targets: parallel.Shard(tg2, 1, T, 1, pos), B: 1, Pos: pos, SeqLen: n})
		for i, l := range m.TokenLosses() {
			if p := int(pos[i]); p < n {
				losses[p] = l // each rank its own positions
			}
		}
		return nil
	})
	return losses, argmaxAt, err
}

// positions returns the global positions rank r holds of a T-token sequence: all of them on
// one rank, its layout's share on several.
func (e *Evaluator) positions(T, r int) ([]int32, error) {
	if e.P == 1 {
		return model.Positions(T), nil
	}
	return e.layout.Positions(T, e.P, r)
}

// Evaluate runs every sample (one forward each, every target scored) and returns the result;
// progress, when not nil, is called after each sample with the number done and the running
// mean loss. A cancelled ctx stops it between samples with an error.
func (e *Evaluator) Evaluate(ctx context.Context, samples []Sample, progress func(done int, loss float64)) (Result, error) {
	r, _, err := e.EvaluateWith(ctx, samples, EvalOptions{}, progress)
	return r, err
}

// SeqLen is the configured evaluation sequence length: eval.seq_len, else data.seq_len.
func SeqLen(cfg config.Config) int { return cmp.Or(cfg.Eval.SeqLen, cfg.Data.SeqLen) }

// Report is the JSON file eval writes: the result and what produced it.
type Report struct {
	Result
	Model     string `json:"model"`
	Source    string `json:"source"`         // hf | safetensors | checkpoint
	Evaluated string `json:"evaluated"`      // the step directory of a checkpoint, else the model
	Step      *int   `json:"step,omitempty"` // a checkpoint's step
	Data      string `json:"data"`
	Tokenizer string `json:"tokenizer"`
	BOS       int32  `json:"bos_token_id"` // -1: none
	Params    int64  `json:"params"`
	// Scoring is how long samples are scored: "truncate" (one forward each) or
	// "sliding_window" (Window tokens every Stride; positions.go).
	Scoring     string          `json:"scoring"`
	Window      int             `json:"window,omitempty"`
	Stride      int             `json:"stride,omitempty"`
	TrainSeqLen int             `json:"train_seq_len,omitempty"` // a checkpoint's data.seq_len
	Positions   *PositionResult `json:"positions,omitempty"`     // the loss by position (--positions)
}

// LoadConfig reads the config file at path (the built-in defaults when path is "") with
// the overrides, without validating it: the model evaluated decides its shape (ValidateEval).
func LoadConfig(path string, sets []string) (config.Config, error) {
	return config.Read(path, sets)
}

// ConfigFor is the config an evaluation of em runs under: cfg with em's model shape. A
// checkpoint evaluated without --config brings its training run's [data] and [eval]
// sections (data.eval, data.format, data.seq_len…) as the defaults that --set overrides.
func ConfigFor(cfg config.Config, em weights.Model, configPath string, sets []string) (config.Config, error) {
	if em.Saved != nil && configPath == "" {
		cfg.Data, cfg.Eval = em.Saved.Data, em.Saved.Eval
		for _, o := range sets {
			if err := cfg.Set(o); err != nil {
				return config.Config{}, err
			}
		}
	}
	cfg.Model = em.Config
	if err := cfg.ValidateEval(); err != nil {
		return config.Config{}, err
	}
	return cfg, nil
}

// parseBOS reads --bos: "auto" (def), "none" or a token id.
func ParseBOS(s string, def int32) (int32, error) {
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
