package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"

	"distflash/ckpt"
	"distflash/config"
	"distflash/evaluate"
)

// `distflash export`: a checkpoint of distflash as a Hugging Face LLaMA directory that
// transformers' LlamaForCausalLM.from_pretrained loads: config.json, the weights as
// safetensors (sharded above --max-shard-size, with model.safetensors.index.json) and the
// tokenizer files of the run's data.tokenizer. Tensor names and the q/k row layout are
// already Hugging Face's (see package ckpt), so the weights are written as they are.

// runExport is `distflash export`.
func runExport(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	fs.SetOutput(stderr)
	modelPath := fs.String("model", "", "distflash checkpoint: a step directory, or a run directory for its newest step (required)")
	out := fs.String("out", "", "the Hugging Face directory to write; must not exist or be empty (required)")
	dtype := fs.String("dtype", "f32", "stored weights: f32 (exact) or bf16 (rounded to nearest even)")
	maxShard := fs.String("max-shard-size", "5GB", "most tensor bytes per safetensors file, as Hugging Face's max_shard_size (5GB, 500MB, 2GiB…); above it the weights are sharded with model.safetensors.index.json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("export: unexpected arguments %q", fs.Args())
	}
	if *modelPath == "" || *out == "" {
		return errors.New("export: --model CHECKPOINT and --out DIR are required")
	}
	st := map[string]string{"f32": ckpt.DTypeF32, "bf16": ckpt.DTypeBF16}[*dtype]
	if st == "" {
		return fmt.Errorf("export: --dtype %q: want f32 or bf16", *dtype)
	}
	shardSize, err := ckpt.ParseSize(*maxShard)
	if err != nil {
		return fmt.Errorf("export: --max-shard-size: %w", err)
	}
	if ents, err := os.ReadDir(*out); err == nil && len(ents) > 0 {
		return fmt.Errorf("export: --out %s exists and is not empty: export writes a new directory", *out)
	}
	if fi, err := os.Stat(*modelPath); err != nil {
		return fmt.Errorf("export: --model: %w", err)
	} else if !fi.IsDir() || ckpt.IsHFDir(*modelPath) {
		return fmt.Errorf("export: --model %s: want a distflash checkpoint (a step directory or a run directory)", *modelPath)
	}
	saved, params, dir, step, err := evaluate.LoadCheckpoint(*modelPath, stderr)
	if err != nil {
		return fmt.Errorf("export: --model %w", err)
	}
	fmt.Fprintf(stderr, "export: %s (step %d)\n", dir, step)
	mc := saved.Model
	arch := "LlamaForCausalLM"
	if mc.SlidingWindow > 0 {
		// Mistral's config.json has one window for every layer and no way to say "these
		// layers only": exporting a model windowed on some layers would give another model
		var global []int
		for l := range mc.NLayers {
			if mc.Window(l) == 0 {
				global = append(global, l)
			}
		}
		if len(global) > 0 {
			return fmt.Errorf("export: --model %s: model.sliding_window = %d leaves layers %v of %d without the window (model.sliding_window_layers = %v, model.sliding_window_pattern = %d): a Hugging Face LLaMA or Mistral config.json has a window on every layer or none; nothing written",
				dir, mc.SlidingWindow, global, mc.NLayers, mc.SlidingWindowLayers, mc.SlidingWindowPattern)
		}
		arch = "MistralForCausalLM"
	}
	hooks, done := exportHooks(*out, stderr)
	ex, err := ckpt.ExportLlama(*out, evaluate.HFConfigOf(mc), evaluate.Tensors(mc, params), saved.Data.Tokenizer, st, shardSize, hooks)
	done()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "export: %s -> %s (%s, %s params, %s, %.1f MB): %s\n",
		*modelPath, *out, arch, config.Count(mc.NumParams()), *dtype, float64(ex.Bytes)/1e6, strings.Join(ex.Files, ", "))
	if ex.NoTokFiles {
		fmt.Fprintf(stdout, "export: the run used the %s tokenizer, which has no Hugging Face tokenizer file: none written (one token per UTF-8 byte, ids 0-255, no BOS/EOS)\n", ex.Tokenizer)
	}
	return nil
}

// exportHooks says which partial exports of out an earlier, killed export left (and that they
// are removed), and removes this export's temporary directory when SIGINT or SIGTERM ends it
// (exit status 130), so that an interrupted export leaves nothing behind. done stops listening.
func exportHooks(out string, stderr io.Writer) (*ckpt.HFHooks, func()) {
	var tmp atomic.Value
	tmp.Store("")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	quit := make(chan struct{})
	go func() {
		select {
		case <-sigs:
		case <-quit:
			return
		}
		if p := tmp.Load().(string); p != "" {
			os.RemoveAll(p)
			fmt.Fprintf(stderr, "\nexport: interrupted: removed the partial %s; nothing written at %s\n", p, out)
		} else {
			fmt.Fprintf(stderr, "\nexport: interrupted; no partial output of %s left behind\n", out)
		}
		os.Exit(130)
	}()
	hooks := &ckpt.HFHooks{
		Temp: func(p string) { tmp.Store(p) },
		Stale: func(p string, bytes int64) {
			fmt.Fprintf(stderr, "export: removing %s (%.1f MB), the partial output of an earlier export of %s that was killed\n", p, float64(bytes)/1e6, out)
		},
	}
	return hooks, func() {
		signal.Stop(sigs)
		close(quit)
	}
}
