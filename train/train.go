// Package train is distflash's training: the ranks' step (forward, loss, backward, gradient
// exchange or FSDP's reduce-scatter, clipping, AdamW) on the ranks package world builds, the
// data loader (NewLoader), signals that stop after a step or a save with a checkpoint
// (OnSignal), the time limit and how long steps take (Clock), CPU and heap profiles, run
// directories and their locks, checkpoints and resume with its report of what changed,
// --init-from (LoadInitConfig), held-out evaluation and samples on the training ranks, and the
// metrics writers (metrics.jsonl with FLOP/s and MFU, TensorBoard). Run is the train command
// after its flags.
//
// Files by concern: train.go (Run and its options), trainer.go (the ranks and their
// optimizers), step.go (one optimizer step and its statistics; modelfeatures.go: the model's
// side of its one sync, where the model has it), session.go (the loop from the
// first step to the last checkpoint), heldout.go (evaluation and samples during training),
// loader.go, resume.go, rundir.go, initfrom.go, memcheck.go, metrics.go, tboard.go,
// profile.go, clock.go, signal.go.
//
// Layer: train imports config, world (its ranks), evaluate (held-out evaluation on them),
// plan (its memory check, FLOPs per token), ckpt, weights, data, model, optim, parallel,
// kernels, runplot, sysmem and train/tensorboard. Only the command imports it.
package train

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/debug"

	"distflash/config"
	"distflash/world"
)

// Options are train's command-line choices that are not part of the config.
type Options struct {
	Progress  bool   // draw a progress bar (else log lines)
	Resume    string // "", "auto" or a checkpoint path
	Fresh     bool   // start over: move an earlier run in the run directory aside
	StopAfter int    // stop (with a checkpoint) after this step; 0 = run to training.steps
	// initParams, when set (--init-from), replace the initial weights (model Layout order).
	InitParams []float32
	// World, when set, is the launched world the run's ranks are built on (world.Launch: under
	// MPI this process is one rank of a world of processes; only rank 0 prints and writes the
	// run's shared files, every rank writes its checkpoint shard). Nil: a world launched from
	// the config, in-process unless an MPI launcher started the process.
	World *world.World
	// Clock, when set, is kept at the step being trained and how long steps and saves take
	// (for the Ctrl-C message), and holds the time limit (--time-limit). Nil: a clock without
	// a limit.
	Clock *Clock
	// Profile, when set (--profile), is the directory where rank 0 writes Go CPU and heap
	// profiles of the steps ProfileSteps names (first and last, 1-based, of this session's steps)
	// and the per-op table of its work in them (ops.txt, ops.json: profile.go).
	Profile      string
	ProfileSteps [2]int
}

// divergedError ends a run whose loss or gradient norm is not a finite number.
type divergedError struct {
	step           int
	loss, gradNorm float64
	lr             float64
	last           string // the newest checkpoint, or ""
}

// Error says where the run diverged, what to change and what is kept.
func (e *divergedError) Error() string {
	msg := fmt.Sprintf("train: diverged at step %d (loss %g, grad_norm %g, lr %.3g): lower training.lr, raise training.warmup_steps or set training.grad_clip",
		e.step, e.loss, e.gradNorm, e.lr)
	return msg + "; " + kept(e.last)
}

// kept says what a run that an error stopped keeps: its newest checkpoint, last ("" when none
// was saved or resumed from).
func kept(last string) string {
	if last != "" {
		return "the last good checkpoint, " + last + ", is untouched: --resume auto continues from it"
	}
	return "no checkpoint was saved before it: nothing of the run can be resumed"
}

// Run runs the configured number of steps, writing metrics.jsonl, a progress bar and
// checkpoints: every checkpoint.interval steps, and always one of the step where it stops (the
// last step, or where a signal or --stop-after stopped it). A cancelled ctx (Ctrl-C, SIGTERM)
// stops after the current step and saves a checkpoint there. Nothing is written into the run
// directory before the config, the data and the tokenizer are known to be good, and the run
// directory is locked for the run's lifetime (runDirs).
func Run(ctx context.Context, cfg config.Config, stdout, stderr io.Writer, opt Options) error {
	if os.Getenv("GOGC") == "" {
		// A training process's heap is a few large buffers that live for the whole run; the
		// collector's default slack (GOGC=100: the heap may double before a collection) would
		// take as much memory again. 10% keeps the peak near what plan counts, at no speed
		// measurable here (bench/memory.sh). GOGC in the environment wins.
		debug.SetGCPercent(10)
	}
	if opt.World == nil {
		w, err := world.Launch(&cfg, stderr)
		if err != nil {
			return err
		}
		opt.World = w
	}
	leader := opt.World.Leader()
	if !leader {
		stdout, stderr, opt.Progress = io.Discard, io.Discard, false
	}
	r, err := setup(cfg, stderr, opt, leader)
	if r != nil {
		defer r.close()
	}
	if err != nil {
		return err
	}
	r.stdout = stdout
	if err := r.loop(ctx); err != nil {
		return err
	}
	if err := r.finish(); err != nil {
		return err
	}
	return opt.World.CloseComms()
}

// finite reports whether v is a number other than ±Inf.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
