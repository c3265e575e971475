package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"distflash/ckpt"
	"distflash/config"
	"distflash/data"
	"distflash/evaluate"
	"distflash/kernels"
	"distflash/parallel/transport"
	"distflash/plan"
	"distflash/runplot"
)

// session is one training run in progress: the trainer, its directories and metrics file,
// and what the loop has done so far.
type session struct {
	cfg            config.Config
	opt            Options
	leader         bool
	stdout, stderr io.Writer
	t              *trainer
	dirs           *runDirs
	ev             *trainEval    // the evaluation every eval.interval steps, on the training ranks
	sampler        *trainSampler // samples of text every eval.sample_interval steps, on the training ranks
	mf             *metricsFile
	metricsPath    string
	st             trainState // where the run started (a resumed checkpoint's step, else 0)
	bar            *progressbar.ProgressBar
	start          time.Time
	tokens         int64
	first, last    Metrics
	done, saved    int    // steps done, and the step of the newest checkpoint
	lastPath       string // the newest checkpoint this process saved or resumed from
	end            int    // the step to stop after (training.steps or --stop-after)
	dirsOpen       bool
	clock          *Clock
	flopsPerToken  float64   // plan.FLOPsPerToken of the model at data.seq_len
	peak           float64   // FLOP/s of all devices together; 0: not known
	recent         []float64 // the losses of the last runplot.LastSteps steps
	prof           *profiler // --profile, rank 0; nil: none
	tb             *tbLog    // run.tensorboard, rank 0; nil: none
}

// setup builds the trainer and the run's directory, metrics file and evaluation, resuming
// from a checkpoint when asked: everything before the first step. Rank 0 (leader) owns the
// directory; the other MPI ranks wait for it.
func setup(cfg config.Config, stderr io.Writer, opt Options, leader bool) (*session, error) {
	dirs := runDirsOf(cfg)
	if leader {
		if err := dirs.checkInUse(); err != nil {
			return nil, err
		}
	}
	if leader && opt.Resume == "" && !opt.Fresh {
		if err := dirs.checkFresh(); err != nil { // early, before the data is read; open checks again under the lock
			return nil, err
		}
	}
	fmt.Fprintf(stderr, "%s\n", cfg.Summary())
	for _, n := range cfg.Notes() {
		fmt.Fprintf(stderr, "note: %s\n", n)
	}
	w := opt.World
	if w.MPI() {
		fmt.Fprintf(stderr, "mpi: %d processes; %s\n", w.Dims.World, transport.MPIInfo())
	}
	t, err := newTrainerOn(cfg, stderr, w)
	if err != nil {
		return nil, err
	}
	if opt.InitParams != nil {
		if err := t.loadWeights(opt.InitParams); err != nil {
			return nil, err
		}
	}
	r := &session{cfg: cfg, opt: opt, leader: leader, stderr: stderr, t: t, dirs: dirs}
	if leader && t.warmed != "" {
		fmt.Fprintf(stderr, "%s\n", t.warmed)
	}
	if cfg.Eval.Interval > 0 {
		if r.ev, err = newTrainEval(cfg, w); err != nil {
			return nil, err
		}
		fmt.Fprintf(stderr, "eval: %s, of up to %d tokens, every %d steps\n", r.ev.describe(), evaluate.SeqLen(cfg), cfg.Eval.Interval)
	}
	if cfg.Eval.SampleInterval > 0 {
		if r.sampler, err = newTrainSampler(cfg, w, dirs.run); err != nil {
			return nil, err
		}
	}
	if leader {
		if err := dirs.open(cfg, opt.Resume, opt.Fresh, stderr); err != nil {
			return nil, err
		}
		r.dirsOpen = true
	}
	if w.MPI() {
		w.Boot().Barrier() // rank 0 has prepared the run directory
		if !leader {
			if dirs.id, _, err = ckpt.ReadRunID(dirs.run); err != nil {
				return r, err
			}
		}
	}
	t.id = dirs.id
	if opt.Resume != "" {
		if r.st, _, err = t.restore(opt.Resume, dirs.id, stderr); err != nil {
			return r, err
		}
	}
	if t.trace, err = openTrace(t, cfg, r.st.Step, leader); err != nil {
		return r, err
	}
	r.metricsPath = filepath.Join(dirs.run, "metrics.jsonl")
	if leader {
		if r.mf, err = openMetrics(r.metricsPath, r.st.Step); err != nil {
			return r, err
		}
		if cfg.Run.TensorBoard {
			if r.tb, err = openTB(dirs.run, stderr); err != nil {
				return r, err
			}
		}
	}
	steps := cfg.Training.Steps
	r.end = steps
	if opt.StopAfter > 0 && opt.StopAfter < steps {
		r.end = opt.StopAfter
	}
	r.bar = progressbar.NewOptions(steps,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetVisibility(opt.Progress),
		progressbar.OptionSetWidth(24),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish())
	_ = r.bar.Set(r.st.Step)
	r.start, r.tokens = time.Now(), r.st.Tokens
	r.clock = opt.Clock
	if r.clock == nil {
		r.clock = NewClock(0)
	}
	r.clock.last.Store(int64(r.st.Step)) // the checkpoint resumed from, or 0
	r.clock.guessSave(int64(len(StateTensors)) * 4 * int64(t.ranks[0].Model.Layout.Size))
	r.flopsPerToken = plan.FLOPsPerToken(cfg.Model, cfg.Data.SeqLen)
	r.peak = peakFLOPS(cfg, t.w)
	if opt.Profile != "" && leader {
		r.prof = &profiler{dir: opt.Profile, from: r.st.Step + opt.ProfileSteps[0], to: r.st.Step + opt.ProfileSteps[1], rank: t.ranks[0]}
	}
	r.done, r.saved = r.st.Step, r.st.Step
	if r.st.Step > 0 {
		r.lastPath = filepath.Join(t.runDir(), ckpt.StepDir(r.st.Step))
	}
	return r, nil
}

// close releases the metrics file and the run directory's lock.
func (r *session) close() {
	r.mf.close()
	r.tb.close()
	r.t.trace.close()
	if r.dirsOpen {
		r.dirs.close()
	}
}

// checkpoint saves the state after step and says where and how large.
func (r *session) checkpoint(step int) error {
	began := time.Now()
	t := r.t
	r.clock.saving.Store(int64(step))
	path, err := t.save(trainState{Step: step, Tokens: r.tokens, Elapsed: r.st.Elapsed + time.Since(r.start).Seconds()}, r.lastPath, r.stderr)
	if err != nil {
		r.clock.saving.Store(0)
		return err
	}
	r.clock.saved(step, time.Since(began)) // before the save ends, for the messages of a signal between the two
	r.clock.saving.Store(0)
	r.saved, r.lastPath = step, path
	r.bar.Clear()
	raw, stored := checkpointSize(path, t.ranks[0].Model.Layout.Size)
	fmt.Fprintf(r.stderr, "checkpoint: step %d saved to %s (%.1f MB of fp32 state in %.1f MB, ratio %.3f, %.0f MB/s)\n",
		step, path, float64(raw)/1e6, float64(stored)/1e6, float64(raw)/float64(max(stored, 1)), float64(raw)/1e6/time.Since(began).Seconds())
	return nil
}

// loop trains from the start step to the end, or until a signal on any rank or the time limit
// stops it after a step, saving checkpoints every checkpoint.interval steps.
func (r *session) loop(ctx context.Context) error {
	t, cfg, steps, clock := r.t, r.cfg, r.cfg.Training.Steps, r.clock
	t.stopRequested = func() bool { return ctx.Err() != nil || clock.overLimit() }
	defer r.prof.stop(r.stderr)
	for s := r.st.Step; s < r.end; s++ {
		if err := r.prof.begin(s+1, r.stderr); err != nil {
			return err
		}
		clock.begin(s + 1)
		stepStart := time.Now()
		m, err := t.step(s)
		if err != nil {
			return err
		}
		clock.end()
		r.prof.end(s+1, r.stderr)
		r.tokens += m.Tokens
		m.ElapsedSec = r.st.Elapsed + time.Since(r.start).Seconds()
		m.TokensPerSec = float64(m.Tokens) / time.Since(stepStart).Seconds()
		m.FLOPsPerSec = m.TokensPerSec * r.flopsPerToken
		if r.peak > 0 {
			m.MFU = m.FLOPsPerSec / r.peak
		}
		m.Tokens = r.tokens
		if m.diverged || !finite(m.Loss) || !finite(m.GradNorm) && !m.Skipped {
			r.bar.Clear()
			if r.mf != nil {
				_ = r.mf.write(m) // the diverged step, with null for what is not a number
			}
			return &divergedError{step: m.Step, loss: m.Loss, gradNorm: m.GradNorm, lr: m.LR, last: r.lastPath}
		}
		if m.LossSpike || m.GradNormSpike {
			r.bar.Clear()
			fmt.Fprintf(r.stderr, "%s\n", m.spike.message(m, cfg.Data.SeqLen))
		}
		for _, i := range m.ranOut {
			r.bar.Clear()
			name, w := t.loader.Names()[i], t.loader.Windows()[i]
			fmt.Fprintf(r.stderr, "data: source %s ran out at step %d: its %d windows of %d tokens are all drawn, and it is read again in a new order (epochs counted in metrics.jsonl's source_epochs)\n",
				name, m.Step, w, cfg.Data.SeqLen)
		}
		if m.Skipped {
			r.bar.Clear()
			fmt.Fprintf(r.stderr, "step %d: fp16 gradients overflowed at loss scale %g: update skipped, scale now %g\n",
				m.Step, m.LossScale, t.scaler.Scale)
		}
		if cfg.Eval.Interval > 0 && (m.Step%cfg.Eval.Interval == 0 || m.Step == steps) {
			if err := r.evaluate(ctx, &m); err != nil {
				return err
			}
		}
		if k := cfg.Eval.SampleInterval; k > 0 && (m.Step%k == 0 || m.Step == steps) {
			if err := r.sample(ctx, &m); err != nil {
				return err
			}
		}
		if r.mf != nil {
			if err := r.mf.write(m); err != nil {
				return r.metricsFailed(m.Step, err)
			}
		}
		r.tb.write(m)
		if r.first.Step == 0 {
			r.first = m
			r.attentionPaths() // which path the first step's attention blocks took
		}
		r.last, r.done = m, s+1
		if r.recent = append(r.recent, m.Loss); len(r.recent) > runplot.LastSteps {
			r.recent = r.recent[1:]
		}
		r.bar.Describe(fmt.Sprintf("loss %.4f  lr %.2e  %.0f tok/s%s", m.Loss, m.LR, float64(r.tokens-r.st.Tokens)/time.Since(r.start).Seconds(), mfuText(m)))
		_ = r.bar.Add(1)
		if !r.opt.Progress && cfg.Run.LogInterval > 0 && (m.Step%cfg.Run.LogInterval == 0 || m.Step == steps) {
			fmt.Fprintf(r.stderr, "%s\n", r.logLine(m))
		}
		if m.stop { // a signal on any rank, or the time limit: every rank stops after this step
			if clock.limited.Load() {
				r.bar.Clear()
				fmt.Fprintf(r.stderr, "time limit %s: stopping after step %d, %s into the run, and saving (a step takes about %s, a save about %s)\n",
					Duration(clock.limit), m.Step, Duration(time.Since(clock.started)), Duration(time.Duration(clock.stepNS.Load())), Duration(time.Duration(clock.saveNS.Load())))
			}
			break
		}
		if k := cfg.Checkpoint.Interval; k > 0 && m.Step%k == 0 && m.Step < r.end {
			if err := r.checkpoint(m.Step); err != nil {
				return err
			}
			if t.anyStop(ctx.Err() != nil) { // a signal during the save: stop here, it is saved
				break
			}
		}
	}
	_ = r.bar.Finish()
	return nil
}

// metricsFailed stops the run after step, whose line of metrics.jsonl could not be written
// (err). When every rank is in this process, the state after step is saved first, where
// checkpoint.dir puts it (another disk may have room), so that --resume auto continues from
// it; a save that fails too is said. Over MPI the other processes are in the next step
// already, and cannot join a save: the run keeps its last checkpoint.
func (r *session) metricsFailed(step int, err error) error {
	var me *metricsError
	if !errors.As(err, &me) {
		return err
	}
	r.bar.Clear()
	if r.t.w.MPI() {
		return me.explain(fmt.Sprintf("%s (over MPI the other ranks cannot join a save of step %d)", kept(r.lastPath), step))
	}
	if serr := r.checkpoint(step); serr != nil {
		return fmt.Errorf("%w\n  saving step %d first failed too, so %s: %w", me.explain(""), step, kept(r.lastPath), serr)
	}
	return me.explain(fmt.Sprintf("step %d was saved first, to %s: --resume auto continues from it (without step %d's line)", step, r.lastPath, step))
}

// logLine is the log line of step m without a progress bar: the step's numbers, the time the
// run has taken (this session and any it resumed) and the time left at this session's mean
// step time.
func (r *session) logLine(m Metrics) string {
	line := fmt.Sprintf("step %d/%d  loss %.4f  lr %.2e  grad_norm %.3f  %.0f tok/s  %s%s  elapsed %s",
		m.Step, r.cfg.Training.Steps, m.Loss, m.LR, m.GradNorm, m.TokensPerSec, flopsText(m.FLOPsPerSec), mfuText(m), Duration(time.Duration(m.ElapsedSec*1e9)))
	if left := r.end - m.Step; left > 0 {
		line += "  eta " + Duration(time.Duration(left)*time.Duration(r.clock.stepNS.Load()))
	}
	return line
}

// flopsText writes a FLOP/s figure with its SI prefix: "3.2 GFLOP/s".
func flopsText(f float64) string {
	for _, u := range []struct {
		v float64
		p string
	}{{1e15, "P"}, {1e12, "T"}, {1e9, "G"}, {1e6, "M"}} {
		if f >= u.v {
			return fmt.Sprintf("%.3g %sFLOP/s", f/u.v, u.p)
		}
	}
	return fmt.Sprintf("%.3g FLOP/s", f)
}

// mfuText is "  mfu 14.8%" when the peak is known, else "".
func mfuText(m Metrics) string {
	if m.MFU <= 0 {
		return ""
	}
	return fmt.Sprintf("  mfu %.1f%%", 100*m.MFU)
}

// meanRecent is the mean loss of the last runplot.LastSteps steps (fewer when fewer ran).
func (r *session) meanRecent() float64 {
	sum := 0.0
	for _, l := range r.recent {
		sum += l
	}
	return sum / float64(max(len(r.recent), 1))
}

// finish ends the run: a checkpoint of the step where it stopped (the last step, or where a
// signal or --stop-after stopped it, so that the model is kept and --resume auto continues
// from here), the metrics file closed, the run's picture, and what was done.
func (r *session) finish() error {
	t, cfg, steps, stdout := r.t, r.cfg, r.cfg.Training.Steps, r.stdout
	if r.done > r.saved {
		if err := r.checkpoint(r.done); err != nil {
			return err
		}
	}
	if err := r.mf.close(); err != nil {
		return err
	}
	if r.leader && r.done > r.st.Step {
		png := filepath.Join(r.dirs.run, "metrics.png")
		if err := runplot.WriteRun(r.dirs.run, png); err != nil { // the run is saved: a picture that fails is only said
			fmt.Fprintf(r.stderr, "plot: %v\n", err)
		} else {
			fmt.Fprintf(r.stderr, "plot: %s\n", png)
		}
	}
	elapsed := time.Since(r.start).Seconds()
	spikes := t.spikes.summary(skipRuleOf(cfg.Training)) // "" or "; spikes: ..."
	switch {
	case r.done < steps:
		fmt.Fprintf(stdout, "stopped after step %d of %d; checkpoint in %s; continue with --resume auto; metrics in %s%s\n",
			r.done, steps, r.lastPath, r.metricsPath, spikes)
	case r.first.Step == 0:
		fmt.Fprintf(stdout, "nothing to train: the checkpoint is at step %d of %d\n", r.done, steps)
	default:
		end := fmt.Sprintf("%.4f", r.last.Loss)
		if len(r.recent) > 1 {
			end = fmt.Sprintf("%.4f (mean of the last %d steps; the last step's %.4f)", r.meanRecent(), len(r.recent), r.last.Loss)
		}
		fmt.Fprintf(stdout, "trained %d steps in %.1fs (%.0f tokens/s): loss %.4f -> %s (ln vocab = %.4f); model in %s; metrics in %s%s\n",
			r.done-r.st.Step, elapsed, float64(r.tokens-r.st.Tokens)/elapsed, r.first.Loss, end, math.Log(float64(cfg.Model.VocabSize)), r.lastPath, r.metricsPath, spikes)
	}
	if len(cfg.Data.Sources) > 0 && r.first.Step != 0 {
		fmt.Fprintf(stdout, "%s\n", sourcesSeen(t.loader, int64(cfg.Data.SeqLen)))
	}
	if t.scaler != nil && t.scaler.Skipped > 0 {
		fmt.Fprintf(stdout, "fp16: %d steps skipped for overflowing gradients; loss scale now %g\n", t.scaler.Skipped, t.scaler.Scale)
	}
	writeMemory(stdout, r.last.Memory)
	r.attentionPaths()
	return nil
}

// attentionPaths says, on a GPU whose attention blocks have paths (cuDNN's fused attention or
// the own kernel: device.attention), which blocks of the leader's rank took which, so far.
func (r *session) attentionPaths() {
	if !r.leader {
		return
	}
	if ar, ok := r.t.ranks[0].Backend.(kernels.AttentionRouter); ok {
		r.bar.Clear()
		fmt.Fprintf(r.stderr, "%s\n", ar.AttentionPaths())
	}
}

// sourcesSeen is the end of a run's account of a mixture: the tokens each source has given the
// run (of seqLen each sequence), their share against the source's weight, and the epochs of it.
func sourcesSeen(mix *data.Mixture, seqLen int64) string {
	drawn, total := mix.Drawn(), int64(0)
	for _, d := range drawn {
		total += d
	}
	var parts []string
	for i, name := range mix.Names() {
		parts = append(parts, fmt.Sprintf("%s %s (%.1f%%, weight %.1f%%; %.2f epochs)", name, data.Count(drawn[i]*seqLen),
			100*float64(drawn[i])/float64(max(total, 1)), 100*mix.Weights()[i], float64(drawn[i])/float64(mix.Windows()[i])))
	}
	return "data: tokens per source so far: " + strings.Join(parts, ", ")
}
