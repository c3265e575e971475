package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"distflash/config"
	"distflash/internal/cli"
	"distflash/train"
	"distflash/world"
)

// runTrain is `distflash train`.
func runTrain(args []string, stdout, stderr io.Writer) error {
	fs := root.Flags("train", stderr)
	configPath := fs.String("config", "", "TOML config file (default: the built-in defaults, which configs/tiny.toml writes out)")
	progress := fs.Bool("progress", cli.IsTerminal(stderr), "show a progress bar on stderr (default: when stderr is a terminal; otherwise a log line every run.log_interval steps)")
	resume := fs.String("resume", "", "continue from a checkpoint: auto (the newest intact one of this run, if any) or a step directory")
	fresh := fs.Bool("fresh", false, "start over in a run directory that holds an earlier run, moving that run aside to <dir>.old-<time> (nothing is deleted)")
	stopAfter := fs.Int("stop-after", 0, "stop after this step, with a checkpoint; 0 = run to training.steps")
	var limit cli.Duration
	fs.Var(&limit, "time-limit", "stop and save before this `duration` has passed since the start (e.g. 3h50m for a 4-hour job), counting the next step and a save; 0 = none")
	profile := fs.String("profile", "", "write Go CPU and heap profiles (pprof) of rank 0 over --profile-steps into this directory")
	profileSteps := fs.String("profile-steps", "3..7", "with --profile: the first and last step profiled, FIRST..LAST, counted from this session's start")
	initFrom := fs.String("init-from", "", "start a new run (step 0) from the weights of a Hugging Face LLaMA directory, a .safetensors file or a distflash checkpoint; [model] and the tokenizer come from it unless the config sets them (see README)")
	var sets cli.Sets
	fs.Var(&sets, "set", "override a config value, e.g. --set training.steps=20 (repeatable)")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if *stopAfter < 0 {
		return fmt.Errorf("train: --stop-after %d: want a step >= 1, or 0 to run to training.steps", *stopAfter)
	}
	timeLimit := time.Duration(limit)
	if timeLimit < 0 {
		return fmt.Errorf("train: --time-limit %s: want a positive duration such as 3h50m, or 0 for none", timeLimit)
	}
	steps, err := train.ParseProfileSteps(*profileSteps)
	if err != nil {
		return fmt.Errorf("train: --profile-steps %q: %w", *profileSteps, err)
	}
	var cfg config.Config
	var initParams []float32
	if *initFrom != "" {
		cfg, initParams, err = train.LoadInitConfig(*configPath, sets, *initFrom, stderr)
	} else {
		cfg, err = config.Load(*configPath, sets)
	}
	if err != nil {
		return err
	}
	if reqs := cfg.Requirements(); len(reqs) > 0 {
		return fmt.Errorf("%s: a valid config, but this build cannot train it; it needs:\n  - %s",
			cfg.Where(strings.Join(reqs, "\n")), strings.Join(reqs, "\n  - "))
	}
	if *fresh && *resume != "" {
		return fmt.Errorf("train: --fresh starts over and --resume %s continues: give one of them", *resume)
	}
	opt := train.Options{Progress: *progress, Resume: *resume, Fresh: *fresh, StopAfter: *stopAfter,
		Clock: train.NewClock(timeLimit), InitParams: initParams, Profile: *profile, ProfileSteps: steps}
	w, err := world.Launch(&cfg, stderr) // after an error main ends the job (MPI_Abort), not MPI_Finalize
	if err != nil {
		return err
	}
	if err := train.CheckMemory(cfg, w); err != nil {
		return err
	}
	opt.World = w
	stopMsg, nowMsg := train.OnSignal(opt.Clock) // only rank 0 says them
	ctx, stop := cli.OnSignal(cli.Interrupt{Stop: cli.Say(stderr, w.Leader(), stopMsg), Exit: cli.Say(stderr, w.Leader(), nowMsg)})
	defer stop()
	if err := train.Run(ctx, cfg, stdout, stderr, opt); err != nil {
		return err
	}
	if err := train.WriteTraffic(w); err != nil {
		return err
	}
	return w.Finalize()
}
