package train

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
// m. A stop signal during it skips the result.
func (r *session) evaluate(ctx context.Context, m *Metrics) error {
	start := time.Now()
	res, err := r.ev.run(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("train: eval at step %d: %w", m.Step, err)
	}
	m.EvalLoss, m.EvalPerplexity, m.EvalBitsPerByte = res.Loss, res.Perplexity, res.BitsPerByte
	m.EvalSec += time.Since(start).Seconds()
	r.bar.Clear()
	fmt.Fprintf(r.stderr, "eval step %d: loss %.4f  perplexity %.3f  bits/byte %.4f  (%d tokens, %.1fs on the training ranks)\n",
		m.Step, res.Loss, res.Perplexity, res.BitsPerByte, res.Tokens, time.Since(start).Seconds())
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

// trainEval is train's held-out evaluation: the samples of data.eval, loaded once by every
// process, and an evaluator on the training ranks.
type trainEval struct {
	ev      *evaluate.Evaluator
	samples []evaluate.Sample
	seqLen  int
}

// newTrainEval loads data.eval's first eval.samples documents and makes the evaluator of the
// training ranks of w.
func newTrainEval(cfg config.Config, w *world.World) (*trainEval, error) {
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("%s: data.tokenizer: %w", cfg.Origin("data.tokenizer"), err)
	}
	seqLen := evaluate.SeqLen(cfg)
	samples, err := evaluate.LoadSamples(cfg.Data.Eval, cfg.Data, tok, -1, seqLen, cfg.Model.VocabSize, cfg.Eval.Samples)
	if err != nil {
		return nil, fmt.Errorf("%s: data.eval: %w", cfg.Origin("data.eval"), err)
	}
	return &trainEval{ev: evaluate.NewEvaluator(w), samples: samples, seqLen: seqLen}, nil
}

// run evaluates the ranks' current weights on the samples.
func (e *trainEval) run(ctx context.Context) (evaluate.Result, error) {
	r, err := e.ev.Evaluate(ctx, e.samples, nil)
	r.SeqLen = e.seqLen
	return r, err
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
