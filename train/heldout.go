package train

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"distflash/config"
	"distflash/data"
	"distflash/evaluate"
	"distflash/world"
)

// Held-out evaluation and samples during training run on the training ranks, with the
// training weights in place: every rank of the world takes part (the same schedule, the same
// FSDP chunks or cast copy, the same devices, in process or over MPI and NCCL), no rank
// gathers the whole model, and rank 0 reports. Their time is said in the log line and written
// to metrics.jsonl (eval_s).

// evaluate runs the held-out evaluation after m's step on every rank and puts its result in
// m: data.eval's, and each source's of a mixture (whose samples together give m's eval_loss
// when data.eval is not set). A stop signal during it skips the result.
func (r *session) evaluate(ctx context.Context, m *Metrics) error {
	start := time.Now()
	main, each, err := r.ev.run(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("train: eval at step %d: %w", m.Step, err)
	}
	m.EvalLoss, m.EvalPerplexity, m.EvalBitsPerByte = main.Loss, main.Perplexity, main.BitsPerByte
	m.EvalSec += time.Since(start).Seconds()
	r.bar.Clear()
	what := ""
	switch sets := r.ev.sets; {
	case sets[0].Name == "" || len(each) == 0:
	case len(sets) == 1:
		what = fmt.Sprintf(" of source %s's samples", sets[0].Name)
	default:
		what = " of the sources' samples together"
	}
	fmt.Fprintf(r.stderr, "eval step %d: loss %.4f  perplexity %.3f  bits/byte %.4f  (%d tokens%s, %.1fs on the training ranks)\n",
		m.Step, main.Loss, main.Perplexity, main.BitsPerByte, main.Tokens, what, time.Since(start).Seconds())
	if len(each) == 0 {
		return nil
	}
	m.EvalSources = map[string]EvalSource{}
	for i, res := range each {
		name := r.ev.sets[len(r.ev.sets)-len(each)+i].Name
		m.EvalSources[name] = EvalSource{Loss: res.Loss, Perplexity: res.Perplexity, BitsPerByte: res.BitsPerByte, Tokens: res.Tokens}
		fmt.Fprintf(r.stderr, "eval step %d: source %s: loss %.4f  perplexity %.3f  bits/byte %.4f  (%d tokens)\n",
			m.Step, name, res.Loss, res.Perplexity, res.BitsPerByte, res.Tokens)
	}
	return nil
}

// sample continues eval.sample_prompt with the weights after m's step on every rank, prints
// the text and has rank 0 append it to the run's samples.jsonl. A stop signal during it skips
// the sample.
func (r *session) sample(ctx context.Context, m *Metrics) error {
	start := time.Now()
	text, err := r.sampler.run(ctx, m.Step, r.leader)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("train: sample at step %d: %w", m.Step, err)
	}
	m.EvalSec += time.Since(start).Seconds()
	r.bar.Clear()
	fmt.Fprintf(r.stderr, "sample step %d: %q (%.1fs)\n", m.Step, r.cfg.Eval.SamplePrompt+text, time.Since(start).Seconds())
	return nil
}

// trainEval is train's held-out evaluation: the samples of data.eval and of each source's eval
// (evaluate.LoadSets), loaded once by every process, and an evaluator on the training ranks.
type trainEval struct {
	ev     *evaluate.Evaluator
	sets   []evaluate.EvalSet
	seqLen int
}

// newTrainEval loads the first eval.samples documents of each held-out set and makes the
// evaluator of the training ranks of w.
func newTrainEval(cfg config.Config, w *world.World) (*trainEval, error) {
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("%s: data.tokenizer: %w", cfg.Origin("data.tokenizer"), err)
	}
	seqLen := evaluate.SeqLen(cfg)
	sets, err := evaluate.LoadSets(cfg.Data, tok, -1, seqLen, cfg.Model.VocabSize, cfg.Eval.Samples)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Origin("data.eval"), err)
	}
	return &trainEval{ev: evaluate.NewEvaluator(w), sets: sets, seqLen: seqLen}, nil
}

// describe says what the evaluation reads, for the run's first lines.
func (e *trainEval) describe() string {
	var parts []string
	for _, s := range e.sets {
		what := data.ShowPath(s.Path)
		if s.Name != "" {
			what = fmt.Sprintf("source %s's %s", s.Name, what)
		}
		parts = append(parts, fmt.Sprintf("%d samples from %s", len(s.Samples), what))
	}
	return strings.Join(parts, ", ")
}

// run evaluates the ranks' current weights on each set. It returns the main result (data.eval's,
// else the sources' samples pooled) and each source's, in the order of the sets.
func (e *trainEval) run(ctx context.Context) (main evaluate.Result, each []evaluate.Result, err error) {
	var all []evaluate.Result
	for _, s := range e.sets {
		r, err := e.ev.Evaluate(ctx, s.Samples, nil)
		if err != nil {
			return main, nil, err
		}
		r.SeqLen = e.seqLen
		all = append(all, r)
	}
	if e.sets[0].Name == "" { // data.eval's
		return all[0], all[1:], nil
	}
	return evaluate.Pool(all...), all, nil
}

// trainSampler is train's text samples: the prompt tokenized once and an evaluator on the
// training ranks.
type trainSampler struct {
	ev     *evaluate.Evaluator
	tok    data.Tokenizer
	prompt []int32
	opt    evaluate.GenOptions
	path   string // samples.jsonl
}

// newTrainSampler tokenizes eval.sample_prompt and makes the evaluator of the training ranks
// of w.
func newTrainSampler(cfg config.Config, w *world.World, runDir string) (*trainSampler, error) {
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("%s: data.tokenizer: %w", cfg.Origin("data.tokenizer"), err)
	}
	prompt := tok.Encode([]byte(cfg.Eval.SamplePrompt))
	if len(prompt) == 0 {
		return nil, fmt.Errorf("%s: eval.sample_prompt is empty: give the text the samples continue", cfg.Origin("eval.sample_prompt"))
	}
	opt := evaluate.GenOptions{MaxNew: cfg.Eval.SampleTokens}
	if sp, ok := tok.(data.SpecialTokens); ok {
		if _, eos := sp.Specials(); eos >= 0 {
			opt.Stop = []int32{eos}
		}
	}
	return &trainSampler{ev: evaluate.NewEvaluator(w), tok: tok, prompt: prompt, opt: opt, path: filepath.Join(runDir, "samples.jsonl")}, nil
}

// run generates from the ranks' current weights and, on the leader, appends the sample of step
// to samples.jsonl; it returns the new text.
func (s *trainSampler) run(ctx context.Context, step int, leader bool) (string, error) {
	g, err := s.ev.Generate(ctx, s.prompt, s.opt, nil)
	if err != nil {
		return "", err
	}
	text := string(s.tok.Decode(g.Tokens))
	if !leader {
		return text, nil
	}
	line, err := json.Marshal(map[string]any{"step": step, "prompt": string(s.tok.Decode(s.prompt)), "text": text, "tokens": g.Tokens})
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(s.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		f.Close()
		return "", err
	}
	return text, f.Close()
}
