package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"distflash/evaluate"
)

// runEval is `distflash eval`.
func runEval(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("eval", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "TOML config file: [parallelism], [data] tokenizer and format, [eval] (default: the built-in defaults, as configs/tiny.toml)")
	modelPath := fs.String("model", "", "Hugging Face LLaMA directory, distflash checkpoint directory, or .safetensors file with the config's [model] shape (required)")
	dataPath := fs.String("data", "", "evaluation data: file, directory or glob in data.format (text: one document per file; jsonl, c4: one per line) (default: data.eval)")
	samples := fs.Int("samples", 0, "documents evaluated, the first ones in path order (default: eval.samples)")
	seqLen := fs.Int("seq-len", 0, "tokens read per sample at most; longer documents are cut (default: eval.seq_len, else data.seq_len)")
	out := fs.String("out", "", "JSON result file (default: beside the model: <step directory>.eval.json for a checkpoint, <model>.eval.json otherwise)")
	bosFlag := fs.String("bos", "auto", "BOS token prepended to each sample: auto (a Hugging Face model's bos_token_id; none for distflash's own models, which train without one), none, or an id")
	progress := fs.Bool("progress", isTerminal(stderr), "show a progress bar on stderr (default: when stderr is a terminal)")
	var sets setFlags
	fs.Var(&sets, "set", "override a config value, e.g. --set parallelism.sequence_parallel_degree=4 (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("eval: unexpected arguments %q", fs.Args())
	}
	job, err := evaluate.Prepare(evaluate.Request{ConfigPath: *configPath, Sets: sets, Model: *modelPath, Data: *dataPath,
		Samples: *samples, SeqLen: *seqLen, BOS: *bosFlag, Out: *out}, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintln(stderr, job.Describe())
	bar := newBar(stderr, int64(len(job.Samples)), "", false, *progress)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := job.Run(ctx, func(done int, loss float64) {
		bar.Describe(fmt.Sprintf("loss %.4f", loss))
		_ = bar.Add(1)
	})
	_ = bar.Finish()
	if err != nil {
		return err
	}
	// The result first, so that a file that cannot be written loses nothing.
	res := rep.Result
	fmt.Fprintf(stdout, "eval: %s: loss %.6f  perplexity %.4f  bits/byte %.4f  over %d tokens (%d bytes) of %d samples in %.1fs (%.0f tokens/s)\n",
		job.Model.Describe(), res.Loss, res.Perplexity, res.BitsPerByte, res.Tokens, res.Bytes, res.Samples, res.ElapsedSec, res.TokensPerSec)
	if err := evaluate.WriteReport(job.Req.Out, rep); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "eval: wrote %s\n", job.Req.Out)
	return nil
}
