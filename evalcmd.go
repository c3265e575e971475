package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"distflash/evaluate"
	"distflash/internal/cli"
	"distflash/runplot"
)

// runEval is `distflash eval`.
func runEval(args []string, stdout, stderr io.Writer) (err error) {
	fs := root.Flags("eval", stderr)
	configPath := fs.String("config", "", "TOML config file: [parallelism], [data] tokenizer and format, [eval] (default: the built-in defaults, as configs/tiny.toml)")
	modelPath := fs.String("model", "", "Hugging Face LLaMA directory, distflash checkpoint directory, or .safetensors file with the config's [model] shape (required)")
	dataPath := fs.String("data", "", "evaluation data: file, directory or glob in data.format (text: one document per file; jsonl, c4: one per line; parquet: one per row) (default: data.eval, and each [[data.sources]] table's eval)")
	samples := fs.Int("samples", 0, "documents evaluated, the first ones in path order (default: eval.samples)")
	seqLen := fs.Int("seq-len", 0, "tokens read per sample at most; longer documents are cut (default: eval.seq_len, else data.seq_len)")
	out := fs.String("out", "", "JSON result file (default: beside the model: <step directory>.eval.json for a checkpoint, <model>.eval.json otherwise)")
	bosFlag := fs.String("bos", "auto", "BOS token prepended to each sample: auto (a Hugging Face model's bos_token_id; none for distflash's own models, which train without one), none, or an id")
	progress := fs.Bool("progress", cli.IsTerminal(stderr), "show a progress bar on stderr (default: when stderr is a terminal)")
	task := fs.String("task", "loss", "loss (loss, perplexity and bits per byte of --data) or passkey (retrieval of a key hidden in filler, Landmark Attention's protocol; no --data)")
	positions := fs.Bool("positions", false, "loss task: also the mean loss by token position, in buckets [0,64), [64,128), [128,256)…")
	window := fs.Int("sliding-window", 0, "loss task: score each sample in windows of this many tokens every --stride tokens, each scoring only its new targets (0: one forward per sample)")
	stride := fs.Int("stride", 0, "loss task: the sliding windows' stride (with --sliding-window; default: a quarter of the window)")
	lengths := fs.String("lengths", "1K,2K,4K", "passkey: sequence lengths in tokens (the prompt and the 10 generated tokens), comma-separated (K = 1024)")
	trials := fs.Int("trials", 20, "passkey: trials per length")
	depthBins := fs.Int("depth-bins", 5, "passkey: depth bins of the accuracy table and heat map")
	seed := fs.Uint64("seed", 1, "passkey: seed of the keys and their depths")
	plotOut := fs.String("plot", "", "also draw the result: FILE.png or FILE.svg (passkey: accuracy by length and depth; --positions: loss by position)")
	var sets cli.Sets
	fs.Var(&sets, "set", "override a config value, e.g. --set parallelism.sequence_parallel_degree=4 (repeatable)")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if err := cli.CheckRanges(fs, "the default", []cli.Range{{Flag: "samples", Want: "at least 1"}, {Flag: "seq-len", Want: "at least 1"},
		{Flag: "trials", Want: "at least 1"}, {Flag: "depth-bins", Want: "at least 1"},
		{Flag: "stride", Want: "at least 1 token", Default: "a quarter of --sliding-window"}}); err != nil {
		return err
	}
	req := evaluate.Request{ConfigPath: *configPath, Sets: sets, Model: *modelPath, Data: *dataPath,
		Samples: *samples, SeqLen: *seqLen, BOS: *bosFlag, Out: *out, Task: *task,
		Scoring: evaluate.EvalOptions{Positions: *positions, Window: *window, Stride: *stride}}
	if *window > 0 && *stride == 0 {
		req.Scoring.Stride = max(*window/4, 1)
	}
	if *plotOut != "" {
		if _, err := runplot.Format(*plotOut); err != nil {
			return fmt.Errorf("eval: --plot: %w", err)
		}
		if *task != "passkey" && !*positions {
			return fmt.Errorf("eval: --plot draws --task passkey or --positions; the loss task alone has one number")
		}
	}
	if *task == "passkey" {
		ls, err := evaluate.ParseLengths(*lengths)
		if err != nil {
			return err
		}
		req.Passkey = evaluate.PasskeyOptions{Lengths: ls, Trials: *trials, DepthBins: *depthBins, Seed: *seed}
	}
	job, err := evaluate.Prepare(req, stderr)
	if err != nil {
		return err
	}
	defer cli.OnSuccess(job.Close, &err) // after a failure main ends the job (MPI_Abort)
	if !job.Leader() {                   // every rank evaluates; rank 0 speaks and writes
		stdout, stderr, *progress = io.Discard, io.Discard, false
		*plotOut = ""
	}
	fmt.Fprintln(stderr, job.Describe())
	intr := cli.Stopping(stderr, "eval", "")
	ctx, stop := cli.OnSignal(intr)
	defer stop()
	// the ranks stop together: where another rank's signal came first, rank 0 says it stops
	defer func() {
		if errors.Is(err, evaluate.ErrStopped) {
			intr.Stop()
		}
	}()
	if job.Req.Task == "passkey" {
		return runPasskey(ctx, job, *plotOut, *progress, stdout, stderr)
	}
	bar := cli.NewBar(stderr, int64(len(job.Samples)), "", false, *progress)
	rep, err := job.Run(ctx, func(done int, loss float64) {
		bar.Describe(fmt.Sprintf("loss %.4f", loss))
		_ = bar.Add(1)
	})
	_ = bar.Finish()
	if err != nil || !job.Leader() {
		return err
	}
	// The result first, so that a file that cannot be written loses nothing.
	fmt.Fprint(stdout, rep.Text(job.Model.Describe()))
	if held := evaluate.Replaces(job.Req.Out, rep); held != "" && !cli.FlagSet(fs, "out") {
		fmt.Fprintf(stderr, "eval: replacing %s, which held %s; --out FILE keeps both\n", job.Req.Out, held)
	}
	if err := evaluate.WriteReport(job.Req.Out, rep); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "eval: wrote %s\n", job.Req.Out)
	if *plotOut != "" {
		if err := evaluate.PlotPositions(*plotOut, []evaluate.Report{rep}, []string{job.Model.Describe()}); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "eval: wrote %s\n", *plotOut)
	}
	return nil
}

// runPasskey runs and reports `eval --task passkey`.
func runPasskey(ctx context.Context, job *evaluate.Job, plotOut string, progress bool, stdout, stderr io.Writer) error {
	p := job.Req.Passkey
	bar := cli.NewBar(stderr, int64(len(p.Lengths)*p.Trials), "", false, progress)
	rep, err := job.RunPasskey(ctx, func(done, total int) { _ = bar.Add(1) })
	_ = bar.Finish()
	if err != nil || !job.Leader() {
		return err
	}
	fmt.Fprint(stdout, rep.Text())
	if err := evaluate.WriteReport(job.Req.Out, rep); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "eval: wrote %s\n", job.Req.Out)
	if plotOut != "" {
		if err := evaluate.PlotPasskey(plotOut, "passkey retrieval: "+job.Model.Describe(), rep.Passkey); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "eval: wrote %s\n", plotOut)
	}
	return nil
}
