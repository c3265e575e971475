package evaluate

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"distflash/data"
	"distflash/weights"
)

// TestTextStream: each token's text is returned once whole; a token that ends inside a
// character returns nothing until the character is complete, and Rest is what the whole text
// adds to what was returned.
func TestTextStream(t *testing.T) {
	pieces := map[int32]string{1: "a", 2: "\xc3", 3: "\xa9", 4: "!"}
	s := &TextStream{decode: func(toks []int32) string {
		var b []byte
		for _, tok := range toks {
			b = append(b, pieces[tok]...)
		}
		return string([]rune(string(b))) // an incomplete character decodes as U+FFFD
	}}
	for i, want := range []string{"a", "", "é", "!"} {
		if got := s.Add(int32(i + 1)); got != want {
			t.Errorf("token %d: %q, want %q", i+1, got, want)
		}
	}
	if got := s.Rest("aé!\n"); got != "\n" {
		t.Errorf("Rest: %q", got)
	}
	if got := s.Rest("b"); got != "" {
		t.Errorf("Rest of another text: %q", got)
	}
}

// TestGenSamplesFile: a sample's number and seed count from the request's, its text is its
// tokens decoded, and the file holds the samples with the prompt and the options;
// SentPerToken lists the call sites in order.
func TestGenSamplesFile(t *testing.T) {
	j := &GenJob{Req: GenRequest{Model: "m", Prompt: "hi", Options: GenOptions{MaxNew: 2, Seed: 5}},
		Prompt: []int32{'h', 'i'}, Model: weights.Model{Tokenizer: data.ByteTokenizer{}}}
	g := Generation{Tokens: []int32{'o', 'k'}, Stopped: "length", BytesPerToken: map[string]float64{"wo": 2, "qkv": 1.4}}
	s := j.Sample(1, g)
	if s.Sample != 2 || s.Seed != 6 || s.Text != "ok" {
		t.Errorf("sample %+v", s)
	}
	path := filepath.Join(t.TempDir(), "gen.json")
	if err := j.WriteSamples(path, []GenSample{s}); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Model, Prompt string
		PromptTokens  []int32 `json:"prompt_tokens"`
		Samples       []GenSample
	}
	if err := json.Unmarshal(raw, &back); err != nil || back.Model != "m" || back.Prompt != "hi" || len(back.PromptTokens) != 2 ||
		len(back.Samples) != 1 || back.Samples[0].Text != "ok" || back.Samples[0].Stopped != "length" {
		t.Errorf("%v: %s", err, raw)
	}
	if got, want := g.SentPerToken(), "; sent per token by the busiest rank: qkv 1 B, wo 2 B"; got != want {
		t.Errorf("SentPerToken: %q, want %q", got, want)
	}
	if got := (Generation{}).SentPerToken(); got != "" {
		t.Errorf("one rank: %q", got)
	}
}
