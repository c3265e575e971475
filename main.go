// Command distflash trains LLaMA-family models on long sequences: sequence-parallel
// distributed FlashAttention, rematerialization-aware activation checkpointing, FSDP-style
// sharding and mixed-precision AdamW, on a laptop CPU or a GPU cluster.
//
// Usage:
//
//	distflash train --config configs/tiny.toml [--set section.key=value ...]
//	distflash plan --config configs/llama7b-512k.toml [--cluster 2x8xA100-80GB] [--sweep seq_len=8K..512K] [--attention all]
//	distflash eval --model PATH --data FILE [--config FILE] [--samples 100] [--seq-len 2048] [--positions]
//	distflash eval --model PATH --task passkey [--lengths 1K,2K,4K] [--trials 20] [--plot FILE.png]
//	distflash generate --model PATH --prompt TEXT [--max-new-tokens 128] [--temperature T] [--top-k K] [--top-p P]
//	distflash train --config FILE --init-from HF-DIR|FILE.safetensors|CHECKPOINT
//	distflash export --model CHECKPOINT --out DIR [--dtype f32|bf16] [--max-shard-size 5GB]
//	distflash plot RUN [RUN...] --out FILE.png|FILE.svg
//
// See README.md and docs/design.md for the configuration and the design.
package main

import (
	"distflash/parallel/transport"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
)

const usage = `distflash trains LLaMA-family models on long sequences.

Usage:
  distflash train --config FILE [--set section.key=value ...] [--progress=false] [--init-from MODEL]
  distflash plan --config FILE [--set k=v ...] [--cluster 2x8xA100-80GB] [--format text|json]
                 [--sweep seq_len=8K..512K] [--attention all|NAME] [--mfu F] [--attn-mfu F]
  distflash eval --model PATH --data FILE [--config FILE] [--samples 100] [--seq-len 2048] [--out FILE]
                 [--positions] [--sliding-window W --stride S] [--plot FILE.png]
  distflash eval --model PATH --task passkey [--lengths 1K,2K,4K] [--trials 20] [--plot FILE.png]
  distflash generate --model PATH --prompt TEXT|--prompt-file FILE [--max-new-tokens 128]
                 [--temperature T] [--top-k K] [--top-p P] [--seed S] [--samples N]
  distflash export --model CHECKPOINT --out DIR [--dtype f32|bf16] [--max-shard-size 5GB]
  distflash data tokenize --config FILE [--set k=v ...] --out DIR|FILE.tokens [--shard-tokens N]
  distflash data fetch c4 [--split validation|train] [--shards N] [--first K] [--out DIR]
  distflash plot RUN [RUN...] --out FILE.png|FILE.svg
  distflash plot --positions EVAL.json [EVAL.json...] --out FILE.png
  distflash version

Commands:
  train   train a model from a TOML config (configs/tiny.toml runs on a laptop CPU)
  plan    predict memory, communication and step time of a config on a GPU cluster
  eval    loss, perplexity and bits per byte of a model (Hugging Face LLaMA or distflash's) on text,
          by position; passkey retrieval at long context
  generate  continue a prompt with a model (KV cache, greedy or sampled; sequence-parallel)
  data    tokenize data.train into token shards; download C4
  export  write a checkpoint as a Hugging Face LLaMA directory (config.json, safetensors, tokenizer)
  plot    draw loss, eval loss, learning rate, gradient norm and tokens/s of runs, overlaid
  version the version of this binary (commit, Go version, build tags)

Run 'distflash COMMAND -h' for the flags of a command.
`

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp): // -h prints the command's flags: not a failure
		return
	}
	if l, _ := transport.MPIEnv(); l != nil && l.Size > 1 && l.Rank > 0 {
		// one of several ranks: rank 0 says what every rank found alike (the config, the
		// memory), and each other rank only what is its own
		var same *everyRank
		if !errors.As(err, &same) {
			fmt.Fprintf(os.Stderr, "distflash: rank %d: %v\n", l.Rank, err)
		}
		os.Exit(2)
	}
	fmt.Fprintln(os.Stderr, "distflash:", err)
	os.Exit(2)
}

// everyRank marks an error that every rank of a launched world meets alike (an invalid config,
// a model that does not fit): only rank 0 prints it.
type everyRank struct{ error }

func (e *everyRank) Unwrap() error { return e.error }

// run dispatches a command line to its subcommand.
func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "train":
		return runTrain(args[1:], stdout, stderr)
	case "plan":
		return runPlan(args[1:], stdout, stderr)
	case "eval":
		return runEval(args[1:], stdout, stderr)
	case "generate":
		return runGenerate(args[1:], stdout, stderr)
	case "data":
		return runData(args[1:], stdout, stderr)
	case "export":
		return runExport(args[1:], stdout, stderr)
	case "plot":
		return runPlot(args[1:], stdout, stderr)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, version())
		return nil
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// version describes this binary: its module version or VCS commit (with "+dirty" for a build
// from a modified tree), the Go version and the build tags that select CUDA and MPI.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "distflash (no build information)"
	}
	v, commit, dirty, tags := bi.Main.Version, "", false, ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		case "-tags":
			tags = s.Value
		}
	}
	if commit != "" {
		if len(commit) > 12 {
			commit = commit[:12]
		}
		v = "commit " + commit
		if dirty {
			v += "+dirty"
		}
	}
	out := fmt.Sprintf("distflash %s, %s %s/%s", v, bi.GoVersion, runtime.GOOS, runtime.GOARCH)
	if tags != "" {
		out += ", tags " + tags
	}
	return out
}

// setFlags collects repeated --set section.key=value overrides.
type setFlags []string

func (s *setFlags) String() string { return strings.Join(*s, ",") }

func (s *setFlags) Set(v string) error {
	*s = append(*s, v)
	return nil
}
