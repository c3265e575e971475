// Package evaluate measures a model on held-out text: it takes a model loaded from any format
// distflash reads (package weights: a Hugging Face LLaMA directory, a .safetensors file, a
// distflash checkpoint), tokenizes documents into samples, and runs them on the ranks of a
// world (Evaluator: the eval command's, or the training ranks) for loss, perplexity and bits
// per byte, the loss by position, passkey retrieval and generation; Prepare and Job are the
// eval command after its flags, PrepareGenerate and GenJob the generate command's.
//
// Layer: evaluate imports world (the ranks it runs on), config, plan (its memory check),
// weights (the model it measures), ckpt (its report's atomic write), runplot (the pictures of
// its reports: plots.go), data, model, parallel, parallel/transport and kernels. Package train
// (which evaluates during training) and the command import it.
package evaluate

import (
	"cmp"
	"fmt"
	"math"
	"strconv"
	"strings"

	"distflash/config"
	"distflash/data"
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
// Ranks. The evaluation runs on the ranks of a world (package world), as training does: in
// process, or over MPI and NCCL, on the configured devices, sequence-parallel and
// FSDP-sharded; see Evaluator.

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
	src := data.Source{Path: p, Format: d.Format, TextKey: d.TextKey, Include: d.Include}
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

// Pool is the result of evaluating the samples of several results together: the loss and bits
// per byte over all their predicted tokens and bytes (each result's loss weighted by its
// tokens), the counts and times summed; the other fields are the first result's.
func Pool(rs ...Result) Result {
	if len(rs) == 0 {
		return Result{}
	}
	out := rs[0]
	var nats, tokens, bytes, samples, elapsed = 0.0, int64(0), int64(0), 0, 0.0
	for _, r := range rs {
		nats += r.Loss * float64(r.Tokens)
		tokens += r.Tokens
		bytes += r.Bytes
		samples += r.Samples
		elapsed += r.ElapsedSec
	}
	out.Tokens, out.Bytes, out.Samples, out.ElapsedSec = tokens, bytes, samples, elapsed
	out.Loss = nats / float64(tokens)
	out.Perplexity = math.Exp(out.Loss)
	out.BitsPerByte = nats / math.Ln2 / float64(bytes)
	out.TokensPerSec = float64(tokens) / elapsed
	return out
}

// EvalSet is one set of held-out samples: data.eval's, or a [[data.sources]] table's eval.
type EvalSet struct {
	Name    string // the source's name; "" for data.eval
	Path    string // as configured
	Samples []Sample
}

// LoadSets reads the held-out sets of cfg's data, n samples each (LoadSamples): data.eval (its
// HeldOut) first, then each source's eval, read in its eval_format with its text_key.
func LoadSets(d config.DataConfig, tok data.Tokenizer, bos int32, seqLen, vocab, n int) ([]EvalSet, error) {
	var sets []EvalSet
	if p := d.HeldOut(); p != "" {
		samples, err := LoadSamples(p, d, tok, bos, seqLen, vocab, n)
		if err != nil {
			return nil, fmt.Errorf("data.eval: %w", err)
		}
		sets = append(sets, EvalSet{Path: p, Samples: samples})
	}
	if len(d.Sources) == 0 {
		return sets, nil
	}
	for i, s := range d.TrainSources() {
		if s.Eval == "" {
			continue
		}
		sd := d
		sd.Format, sd.TextKey, sd.Include = s.EvalFormat, s.TextKey, nil
		if s.EvalFormat == s.Format {
			sd.Include = s.Include
		}
		samples, err := LoadSamples(s.Eval, sd, tok, bos, seqLen, vocab, n)
		if err != nil {
			return nil, fmt.Errorf("data.sources[%d] (%q) eval: %w", i+1, s.Name, err)
		}
		sets = append(sets, EvalSet{Name: s.Name, Path: s.Eval, Samples: samples})
	}
	return sets, nil
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
	// Sources is the result of each [[data.sources]] table's hold-out, when eval evaluated
	// them (no --data); the result above is then data.eval's, or (without it) all their
	// samples together.
	Sources []SourceResult `json:"sources,omitempty"`
}

// SourceResult is one source's part of a Report.
type SourceResult struct {
	Name string `json:"name"`
	Data string `json:"data"` // its eval, as configured
	Result
	Positions *PositionResult `json:"positions,omitempty"`
}

// LoadConfig reads the config file at path (the built-in defaults when path is "") with
// the overrides, without validating it: the model evaluated decides its shape (ValidateEval).
func LoadConfig(path string, sets []string) (config.Config, error) {
	return config.Read(path, sets)
}

// ConfigFor is the config an evaluation of em runs under: cfg with em's model shape. A
// checkpoint evaluated without --config brings its training run's [data] and [eval]
// sections (data.eval, data.format, data.seq_len…) as the defaults that --set overrides. A
// --set of a [model] key is refused for a model that brings its own shape (a checkpoint, a
// Hugging Face directory), where it would be ignored; what names the command (eval, generate).
func ConfigFor(cfg config.Config, em weights.Model, configPath string, sets []string, what string) (config.Config, error) {
	if em.Source != "safetensors" { // whose [model] the config gives; the others bring their own
		for _, o := range sets {
			if k, _, _ := strings.Cut(o, "="); strings.HasPrefix(strings.TrimSpace(k), "model.") {
				return config.Config{}, fmt.Errorf("%s: --set %s: the model's shape comes from %s itself (%s), so a [model] key does not apply to it; only a .safetensors file takes its shape from the config",
					what, o, em.Path, em.Source)
			}
		}
	}
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
