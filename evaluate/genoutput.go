package evaluate

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"distflash/ckpt"
)

// What `distflash generate` makes of its generations: the text as it grows (TextStream), the
// end of its summary line (Generation.SentPerToken) and the file of --out (GenJob.WriteSamples).

// GenSample is one continuation of the prompt as `generate --out` writes it.
type GenSample struct {
	Sample int    `json:"sample"` // from 1
	Seed   uint64 `json:"seed"`
	Text   string `json:"text"`
	Generation
}

// Sample is continuation i's (from 0) record: its number, its seed and its text.
func (j *GenJob) Sample(i int, g Generation) GenSample {
	return GenSample{Sample: i + 1, Seed: j.Req.Options.Seed + uint64(i), Text: j.Text(g.Tokens), Generation: g}
}

// WriteSamples writes the samples with the model, the prompt, its tokens and the options as
// indented JSON to path, atomically.
func (j *GenJob) WriteSamples(path string, samples []GenSample) error {
	js, err := json.MarshalIndent(map[string]any{"model": j.Req.Model, "prompt": j.Req.Prompt, "prompt_tokens": j.Prompt,
		"options": j.Req.Options, "samples": samples}, "", "  ")
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	if err := ckpt.WriteFileAtomic(path, append(js, '\n')); err != nil {
		return fmt.Errorf("generate: --out: %w", err)
	}
	return nil
}

// TextStream turns a generation's tokens, as they come, into the text each adds, for printing
// as it goes.
type TextStream struct {
	decode func([]int32) string
	tokens []int32
	said   string // the text returned so far
}

// Stream is a TextStream of the job's tokenizer.
func (j *GenJob) Stream() *TextStream { return &TextStream{decode: j.Text} }

// Add takes the next token and returns the text it adds. A token may end inside a UTF-8
// character or change how the ones before decode, so the whole text is decoded each time, and
// Add returns "" until the text extends what it returned before with whole characters.
func (s *TextStream) Add(tok int32) string {
	s.tokens = append(s.tokens, tok)
	t := s.decode(s.tokens)
	if !strings.HasPrefix(t, s.said) || strings.HasSuffix(t, "\uFFFD") {
		return ""
	}
	add := t[len(s.said):]
	s.said = t
	return add
}

// Rest is what text, the whole generation's, adds to what Add returned ("" when it does not
// begin with it).
func (s *TextStream) Rest(text string) string {
	if !strings.HasPrefix(text, s.said) {
		return ""
	}
	return text[len(s.said):]
}

// SentPerToken lists the bytes the busiest rank sent per decoded token by call site, as the
// end of generate's summary line ("" on one rank).
func (g Generation) SentPerToken() string {
	if len(g.BytesPerToken) == 0 {
		return ""
	}
	var keys []string
	for k := range g.BytesPerToken {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.0f B", k, g.BytesPerToken[k]))
	}
	return "; sent per token by the busiest rank: " + strings.Join(parts, ", ")
}
