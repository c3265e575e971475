package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"distflash/data"
	"distflash/internal/cli"
	"distflash/weights"
	"distflash/weights/safetensors"
)

// `distflash export`: a checkpoint of distflash as a Hugging Face LLaMA directory that
// transformers' LlamaForCausalLM.from_pretrained loads: config.json, the weights as
// safetensors (sharded above --max-shard-size, with model.safetensors.index.json) and the
// tokenizer files of the run's data.tokenizer (weights.ExportHF; this file is its flags, its
// signal hooks and what it prints).

// runExport is `distflash export`.
func runExport(args []string, stdout, stderr io.Writer) error {
	fs := root.Flags("export", stderr)
	modelPath := fs.String("model", "", "distflash checkpoint: a step directory, or a run directory for its newest step (required)")
	out := fs.String("out", "", "the Hugging Face directory to write; must not exist or be empty (required)")
	dtype := fs.String("dtype", "f32", "stored weights: f32 (exact) or bf16 (rounded to nearest even)")
	maxShard := fs.String("max-shard-size", "5GB", "most tensor bytes per safetensors file, as Hugging Face's max_shard_size (5GB, 500MB, 2GiB…); above it the weights are sharded with model.safetensors.index.json")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if *modelPath == "" || *out == "" {
		return errors.New("export: --model CHECKPOINT and --out DIR are required")
	}
	st := map[string]string{"f32": safetensors.DTypeF32, "bf16": safetensors.DTypeBF16}[*dtype]
	if st == "" {
		return fmt.Errorf("export: --dtype %q: want f32 or bf16", *dtype)
	}
	shardSize, err := weights.ParseSize(*maxShard)
	if err != nil {
		return fmt.Errorf("export: --max-shard-size: %w", err)
	}
	hooks, done := exportHooks(*out, stderr)
	ex, err := weights.ExportHF(*modelPath, *out, weights.ExportOptions{DType: st, MaxShard: shardSize, Hooks: hooks}, stderr)
	done()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "export: %s -> %s (%s, %s params, %s, %.1f MB): %s\n",
		*modelPath, *out, ex.Arch, data.Count(ex.Model.NumParams()), *dtype, float64(ex.Bytes)/1e6, strings.Join(ex.Files, ", "))
	if ex.NoTokFiles {
		fmt.Fprintf(stdout, "export: the run used the %s tokenizer, which has no Hugging Face tokenizer file: none written (one token per UTF-8 byte, ids 0-255, no BOS/EOS)\n", ex.Tokenizer)
	}
	return nil
}

// exportHooks says which partial exports of out an earlier, killed export left (and that they
// are removed), and removes this export's temporary directory when SIGINT or SIGTERM ends it
// (exit status 130), so that an interrupted export leaves nothing behind. The rename to out
// is the one commit point (cli.Guard): a signal before it leaves nothing at out, one after it
// lets the export finish. done stops listening.
func exportHooks(out string, stderr io.Writer) (*weights.HFHooks, func()) {
	var tmp string // read and written under guard's lock
	guard := &cli.Guard{}
	_, done := cli.OnSignal(cli.Interrupt{Guard: guard, Exit: func() { // no Stop: the first signal ends the export
		if err := weights.RemoveTemp(tmp); tmp != "" && err != nil {
			fmt.Fprintf(stderr, "\nexport: interrupted; nothing written at %s, but the partial %s is left (%v): the next export of %s removes it\n", out, tmp, err, out)
		} else if tmp != "" {
			fmt.Fprintf(stderr, "\nexport: interrupted: removed the partial %s; nothing written at %s\n", tmp, out)
		} else {
			fmt.Fprintf(stderr, "\nexport: interrupted; no partial output of %s left behind\n", out)
		}
	}, Late: func() {
		fmt.Fprintf(stderr, "\nexport: interrupted after %s was complete: it is kept, and the export finishes\n", out)
	}})
	hooks := &weights.HFHooks{
		Temp:  func(p string) { tmp = p },
		Guard: guard.Do,
		Stale: func(p string, bytes int64) {
			fmt.Fprintf(stderr, "export: removing %s (%.1f MB), the partial output of an earlier export of %s that was killed\n", p, float64(bytes)/1e6, out)
		},
	}
	return hooks, done
}
