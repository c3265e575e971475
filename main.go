// Command distflash trains LLaMA-family models on long sequences: sequence-parallel
// distributed FlashAttention, rematerialization-aware activation checkpointing, FSDP-style
// sharding and mixed-precision AdamW, on a laptop CPU or a GPU cluster.
//
// This package is the command line: the commands as a table (the one below), from which
// `distflash help` and each command's -h are written, and one file of flags and printing per
// command; package internal/cli holds the machinery (the table's type, flag sets, the signal
// helper, the progress bar). See README.md and docs/design.md for the configuration and the
// design.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"distflash/internal/cli"
	"distflash/parallel/transport"
)

func main() {
	args := os.Args[1:]
	j, err := joinJob(args, os.Stderr)
	if err == nil {
		err = run(args, os.Stdout, os.Stderr)
	}
	if err == nil || errors.Is(err, flag.ErrHelp) { // -h prints the command's flags: not a failure
		if err = j.end(); err == nil {
			return
		}
	}
	j.fail(err) // says it once for the job, and ends it
}

// runVersion is `distflash version`.
func runVersion(args []string, stdout, stderr io.Writer) error {
	if err := cli.ParseFlags(root.Flags("version", stderr), args); err != nil {
		return err
	}
	fmt.Fprintln(stdout, cli.Version())
	return nil
}

// runHelp is `distflash help [COMMAND [SUBCOMMAND]]`.
func runHelp(args []string, stdout, stderr io.Writer) error { return root.Help(args, stdout, stderr) }

// commands are distflash's commands, in the order of the usage. They are set in init, since
// their run functions read their usage from the table.
var commands []cli.Command

func init() {
	commands = []cli.Command{
		{Name: "train", EveryRank: true, Run: runTrain, Summary: "train a model from a TOML config (configs/tiny.toml runs on a laptop CPU)", Usage: []string{
			"--config FILE [--set section.key=value ...] [--progress=false] [--init-from MODEL]",
			"--config FILE --resume auto [--time-limit 3h50m] [--stop-after STEP] [--profile DIR]"}},
		{Name: "plan", Run: runPlan, Summary: "predict memory, communication and step time of a config on a GPU cluster", Usage: []string{
			"--config FILE [--set k=v ...] [--cluster 2x8xA100-80GB] [--format text|json]\n[--sweep seq_len=8K..512K] [--attention all|NAME] [--mfu F] [--attn-mfu F]"}},
		{Name: "eval", EveryRank: true, Run: runEval, Summary: "loss, perplexity and bits per byte of a model on text, by position; passkey retrieval", Usage: []string{
			"--model PATH --data FILE [--config FILE] [--samples 100] [--seq-len 2048] [--out FILE]\n[--positions] [--sliding-window W --stride S] [--plot FILE.png]",
			"--model PATH --task passkey [--lengths 1K,2K,4K] [--trials 20] [--plot FILE.png]"}},
		{Name: "generate", EveryRank: true, Run: runGenerate, Summary: "continue a prompt with a model (KV cache, greedy or sampled; sequence-parallel)", Usage: []string{
			"--model PATH --prompt TEXT|--prompt-file FILE [--max-new-tokens 128]\n[--temperature T] [--top-k K] [--top-p P] [--seed S] [--samples N]"}},
		{Name: "export", Run: runExport, Summary: "write a checkpoint as a Hugging Face LLaMA directory (config.json, safetensors, tokenizer)", Usage: []string{
			"--model CHECKPOINT --out DIR [--dtype f32|bf16] [--max-shard-size 5GB]"}},
		{Name: "data", Summary: "tokenize data.train into token shards; download C4; write passkey documents", Subs: []cli.Command{
			{Name: "tokenize", Run: runTokenize, Summary: "encode data.train with data.tokenizer into token shards (train reads them: data.format = tokens)", Usage: []string{
				"--config FILE [--set k=v ...] --out DIR|FILE.tokens [--shard-tokens N]"}},
			{Name: "fetch", Run: runFetch, Summary: `download files of C4 "en" (allenai/c4 on the Hugging Face Hub), resuming interrupted ones`, Usage: []string{
				"c4 [--split validation|train] [--shards N] [--first K] [--out DIR] [--base-url URL]"}},
			{Name: "passkey", Run: runPasskeyDocs, Summary: "write passkey-retrieval documents (eval --task passkey's prompts, answered) as jsonl", Usage: []string{
				"--out FILE.jsonl --docs N --chars MIN..MAX [--seed S]"}},
		}},
		{Name: "plot", Run: runPlot, Summary: "draw loss, eval loss, learning rate, gradient norm and tokens/s of runs, overlaid", Usage: []string{
			"RUN [RUN...] --out FILE.png|FILE.svg",
			"--positions EVAL.json [EVAL.json...] --out FILE.png|FILE.svg"},
			Detail: `Draws training loss (and eval loss) against step and against tokens, the learning rate, the
gradient norm and tokens/s of one or several runs, overlaid with one colour per run. A RUN is
a run directory (runs/<run.name>) or its metrics.jsonl. With --positions it draws the loss by
position of eval reports (eval --positions), one line per report.`},
		{Name: "version", Aliases: []string{"-version", "--version"}, Run: runVersion, Usage: []string{""},
			Summary: "the version of this binary (commit, Go version, build tags)"},
		{Name: "help", Aliases: []string{"-h", "-help", "--help"}, Run: runHelp, Usage: []string{"[COMMAND [SUBCOMMAND]]"},
			Summary: "this usage, or what COMMAND -h says"},
	}
	root.Subs = commands
}

// root is distflash itself, whose subcommands are the commands.
var root = cli.Command{Name: "distflash", Summary: "trains LLaMA-family models on long sequences"}

// run runs the command that args name.
// A collective that fails (transport.Failure) is its error.
func run(args []string, stdout, stderr io.Writer) (err error) {
	if l, _ := transport.MPIEnv(); l != nil && root.Rank0Only(args, l.Rank) {
		return nil // one output, one report: rank 0 makes them
	}
	defer transport.Recover(&err)
	return root.Execute(args, stdout, stderr)
}
