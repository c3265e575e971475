package train

import (
	"fmt"
	"io"
	"time"

	"distflash/config"
	"distflash/data"
)

// newLoader reads the training data the config names (data.train, in data.format, through
// data.tokenizer, cut at data.max_bytes; documents marked when data.document_mask) and returns
// the loader that cuts it into the batches training sees, in order. It reports what it read
// on stderr.
func NewLoader(cfg config.Config, stderr io.Writer) (*data.Loader, error) {
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("%s: data.tokenizer: %w", cfg.Origin("data.tokenizer"), err)
	}
	if tok.VocabSize() > cfg.Model.VocabSize {
		return nil, fmt.Errorf("%s: data.tokenizer %q has %d tokens but model.vocab_size = %d: set model.vocab_size to at least %d",
			cfg.Origin("data.tokenizer"), cfg.Data.Tokenizer, tok.VocabSize(), cfg.Model.VocabSize, tok.VocabSize())
	}
	path, err := data.ExpandPath(cfg.Data.Train)
	if err != nil {
		return nil, fmt.Errorf("%s: data.train = %q: %w", cfg.Origin("data.train"), cfg.Data.Train, err)
	}
	start := time.Now()
	src := data.Source{Path: path, Format: cfg.Data.Format, TextKey: cfg.Data.TextKey, Include: cfg.Data.Include,
		MaxBytes: cfg.Data.MaxBytes, Seed: cfg.Run.Seed, Log: stderr} // Log: a max_bytes cut, warnings
	if cfg.Data.DocumentMask {
		b, err := data.DocumentBoundary(tok)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.Origin(""), err)
		}
		src.Boundary = &b
	}
	tokens, err := data.LoadTokens(src, tok)
	if err != nil {
		return nil, fmt.Errorf("%s: data.train = %q: %w", cfg.Origin("data.train"), cfg.Data.Train, err)
	}
	fmt.Fprintf(stderr, "data: %d tokens from %s (%s tokenizer) in %.1fs\n", len(tokens), path, tok.Name(), time.Since(start).Seconds())
	loader, err := data.NewLoader(tokens, cfg.Data.SeqLen, cfg.Data.BatchSize, cfg.Run.Seed)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Origin(""), err)
	}
	if src.Boundary != nil {
		loader.SetBoundary(*src.Boundary)
	}
	return loader, nil
}
