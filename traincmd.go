package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"sync/atomic"

	"distflash/config"
	"distflash/parallel"
	"distflash/train"
)

// runTrain is `distflash train`.
func runTrain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "TOML config file (default: the built-in defaults, which configs/tiny.toml writes out)")
	progress := fs.Bool("progress", isTerminal(stderr), "show a progress bar on stderr (default: when stderr is a terminal; otherwise a log line every run.log_interval steps)")
	resume := fs.String("resume", "", "continue from a checkpoint: auto (the newest intact one of this run, if any) or a step directory")
	fresh := fs.Bool("fresh", false, "start over in a run directory that holds an earlier run, moving that run aside to <dir>.old-<time> (nothing is deleted)")
	stopAfter := fs.Int("stop-after", 0, "stop after this step, with a checkpoint (for jobs with a time limit); 0 = run to training.steps")
	initFrom := fs.String("init-from", "", "start a new run (step 0) from the weights of a Hugging Face LLaMA directory, a .safetensors file or a distflash checkpoint; [model] and the tokenizer come from it unless the config sets them (see README)")
	var sets setFlags
	fs.Var(&sets, "set", "override a config value, e.g. --set training.steps=20 (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("train: unexpected arguments %q", fs.Args())
	}
	var cfg config.Config
	var initParams []float32
	var err error
	if *initFrom != "" {
		cfg, initParams, err = train.LoadInitConfig(*configPath, sets, *initFrom, stderr)
	} else {
		cfg, err = config.Load(*configPath, sets)
	}
	if err != nil {
		return err
	}
	if reqs := cfg.Requirements(); len(reqs) > 0 {
		return fmt.Errorf("%s is a valid config, but this build cannot train it; it needs:\n  - %s",
			cfg.Path, strings.Join(reqs, "\n  - "))
	}
	if err := train.CheckMemory(cfg); err != nil {
		return err
	}
	if *fresh && *resume != "" {
		return fmt.Errorf("train: --fresh starts over and --resume %s continues: give one of them", *resume)
	}
	opt := train.Options{Progress: *progress, Resume: *resume, Fresh: *fresh, StopAfter: *stopAfter,
		Current: new(atomic.Int64), InitParams: initParams}
	comm, err := train.Launch(&cfg, stderr)
	if err != nil {
		return err
	}
	if comm != nil {
		opt.Comm = comm
		defer parallel.FinalizeMPI()
	}
	ctx, stop := train.OnSignal(stderr, opt.Current, comm == nil || comm.Rank() == 0)
	defer stop()
	if err := train.Run(ctx, cfg, stdout, stderr, opt); err != nil {
		return err
	}
	return train.WriteTraffic(comm)
}
