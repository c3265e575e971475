package train

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"distflash/config"
	"distflash/data"
	"distflash/model"
	"distflash/parallel/transport"
	"distflash/weights"
)

// train --init-from: a new run (step 0, fresh AdamW moments, the data order from its start)
// whose weights come from a trained model instead of model.InitParams.
//
// The source is a Hugging Face LLaMA directory, a .safetensors file with distflash's (Hugging
// Face's) tensor names, or a distflash checkpoint (a step directory, or a run directory for
// its newest step; only its weights are used), read by weights.LoadSource; this file merges
// its [model] and tokenizer into the run's config.
//
// model.init, which draws a new model's weights, has nothing to draw: --set model.init, or a
// config whose model.init is not the default, is refused.
//
// Which [model] the run has. Each [model] key the config leaves at its built-in default
// (model.DefaultConfig; configs/tiny.toml writes them out; 0 for head_dim and n_kv_heads,
// "derive") and that no --set names is taken from the source. A key with another value, or
// one named by --set, must agree with the source, and a disagreement is an error naming the
// key and both values; except rope_theta, max_seq_len, rope_scaling and the sliding window's
// keys, which a run may change (that is how a context is extended, or a window
// added or moved): the config's value is used and the change printed.
// A .safetensors file carries no config, so only the shapes it implies (dim, n_layers, ffn_dim,
// vocab_size) come from it; the head layout and the rest come from the config.
//
// The tokenizer. data.tokenizer, when the config sets it to something other than "byte" or
// --set names it, is used; otherwise the source's: an HF directory's tokenizer.model or
// tokenizer.json, the checkpoint's data.tokenizer. A tokenizer with more tokens than the
// model's vocabulary is an error naming both sizes.

// modelKey is one [model] key: its name and how to read and write it.
type modelKey struct {
	name       string
	get        func(*model.Config) any
	set        func(dst, src *model.Config)
	changeable bool // the run may use another value than the source's
}

var modelKeys = []modelKey{
	{"dim", func(c *model.Config) any { return c.Dim }, func(d, s *model.Config) { d.Dim = s.Dim }, false},
	{"n_layers", func(c *model.Config) any { return c.NLayers }, func(d, s *model.Config) { d.NLayers = s.NLayers }, false},
	{"n_heads", func(c *model.Config) any { return c.NHeads }, func(d, s *model.Config) { d.NHeads = s.NHeads }, false},
	{"n_kv_heads", func(c *model.Config) any { return c.NKVHeads }, func(d, s *model.Config) { d.NKVHeads = s.NKVHeads }, false},
	{"head_dim", func(c *model.Config) any { return c.HeadDim }, func(d, s *model.Config) { d.HeadDim = s.HeadDim }, false},
	{"ffn_dim", func(c *model.Config) any { return c.FFNDim }, func(d, s *model.Config) { d.FFNDim = s.FFNDim }, false},
	{"vocab_size", func(c *model.Config) any { return c.VocabSize }, func(d, s *model.Config) { d.VocabSize = s.VocabSize }, false},
	{"norm_eps", func(c *model.Config) any { return c.NormEps }, func(d, s *model.Config) { d.NormEps = s.NormEps }, false},
	{"rope_theta", func(c *model.Config) any { return c.RopeTheta }, func(d, s *model.Config) { d.RopeTheta = s.RopeTheta }, true},
	{"max_seq_len", func(c *model.Config) any { return c.MaxSeqLen }, func(d, s *model.Config) { d.MaxSeqLen = s.MaxSeqLen }, true},
	{"rope_scaling", func(c *model.Config) any { return normRope(c.RopeScaling) }, func(d, s *model.Config) { d.RopeScaling = s.RopeScaling }, true},
	{"sliding_window", func(c *model.Config) any { return c.SlidingWindow }, func(d, s *model.Config) { d.SlidingWindow = s.SlidingWindow }, true},
	{"sliding_window_layers", func(c *model.Config) any { return fmt.Sprint(c.SlidingWindowLayers) }, // a slice: compared as text
		func(d, s *model.Config) { d.SlidingWindowLayers = slices.Clone(s.SlidingWindowLayers) }, true},
	{"sliding_window_pattern", func(c *model.Config) any { return c.SlidingWindowPattern }, func(d, s *model.Config) { d.SlidingWindowPattern = s.SlidingWindowPattern }, true},
}

// normRope makes "none" and "" the same (no scaling).
func normRope(r model.RopeScaling) model.RopeScaling {
	if r.Type == "none" {
		r.Type = ""
	}
	return r
}

// setByFlag reports whether --set named section.key (or a key inside it, for tables).
func setByFlag(sets []string, key string) bool {
	for _, s := range sets {
		k, _, _ := strings.Cut(s, "=")
		k = strings.TrimSpace(k)
		if k == key || strings.HasPrefix(k, key+".") {
			return true
		}
	}
	return false
}

// applyInitSource makes cfg's [model] and data.tokenizer those of the run started from src
// (see the file comment) and validates the result. Notes on what was taken or changed go to
// stderr.
func applyInitSource(cfg *config.Config, src *weights.Source, sets []string, stderr io.Writer) error {
	def := model.DefaultConfig()
	user := cfg.Model
	final := src.Model
	var disagree, taken, changed []string
	for _, k := range modelKeys {
		u, d, s := k.get(&user), k.get(&def), k.get(&src.Model)
		derive := (k.name == "head_dim" || k.name == "n_kv_heads") && u == 0 // 0: derived, as left out
		explicit := setByFlag(sets, "model."+k.name) || u != d && !derive
		switch {
		case !explicit:
			if s != u {
				taken = append(taken, fmt.Sprintf("%s = %v", k.name, s))
			}
		case u == s:
		case k.changeable:
			k.set(&final, &user)
			changed = append(changed, fmt.Sprintf("%s = %v (the source has %v)", k.name, u, s))
		case k.name == "vocab_size" && s.(int) > u.(int):
			disagree = append(disagree, fmt.Sprintf("the source's vocabulary of %d tokens exceeds model.vocab_size = %d", s, u))
		default:
			disagree = append(disagree, fmt.Sprintf("model.%s = %v, the source has %v", k.name, u, s))
		}
	}
	if len(disagree) > 0 {
		return fmt.Errorf("%s: --init-from %s (%s): %s (leave these keys out of [model] to take the source's values)",
			cfg.Path, src.Path, src.Kind, strings.Join(disagree, "; "))
	}
	cfg.Model = final
	tokFromSource := src.Tokenizer != "" && src.Tokenizer != cfg.Data.Tokenizer && cfg.Data.Tokenizer == config.Default().Data.Tokenizer && !setByFlag(sets, "data.tokenizer")
	if tokFromSource {
		cfg.Data.Tokenizer = src.Tokenizer
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("--init-from %s: with [model] from the source: %w", src.Path, err)
	}
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return fmt.Errorf("%s: data.tokenizer: %w", cfg.Origin("data.tokenizer"), err)
	}
	if v := tok.VocabSize(); v > cfg.Model.VocabSize {
		own := "the model's own tokenizer (data.tokenizer)"
		if src.Tokenizer != "" && src.Tokenizer != cfg.Data.Tokenizer {
			own = fmt.Sprintf("the model's own tokenizer: --set data.tokenizer=%s (or leave data.tokenizer out, and the source's is taken)", src.Tokenizer)
		}
		return fmt.Errorf("%s: --init-from %s: data.tokenizer = %q has %d tokens, but the model's vocabulary has %d: use %s",
			cfg.Path, src.Path, cfg.Data.Tokenizer, v, cfg.Model.VocabSize, own)
	}
	what := "weights"
	if src.Kind == "checkpoint" {
		what = "weights only (step 0, fresh optimizer and data order)"
	}
	fmt.Fprintf(stderr, "init: %s from %s (%s, %s params)\n", what, src.Path, src.Kind, data.Count(cfg.Model.NumParams()))
	if len(taken) > 0 {
		fmt.Fprintf(stderr, "init: [model] from the source: %s\n", strings.Join(taken, ", "))
	}
	if len(changed) > 0 {
		fmt.Fprintf(stderr, "init: [model] changed by the config: %s\n", strings.Join(changed, ", "))
	}
	if tokFromSource {
		fmt.Fprintf(stderr, "init: tokenizer %s from the source\n", cfg.Data.Tokenizer)
	}
	if v := tok.VocabSize(); v < cfg.Model.VocabSize && v*2 < cfg.Model.VocabSize {
		fmt.Fprintf(stderr, "init: warning: tokenizer %s has %d tokens, the model's vocabulary %d: is it the model's tokenizer?\n", tok.Name(), v, cfg.Model.VocabSize)
	}
	return nil
}

// LoadInitConfig is config.Load for train --init-from: the file and the overrides, then
// [model] and data.tokenizer from the source at from, then validation (only then: the
// built-in [model] a config leaves in place is not the run's). It returns the config and
// the source's weights.
func LoadInitConfig(path string, sets []string, from string, stderr io.Writer) (config.Config, []float32, error) {
	if l, err := transport.MPIEnv(); err == nil && l != nil && l.Rank > 0 {
		stderr = io.Discard // every process loads the source; rank 0 reports it
	}
	cfg, err := config.Read(path, sets) // validated once [model] is taken from the source
	if err != nil {
		return config.Config{}, nil, err
	}
	if init := cfg.Model.Init; setByFlag(sets, "model.init") || init != "" && init != model.DefaultConfig().Init {
		return config.Config{}, nil, fmt.Errorf("%s: model.init = %q draws a new model's weights, but --init-from %s brings them: leave model.init out",
			cfg.Origin("model.init"), init, from)
	}
	src, err := weights.LoadSource(from, cfg.Model, stderr)
	if err != nil {
		return config.Config{}, nil, err
	}
	if err := applyInitSource(&cfg, src, sets, stderr); err != nil {
		return config.Config{}, nil, err
	}
	if n := model.NewLayout(cfg.Model).Size; n != len(src.Params) {
		return config.Config{}, nil, fmt.Errorf("--init-from %s: %d weights for a model of %d", from, len(src.Params), n)
	}
	return cfg, src.Params, nil
}

// loadWeights replaces every rank's weights with params (model Layout order): all of them,
// or the rank's FSDP chunks, and the 16-bit compute copy where there is one.
func (t *trainer) loadWeights(params []float32) error {
	if n := t.ranks[0].Model.Layout.Size; len(params) != n {
		return fmt.Errorf("init: %d weights for a model of %d", len(params), n)
	}
	return t.run(func(r *rank) error { return r.Load(params) })
}
