package evaluate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"distflash/config"
	"distflash/data"
	"distflash/weights"
	"distflash/world"
)

// GenRequest is what `distflash generate` is asked to do.
type GenRequest struct {
	ConfigPath string   // TOML config file ([parallelism]); "" = the built-in defaults
	Sets       []string // overrides, section.key=value
	Model      string   // Hugging Face directory, checkpoint directory or .safetensors file
	Prompt     string   // the prompt's text
	PromptFile string   // or a file holding it
	BOS        string   // auto, none or a token id (ParseBOS); "" = auto
	Options    GenOptions
	Samples    int    // continuations of the prompt, seeds Seed, Seed+1, …; 0 = 1
	Out        string // the JSON file of the samples (WriteSamples); checked before the work
}

// GenJob is a generation ready to run: the model on the evaluator's ranks and the prompt
// tokenized.
type GenJob struct {
	Req       GenRequest
	Config    config.Config
	Model     weights.Model
	BOS       int32
	Prompt    []int32 // BOS (when the model has one) and the prompt's tokens
	Evaluator *Evaluator
	World     *world.World // the ranks the evaluator runs on; Close ends it
}

// Leader reports whether this process speaks for the job: it holds rank 0.
func (j *GenJob) Leader() bool { return j.World.Leader() }

// Close releases the job's communicators and ends MPI when the job ran over it.
func (j *GenJob) Close() error { return closeWorld(j.World) }

// PrepareGenerate loads the model of req and tokenizes its prompt. The model's tokenizer's
// EOS (when it has one) is added to the options' stop tokens.
func PrepareGenerate(req GenRequest, stderr io.Writer) (*GenJob, error) {
	switch {
	case req.Prompt != "" && req.PromptFile != "":
		return nil, errors.New("generate: give --prompt or --prompt-file, not both")
	case req.PromptFile != "":
		b, err := os.ReadFile(req.PromptFile)
		if err != nil {
			return nil, fmt.Errorf("generate: --prompt-file: %w", err)
		}
		req.Prompt = string(b)
	}
	if req.Samples == 0 {
		req.Samples = 1
	}
	if req.Samples < 1 {
		return nil, fmt.Errorf("generate: --samples %d: want at least 1", req.Samples)
	}
	if err := req.Options.Validate(); err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	l, err := loadModel(req.ConfigPath, req.Sets, req.Model, req.BOS, req.Out, "generate", stderr)
	if err != nil {
		return nil, err
	}
	prompt := passkeyTokens(l.em.Tokenizer, l.bos, req.Prompt)
	if len(prompt) == 0 {
		return nil, errors.New("generate: the prompt is empty and the model has no BOS token to start from: give --prompt TEXT")
	}
	for _, id := range prompt {
		if id < 0 || int(id) >= l.em.Config.VocabSize {
			return nil, fmt.Errorf("generate: prompt token %d (tokenizer %s) is outside the model's vocabulary of %d", id, l.em.Tokenizer.Name(), l.em.Config.VocabSize)
		}
	}
	total := len(prompt) + req.Options.MaxNew
	if total > l.em.Config.MaxSeqLen {
		return nil, fmt.Errorf("generate: %d prompt tokens + --max-new-tokens %d = %d exceed the model's longest sequence, %d (max_seq_len / max_position_embeddings)",
			len(prompt), req.Options.MaxNew, total, l.em.Config.MaxSeqLen)
	}
	if err := l.build(len(prompt), "generate", "a prompt", "prompt (--prompt, --prompt-file)"); err != nil {
		return nil, err
	}
	req.Options.Stop = append(req.Options.Stop, l.stop...)
	return &GenJob{Req: req, Config: l.cfg, Model: l.em, BOS: l.bos, Prompt: prompt, Evaluator: l.ev, World: l.w}, nil
}

// Describe is the line that says what the job generates from and how.
func (j *GenJob) Describe() string {
	mc, ev, o := j.Model.Config, j.Evaluator, j.Req.Options
	world := ev.Describe()
	if ev.P() > 1 {
		world += " (the cache sharded)"
	}
	how := "greedy"
	if o.Temperature > 0 {
		how = fmt.Sprintf("temperature %g", o.Temperature)
		if o.TopK > 0 {
			how += fmt.Sprintf(", top-k %d", o.TopK)
		}
		if o.TopP > 0 && o.TopP < 1 {
			how += fmt.Sprintf(", top-p %g", o.TopP)
		}
		how += fmt.Sprintf(", seed %d", o.Seed)
	}
	return fmt.Sprintf("generate: %s (%s, LLaMA %s params, %d layers, vocab %d): %d prompt tokens, up to %d new (%s), %s; tokenizer %s",
		j.Model.Describe(), j.Model.Source, data.Count(mc.NumParams()), mc.NLayers, mc.VocabSize, len(j.Prompt), o.MaxNew, how, world, j.Model.Tokenizer.Name())
}

// Run generates sample i (seed Options.Seed + i); emit, when not nil, gets each new token as
// it is chosen.
func (j *GenJob) Run(ctx context.Context, i int, emit func(tok int32)) (Generation, error) {
	o := j.Req.Options
	o.Seed += uint64(i)
	return j.Evaluator.Generate(ctx, j.Prompt, o, emit)
}

// Text is the text of tokens, as the model's tokenizer decodes them.
func (j *GenJob) Text(tokens []int32) string { return string(j.Model.Tokenizer.Decode(tokens)) }
