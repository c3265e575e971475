package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"distflash/data"
	"distflash/kernels"
	"distflash/model"
	"distflash/optim"
	"distflash/parallel"
)

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
}

// runTrain is `distflash train`.
func runTrain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "configs/tiny.toml", "TOML config file")
	progress := fs.Bool("progress", isTerminal(stderr), "show a progress bar on stderr (default: when stderr is a terminal; otherwise a log line every run.log_interval steps)")
	var sets setFlags
	fs.Var(&sets, "set", "override a config value, e.g. --set training.steps=20 (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("train: unexpected arguments %q", fs.Args())
	}
	cfg, err := LoadConfig(*configPath, sets)
	if err != nil {
		return err
	}
	if reqs := cfg.Requirements(); len(reqs) > 0 {
		return fmt.Errorf("%s is a valid config, but this build trains in fp32 on the CPU, with in-process sequence-parallel ranks, and this config needs:\n  - %s",
			cfg.Path, strings.Join(reqs, "\n  - "))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return train(ctx, cfg, stdout, stderr, *progress)
}

// trainer holds the pieces of a run: the data, the schedule, and one rank per
// sequence-parallel worker, each with its own backend, model replica and optimizer. Ranks hold
// identical parameters: they start from the same initialisation and apply the same update to
// the same all-reduced gradients.
type trainer struct {
	cfg    Config
	sched  optim.Schedule
	loader *data.Loader
	world  *parallel.World
	ranks  []*rank
}

// rank is one worker's state.
type rank struct {
	be    kernels.Backend
	model *model.Model
	opt   *optim.AdamW
	pos   []int32 // global positions of this rank's tokens in every sequence
}

func newTrainer(cfg Config, stderr io.Writer) (*trainer, error) {
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("%s: data.tokenizer: %w", cfg.Path, err)
	}
	path, err := data.ExpandPath(cfg.Data.Train)
	if err != nil {
		return nil, fmt.Errorf("%s: data.train = %q: %w", cfg.Path, cfg.Data.Train, err)
	}
	start := time.Now()
	tokens, err := data.LoadTokens(data.Source{Path: path, Format: cfg.Data.Format, Include: cfg.Data.Include,
		MaxBytes: cfg.Data.MaxBytes, Seed: cfg.Run.Seed}, tok)
	if err != nil {
		return nil, fmt.Errorf("%s: data.train: %w", cfg.Path, err)
	}
	fmt.Fprintf(stderr, "data: %d tokens from %s (%s tokenizer) in %.1fs\n", len(tokens), path, tok.Name(), time.Since(start).Seconds())
	loader, err := data.NewLoader(tokens, cfg.Data.SeqLen, cfg.Data.BatchSize, cfg.Run.Seed)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	policy, err := model.ParseCheckpoint(cfg.Checkpoint.Activation)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	t := cfg.Training
	sched := optim.Schedule{Kind: t.LRSchedule, LR: t.LR, MinLR: t.MinLR, Warmup: t.WarmupSteps, Steps: t.Steps}
	if err := sched.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	P := cfg.Parallelism.SequenceParallelDegree
	layout, err := parallel.LayoutOf(cfg.Parallelism.Attention)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	tr := &trainer{cfg: cfg, sched: sched, loader: loader, world: parallel.NewWorld(P)}
	params0 := model.InitParams(cfg.Model, model.NewLayout(cfg.Model), cfg.Run.Seed)
	for r := 0; r < P; r++ {
		be := kernels.NewCPU()
		m := model.New(cfg.Model, policy, be)
		m.LoadParams(params0)
		if P > 1 {
			a, err := parallel.NewAttention(cfg.Parallelism.Attention, tr.world.Comm(r), be,
				parallel.Options{Overlap: cfg.Parallelism.OverlapComm})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", cfg.Path, err)
			}
			m.Attn = a
		}
		pos, err := layout.Positions(cfg.Data.SeqLen, P, r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.Path, err)
		}
		opt := optim.NewAdamW(be, m.Layout.Size, segments(m.Layout),
			optim.Hyper{Beta1: t.Beta1, Beta2: t.Beta2, Eps: t.Eps, WeightDecay: t.WeightDecay})
		tr.ranks = append(tr.ranks, &rank{be: be, model: m, opt: opt, pos: pos})
	}
	return tr, nil
}

// segments groups consecutive tensors of the layout that share a weight-decay setting.
func segments(l model.Layout) []optim.Segment {
	var segs []optim.Segment
	for _, t := range l.Tensors {
		if n := len(segs); n > 0 && segs[n-1].Decay == t.Decay && segs[n-1].Off+segs[n-1].N == t.Off {
			segs[n-1].N += t.Size()
			continue
		}
		segs = append(segs, optim.Segment{Off: t.Off, N: t.Size(), Decay: t.Decay})
	}
	return segs
}

// step runs one optimizer step (grad_accum_steps micro-batches) on every rank and returns its
// metrics. Each rank computes the loss and gradients of its tokens of every sequence; the
// gradients are summed across ranks (dscale makes the sum the global mean's gradient), and
// every rank applies the same update.
func (t *trainer) step(step int) (Metrics, error) {
	cfg := t.cfg
	accum := cfg.Training.GradAccumSteps
	B, T := cfg.Data.BatchSize, cfg.Data.SeqLen
	dscale := float32(1 / float64(B*T*accum))
	batches := make([]data.Batch, accum)
	for a := range batches {
		batches[a] = t.loader.Next()
	}
	lr := t.sched.At(step)
	losses := make([]float64, len(t.ranks))
	counts := make([]int, len(t.ranks))
	var norm float64
	err := t.world.Run(func(c parallel.Comm) error {
		r := t.ranks[c.Rank()]
		m := r.model
		m.ZeroGrads()
		for _, b := range batches {
			ids := parallel.Shard(b.Inputs, B, T, 1, r.pos)
			tg := parallel.Shard(b.Targets, B, T, 1, r.pos)
			l, n := m.ForwardBackward(ids, tg, B, r.pos, dscale)
			losses[c.Rank()] += l
			counts[c.Rank()] += n
		}
		if c.Size() > 1 {
			c.AllReduce(m.Grads.Flat, "grad.allreduce")
		}
		g := optim.GradNorm(r.be, m.Grads.Flat)
		if c.Rank() == 0 {
			norm = g
		}
		r.opt.Update(m.Params.Flat, m.Grads.Flat, lr, optim.ClipScale(g, cfg.Training.GradClip))
		return nil
	})
	if err != nil {
		return Metrics{}, fmt.Errorf("train: step %d: %w", step+1, err)
	}
	var lossSum float64
	var count int
	for i := range losses {
		lossSum += losses[i]
		count += counts[i]
	}
	return Metrics{Step: step + 1, Loss: lossSum / float64(count), LR: lr, GradNorm: norm, Tokens: int64(count),
		AttnForwards: t.ranks[0].model.Stats.AttnForwards}, nil
}

// train runs the configured number of steps, writing metrics.jsonl and a progress bar; a
// cancelled ctx (Ctrl-C, SIGTERM) stops after the current step.
func train(ctx context.Context, cfg Config, stdout, stderr io.Writer, showProgress bool) error {
	runDir := filepath.Join(cfg.Run.OutputDir, cfg.Run.Name)
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return fmt.Errorf("train: create run directory: %w", err)
	}
	resolved, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fmt.Errorf("train: encode config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(runDir, "config.json"), append(resolved, '\n'), 0o644); err != nil {
		return fmt.Errorf("train: write config: %w", err)
	}
	fmt.Fprintf(stderr, "%s\n", cfg.Summary())
	t, err := newTrainer(cfg, stderr)
	if err != nil {
		return err
	}
	metricsPath := filepath.Join(runDir, "metrics.jsonl")
	mf, err := os.Create(metricsPath)
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	defer mf.Close()
	enc := json.NewEncoder(mf) // one write per step, so a reader tailing the file sees every step at once

	steps := cfg.Training.Steps
	bar := progressbar.NewOptions(steps,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetVisibility(showProgress),
		progressbar.OptionSetWidth(24),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish())
	start := time.Now()
	var tokens int64
	var first, last Metrics
	done := 0
	for s := 0; s < steps; s++ {
		if ctx.Err() != nil {
			break
		}
		stepStart := time.Now()
		m, err := t.step(s)
		if err != nil {
			return err
		}
		tokens += m.Tokens
		m.ElapsedSec = time.Since(start).Seconds()
		m.TokensPerSec = float64(m.Tokens) / time.Since(stepStart).Seconds()
		m.Tokens = tokens
		if math.IsNaN(m.Loss) || math.IsInf(m.Loss, 0) {
			return fmt.Errorf("train: loss is %v at step %d (lr %g, grad norm %g): lower training.lr or check the data", m.Loss, m.Step, m.LR, m.GradNorm)
		}
		if err := enc.Encode(m); err != nil {
			return fmt.Errorf("train: write %s: %w", metricsPath, err)
		}
		if s == 0 {
			first = m
		}
		last, done = m, s+1
		bar.Describe(fmt.Sprintf("loss %.4f  lr %.2e  %.0f tok/s", m.Loss, m.LR, float64(tokens)/m.ElapsedSec))
		_ = bar.Add(1)
		if !showProgress && cfg.Run.LogInterval > 0 && (m.Step%cfg.Run.LogInterval == 0 || m.Step == steps) {
			fmt.Fprintf(stderr, "step %d/%d  loss %.4f  lr %.2e  grad_norm %.3f  %.0f tok/s\n", m.Step, steps, m.Loss, m.LR, m.GradNorm, m.TokensPerSec)
		}
	}
	_ = bar.Finish()
	if err := mf.Close(); err != nil {
		return fmt.Errorf("train: write %s: %w", metricsPath, err)
	}
	elapsed := time.Since(start).Seconds()
	if done < steps {
		fmt.Fprintf(stdout, "interrupted after step %d of %d; metrics in %s\n", done, steps, metricsPath)
		return nil
	}
	fmt.Fprintf(stdout, "trained %d steps in %.1fs (%.0f tokens/s): loss %.4f -> %.4f (ln vocab = %.4f); metrics in %s\n",
		done, elapsed, float64(tokens)/elapsed, first.Loss, last.Loss, math.Log(float64(cfg.Model.VocabSize)), metricsPath)
	return nil
}

// isTerminal reports whether w is a terminal, where a progress bar that redraws itself belongs.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
