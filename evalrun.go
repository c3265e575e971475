package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"

	"distflash/ckpt"
	"distflash/config"
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
	if *modelPath == "" {
		return errors.New("eval: --model is required: a Hugging Face LLaMA directory, a checkpoint directory or a .safetensors file")
	}
	cfg, err := evaluate.LoadConfig(*configPath, sets)
	if err != nil {
		return err
	}
	em, err := evaluate.LoadModel(*modelPath, cfg, stderr)
	if err != nil {
		return err
	}
	if cfg, err = evaluate.ConfigFor(cfg, em, *configPath, sets); err != nil {
		return err
	}
	if cfg.Device.Kind != "cpu" {
		return fmt.Errorf("eval: device.kind = %q needs a build with -tags %s (this build runs on the CPU)", cfg.Device.Kind, cfg.Device.Kind)
	}
	if *dataPath == "" {
		*dataPath = cfg.Data.Eval
	}
	if *dataPath == "" {
		return errors.New("eval: no evaluation data: pass --data FILE or set data.eval in the config")
	}
	if *samples == 0 {
		*samples = cfg.Eval.Samples
	}
	if *seqLen == 0 {
		*seqLen = evaluate.SeqLen(cfg)
	}
	if *samples < 1 || *seqLen < 1 {
		return fmt.Errorf("eval: --samples %d, --seq-len %d: both must be >= 1", *samples, *seqLen)
	}
	if *out == "" {
		*out = filepath.Clean(em.Path) + ".eval.json"
	}
	bos, err := evaluate.ParseBOS(*bosFlag, em.BOS)
	if err != nil {
		return err
	}
	mc := em.Config
	if *seqLen > mc.MaxSeqLen {
		return fmt.Errorf("eval: --seq-len %d exceeds the model's longest sequence, %d (max_seq_len / max_position_embeddings)", *seqLen, mc.MaxSeqLen)
	}
	if v := em.Tokenizer.VocabSize(); v > mc.VocabSize {
		return fmt.Errorf("eval: tokenizer %s has %d tokens, the model's vocabulary only %d", em.Tokenizer.Name(), v, mc.VocabSize)
	}
	if bos >= int32(mc.VocabSize) {
		return fmt.Errorf("eval: BOS token %d is outside the model's vocabulary of %d", bos, mc.VocabSize)
	}
	ev, err := evaluate.NewEvaluator(mc, cfg.Parallelism)
	if err != nil {
		return err
	}
	if err := ev.Load(em.Params); err != nil {
		return err
	}
	em.Params = nil
	ss, err := evaluate.LoadSamples(*dataPath, cfg.Data, em.Tokenizer, bos, *seqLen, mc.VocabSize, *samples)
	if err != nil {
		return err
	}
	if len(ss) < *samples {
		fmt.Fprintf(stderr, "eval: %s has %d documents to evaluate, fewer than --samples %d\n", *dataPath, len(ss), *samples)
	}
	world := "1 worker"
	if ev.P > 1 {
		world = fmt.Sprintf("%d sequence-parallel ranks (%s)", ev.P, ev.Attn)
	}
	fmt.Fprintf(stderr, "eval: %s (%s, LLaMA %s params, dim %d, %d layers, %d/%d heads, vocab %d) on %d samples of %s, seq_len %d, %s; tokenizer %s\n",
		em.Describe(), em.Source, config.Count(mc.NumParams()), mc.Dim, mc.NLayers, mc.NHeads, mc.NKVHeads, mc.VocabSize,
		len(ss), *dataPath, *seqLen, world, em.Tokenizer.Name())

	bar := progressbar.NewOptions(len(ss),
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetVisibility(*progress),
		progressbar.OptionSetWidth(24),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := ev.Evaluate(ctx, ss, func(done int, loss float64) {
		bar.Describe(fmt.Sprintf("loss %.4f", loss))
		_ = bar.Add(1)
	})
	_ = bar.Finish()
	if err != nil {
		return err
	}
	res.SeqLen = *seqLen
	rep := evaluate.Report{Result: res, Model: *modelPath, Source: em.Source, Evaluated: em.Path, Data: *dataPath,
		Tokenizer: em.Tokenizer.Name(), BOS: bos, Params: mc.NumParams()}
	if em.Step >= 0 {
		rep.Step = &em.Step
	}
	// The result first, so that a file that cannot be written loses nothing.
	fmt.Fprintf(stdout, "eval: %s: loss %.6f  perplexity %.4f  bits/byte %.4f  over %d tokens (%d bytes) of %d samples in %.1fs (%.0f tokens/s)\n",
		em.Describe(), res.Loss, res.Perplexity, res.BitsPerByte, res.Tokens, res.Bytes, res.Samples, res.ElapsedSec, res.TokensPerSec)
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("eval: encode result: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return fmt.Errorf("eval: %w", err)
	}
	if err := ckpt.WriteFileAtomic(*out, append(js, '\n')); err != nil {
		return fmt.Errorf("eval: write result: %w", err)
	}
	fmt.Fprintf(stdout, "eval: wrote %s\n", *out)
	return nil
}
