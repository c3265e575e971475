package train

import (
	"fmt"
	"io"
	"strings"
	"time"

	"distflash/config"
	"distflash/data"
)

// NewLoader reads the training data the config names and returns the mixture that cuts it into
// the batches training sees, in order: data.train, or each [[data.sources]] table (in its
// format, through data.tokenizer, cut at data.max_bytes; documents marked when
// data.document_mask). A single source is a mixture of one, which gives a Loader's batches. It
// reports what it read on stderr, and for a mixture each source's share of the run and how
// many times over the run reads it.
func NewLoader(cfg config.Config, stderr io.Writer) (*data.Mixture, error) {
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("%s: data.tokenizer: %w", cfg.Origin("data.tokenizer"), err)
	}
	if tok.VocabSize() > cfg.Model.VocabSize {
		return nil, fmt.Errorf("%s: data.tokenizer %q has %d tokens but model.vocab_size = %d: set model.vocab_size to at least %d",
			cfg.Origin("data.tokenizer"), cfg.Data.Tokenizer, tok.VocabSize(), cfg.Model.VocabSize, tok.VocabSize())
	}
	var boundary *int32
	if cfg.Data.DocumentMask {
		b, err := data.DocumentBoundary(tok)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.Origin(""), err)
		}
		boundary = &b
	}
	mixed := len(cfg.Data.Sources) > 0
	var sources []data.MixSource
	for i, s := range cfg.Data.TrainSources() {
		key, origin := "data.train", cfg.Origin("data.train")
		if mixed {
			key, origin = fmt.Sprintf("data.sources[%d] (%q).path", i+1, s.Name), cfg.Origin("data.sources")
		}
		path, err := data.ExpandPath(s.Path)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: path %q: %w", origin, key, s.Path, err)
		}
		start := time.Now()
		src := data.Source{Path: path, Format: s.Format, TextKey: s.TextKey, Include: s.Include,
			MaxBytes: cfg.Data.MaxBytes, Seed: cfg.Run.Seed, Log: stderr, Boundary: boundary} // Log: a max_bytes cut, warnings
		tokens, err := data.LoadTokens(src, tok)
		if err != nil {
			return nil, fmt.Errorf("%s: %s = %q: %w", origin, key, s.Path, err)
		}
		which := ""
		if mixed {
			which = "source " + s.Name + ": "
		}
		fmt.Fprintf(stderr, "data: %s%d tokens from %s (%s tokenizer) in %.1fs\n", which, len(tokens), path, tok.Name(), time.Since(start).Seconds())
		sources = append(sources, data.MixSource{Name: s.Name, Weight: s.Weight, Tokens: tokens})
	}
	mix, err := data.NewMixture(sources, cfg.Data.SeqLen, cfg.Data.BatchSize, cfg.Run.Seed)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Origin(""), err)
	}
	if boundary != nil {
		mix.SetBoundary(*boundary)
	}
	if mixed {
		fmt.Fprintln(stderr, mixtureReport(cfg, mix))
	}
	return mix, nil
}

// mixtureReport is the data report's line for a mixture: each source's share of the sequences
// and what that share is of the run (training.steps), in sequences and in epochs of the source.
func mixtureReport(cfg config.Config, mix *data.Mixture) string {
	d, err := cfg.Parallelism.Dims()
	dp := 1
	if err == nil {
		dp = d.DP()
	}
	seqs := float64(cfg.Training.Steps) * float64(cfg.Data.BatchSize*cfg.Training.GradAccumSteps*dp)
	var parts []string
	for i, w := range mix.Weights() {
		n := mix.Windows()[i]
		parts = append(parts, fmt.Sprintf("%s %.3f (%s sequences of its %s: %.2f epochs)",
			mix.Names()[i], w, data.Count(int64(w*seqs+0.5)), data.Count(int64(n)), w*seqs/float64(n)))
	}
	return fmt.Sprintf("data: a mixture of %d sources, each sequence of data.seq_len %d drawn by weight; over %d steps (%s sequences): %s",
		len(parts), cfg.Data.SeqLen, cfg.Training.Steps, data.Count(int64(seqs)), strings.Join(parts, ", "))
}
