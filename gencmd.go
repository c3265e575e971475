package main

import (
	"fmt"
	"io"

	"distflash/evaluate"
	"distflash/internal/cli"
)

// runGenerate is `distflash generate`: the prompt continued by the model, printed as the
// tokens come when stdout is a terminal (--stream), with the prefill's and the decoding's
// tokens/s on stderr.
func runGenerate(args []string, stdout, stderr io.Writer) (err error) {
	fs := root.Flags("generate", stderr)
	configPath := fs.String("config", "", "TOML config file: [parallelism] (sequence_parallel_degree, attention) (default: the built-in defaults)")
	modelPath := fs.String("model", "", "Hugging Face LLaMA directory, distflash checkpoint or run directory, or .safetensors file with the config's [model] shape (required)")
	prompt := fs.String("prompt", "", "the text to continue")
	promptFile := fs.String("prompt-file", "", "a file holding the text to continue")
	maxNew := fs.Int("max-new-tokens", 128, "tokens to generate at most (fewer when the model writes its EOS token)")
	temperature := fs.Float64("temperature", 0, "0: greedy (the most likely token); above 0: sample from softmax(logits / T)")
	topK := fs.Int("top-k", 0, "sample among the K most likely tokens (0: all)")
	topP := fs.Float64("top-p", 0, "sample among the most likely tokens whose probabilities add up to P (0 or 1: all)")
	seed := fs.Uint64("seed", 1, "the sampler's seed (sample i uses seed + i)")
	samples := fs.Int("samples", 1, "continuations of the prompt")
	bosFlag := fs.String("bos", "auto", "BOS token before the prompt: auto (a Hugging Face model's bos_token_id; none for distflash's own models), none, or an id")
	stream := fs.Bool("stream", cli.IsTerminal(stdout), "print each token as it is generated (default: when stdout is a terminal)")
	out := fs.String("out", "", "also write the samples, their tokens and timings as JSON to this file")
	var sets cli.Sets
	fs.Var(&sets, "set", "override a config value, e.g. --set parallelism.sequence_parallel_degree=4 (repeatable)")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if err := cli.CheckRanges(fs, "the default", []cli.Range{{Flag: "samples", Want: "at least 1 continuation", Default: "one"}}); err != nil {
		return err
	}
	job, err := evaluate.PrepareGenerate(evaluate.GenRequest{ConfigPath: *configPath, Sets: sets, Model: *modelPath,
		Prompt: *prompt, PromptFile: *promptFile, BOS: *bosFlag, Samples: *samples, Out: *out,
		Options: evaluate.GenOptions{MaxNew: *maxNew, Temperature: *temperature, TopK: *topK, TopP: *topP, Seed: *seed}}, stderr)
	if err != nil {
		return err
	}
	defer cli.OnSuccess(job.Close, &err) // after a failure main ends the job (MPI_Abort)
	if !job.Leader() {                   // every rank generates; rank 0 speaks and writes
		stdout, stderr, *stream, *out = io.Discard, io.Discard, false, ""
	}
	fmt.Fprintln(stderr, job.Describe())
	ctx, stop := cli.OnSignal(cli.Stopping(stderr, "generate", ""))
	defer stop()
	var gens []evaluate.GenSample
	for i := range job.Req.Samples {
		if job.Req.Samples > 1 {
			fmt.Fprintf(stdout, "--- sample %d\n", i+1)
		}
		var emit func(int32)
		text := job.Stream()
		if *stream {
			emit = func(tok int32) { fmt.Fprint(stdout, text.Add(tok)) }
		}
		g, err := job.Run(ctx, i, emit)
		if err != nil {
			return err
		}
		gens = append(gens, job.Sample(i, g))
		fmt.Fprintln(stdout, text.Rest(gens[i].Text))
		fmt.Fprintf(stderr, "generate: %d tokens (stopped: %s); prefill %d tokens in %.3fs (%.0f tokens/s), decoding %d tokens in %.3fs (%.1f tokens/s); cache %.1f MB%s\n",
			len(g.Tokens), g.Stopped, g.PromptLen, g.PrefillSec, g.PrefillTokensPerSec(), g.Decoded, g.DecodeSec, g.DecodeTokensPerSec(),
			float64(g.CacheBytes)/1e6, g.SentPerToken())
		if g.Stopped == "cancelled" {
			break
		}
	}
	if *out != "" {
		if err := job.WriteSamples(*out, gens); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "generate: wrote %s\n", *out)
	}
	return nil
}
