package evaluate

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"

	"distflash/data"
	"distflash/plan"
)

// Passkey retrieval (eval --task passkey): the protocol of Landmark Attention (arXiv
// 2305.16300) that Position Interpolation, YaRN and LongLoRA reuse. A prompt of a given length
// hides a random 5-digit key in filler at a uniform random depth:
//
//	There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz you about the important information there.
//	<filler prefix>
//	The pass key is K. Remember it. K is the pass key.
//	<filler suffix>
//	What is the pass key? The pass key is
//
// The filler is "The grass is green. The sky is blue. The sun is yellow. Here we go. There
// and back again. " repeated and cut to a character count, prefix and suffix each cut from its
// start; the prefix is uniform in [0, the filler's characters], so the depth (prefix /
// filler) is uniform in [0, 1]. A length is the whole sequence's: the character count is the
// largest whose prompt (BOS included) with the key halfway leaves room for the
// PasskeyNewTokens generated tokens within the length.
//
// Two scorings of each trial:
//   - generated: greedy decoding of PasskeyNewTokens tokens (stopping at EOS); right when the
//     first integer in the text (\d+) is K, as Landmark and YaRN score it;
//   - teacher-forced: the key's tokens (" K") appended to the prompt and one forward on the
//     sequence-parallel ranks; right when the logits' argmax at each of the key's tokens is
//     that token, as EasyContext's needle test scores it (no generation, no cache).

// PasskeyNewTokens is how many tokens the generated scoring decodes.
const PasskeyNewTokens = 10

const (
	passkeyIntro    = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz you about the important information there.\n"
	passkeyFiller   = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
	passkeyQuestion = "What is the pass key? The pass key is"
)

// PasskeyPrompt is the prompt of a trial with key and fillerChars characters of filler, the
// first prefix of them before the key.
func PasskeyPrompt(key, fillerChars, prefix int) string {
	filler := strings.Repeat(passkeyFiller, fillerChars/len(passkeyFiller)+1)
	return passkeyIntro + filler[:prefix] + "\n" +
		fmt.Sprintf("The pass key is %d. Remember it. %d is the pass key.\n", key, key) +
		filler[:fillerChars-prefix] + "\n" + passkeyQuestion
}

// PasskeyOptions are the trials of a passkey evaluation.
type PasskeyOptions struct {
	Lengths   []int  // sequence lengths in tokens: the prompt (BOS included) and the generated tokens
	Trials    int    // trials per length
	DepthBins int    // depth bins of the heat map
	Seed      uint64 // keys and depths
}

// PasskeyTrial is one trial's prompt and answers.
type PasskeyTrial struct {
	Length    int     `json:"length"`     // the length asked for
	Tokens    int     `json:"tokens"`     // the prompt's tokens
	Depth     float64 `json:"depth"`      // where the key sits in the filler, 0 (start) to 1 (end)
	Key       int     `json:"key"`        // the pass key
	Generated string  `json:"generated"`  // the greedy continuation
	GenOK     bool    `json:"gen_ok"`     // its first integer is the key
	ForcedOK  bool    `json:"forced_ok"`  // teacher-forced: every key token is the argmax
	ForcedHit int     `json:"forced_hit"` // key tokens that were the argmax
	KeyTokens int     `json:"key_tokens"` // the key's tokens (" K")
}

// PasskeyScore is one scoring's counts by length and depth bin.
type PasskeyScore struct {
	Correct  [][]int   `json:"correct"`  // [length][depth bin]
	Trials   [][]int   `json:"trials"`   // [length][depth bin]
	Accuracy []float64 `json:"accuracy"` // per length
}

// PasskeyResult is a passkey evaluation.
type PasskeyResult struct {
	Lengths   []int          `json:"lengths"`
	Depths    []float64      `json:"depths"` // the depth bins' centres
	Trials    int            `json:"trials"` // per length
	Seed      uint64         `json:"seed"`
	Generated PasskeyScore   `json:"generated"`
	Forced    PasskeyScore   `json:"teacher_forced"`
	Records   []PasskeyTrial `json:"records"`
}

// Validate reports options that cannot run, for a model of maxSeqLen positions.
func (o PasskeyOptions) Validate(maxSeqLen int) error {
	switch {
	case len(o.Lengths) == 0:
		return fmt.Errorf("eval: --task passkey needs --lengths, e.g. 1K,2K,4K")
	case o.Trials < 1:
		return fmt.Errorf("eval: --trials %d: want at least 1", o.Trials)
	case o.DepthBins < 1:
		return fmt.Errorf("eval: --depth-bins %d: want at least 1", o.DepthBins)
	}
	for i, l := range o.Lengths {
		if i > 0 && l <= o.Lengths[i-1] {
			return fmt.Errorf("eval: --lengths: want increasing lengths, %d after %d", l, o.Lengths[i-1])
		}
		if l > maxSeqLen {
			return fmt.Errorf("eval: --lengths %d exceeds the model's longest sequence, %d (max_seq_len / max_position_embeddings)", l, maxSeqLen)
		}
	}
	return nil
}

var firstInteger = regexp.MustCompile(`\d+`)

// passkeyTokens is the prompt's tokens: bos (when >= 0) and text's.
func passkeyTokens(tok data.Tokenizer, bos int32, text string) []int32 {
	ids := tok.Encode([]byte(text))
	if bos >= 0 {
		ids = append([]int32{bos}, ids...)
	}
	return ids
}

// passkeyFillerChars is the largest filler whose prompt, key halfway, has at most length
// tokens (0 when not even the empty filler fits).
func passkeyFillerChars(tok data.Tokenizer, bos int32, length int) int {
	fits := func(f int) bool { return len(passkeyTokens(tok, bos, PasskeyPrompt(99999, f, f/2))) <= length }
	return plan.LargestFitting(fits, math.MaxInt/2)
}

// Passkey runs the trials of opt with the model's tokenizer tok and BOS (−1: none); stop
// are the tokens that end a generation (EOS). progress, when not nil, is called after each
// trial. Lengths use their own random streams, so a length's trials do not depend on the
// others asked for.
func (e *Evaluator) Passkey(ctx context.Context, tok data.Tokenizer, bos int32, stop []int32, opt PasskeyOptions, progress func(done, total int)) (PasskeyResult, error) {
	if err := opt.Validate(e.Config.MaxSeqLen); err != nil {
		return PasskeyResult{}, err
	}
	res := PasskeyResult{Lengths: opt.Lengths, Trials: opt.Trials, Seed: opt.Seed}
	for b := range opt.DepthBins {
		res.Depths = append(res.Depths, (float64(b)+0.5)/float64(opt.DepthBins))
	}
	grid := func() [][]int {
		g := make([][]int, len(opt.Lengths))
		for i := range g {
			g[i] = make([]int, opt.DepthBins)
		}
		return g
	}
	res.Generated = PasskeyScore{Correct: grid(), Trials: grid(), Accuracy: make([]float64, len(opt.Lengths))}
	res.Forced = PasskeyScore{Correct: grid(), Trials: grid(), Accuracy: make([]float64, len(opt.Lengths))}
	done, total := 0, len(opt.Lengths)*opt.Trials
	for li, length := range opt.Lengths {
		f := passkeyFillerChars(tok, bos, length-PasskeyNewTokens)
		if f == 0 {
			return PasskeyResult{}, fmt.Errorf("eval: --lengths %d: the passkey prompt without filler and %d new tokens are longer (%d tokens)",
				length, PasskeyNewTokens, len(passkeyTokens(tok, bos, PasskeyPrompt(99999, 0, 0)))+PasskeyNewTokens)
		}
		rng := rand.New(rand.NewPCG(opt.Seed, uint64(length)))
		for range opt.Trials {
			if e.stopped(ctx) { // on every rank alike
				return PasskeyResult{}, fmt.Errorf("eval: %w after %d of %d passkey trials; no report was written", ErrStopped, done, total)
			}
			key, prefix := 10000+rng.IntN(90000), rng.IntN(f+1)
			t, err := e.passkeyTrial(ctx, tok, bos, stop, key, f, prefix)
			if err != nil {
				return PasskeyResult{}, fmt.Errorf("eval: passkey at %d tokens: %w", length, err)
			}
			t.Length = length
			bin := min(int(t.Depth*float64(opt.DepthBins)), opt.DepthBins-1)
			res.Generated.Trials[li][bin]++
			res.Forced.Trials[li][bin]++
			if t.GenOK {
				res.Generated.Correct[li][bin]++
				res.Generated.Accuracy[li]++
			}
			if t.ForcedOK {
				res.Forced.Correct[li][bin]++
				res.Forced.Accuracy[li]++
			}
			res.Records = append(res.Records, t)
			done++
			if progress != nil {
				progress(done, total)
			}
		}
		res.Generated.Accuracy[li] /= float64(opt.Trials)
		res.Forced.Accuracy[li] /= float64(opt.Trials)
	}
	return res, nil
}

// passkeyTrial scores one prompt both ways.
func (e *Evaluator) passkeyTrial(ctx context.Context, tok data.Tokenizer, bos int32, stop []int32, key, fillerChars, prefix int) (PasskeyTrial, error) {
	prompt := passkeyTokens(tok, bos, PasskeyPrompt(key, fillerChars, prefix))
	answer := tok.Encode([]byte(" " + strconv.Itoa(key)))
	t := PasskeyTrial{Tokens: len(prompt), Key: key, KeyTokens: len(answer), Depth: float64(prefix) / float64(fillerChars)}

	// teacher-forced: the prompt and the key but its last token, the argmax at the key's
	seq := append(append([]int32{}, prompt...), answer...)
	ids := seq[:len(seq)-1]
	at := make([]int, len(answer))
	for i := range at {
		at[i] = len(prompt) - 1 + i
	}
	targets := make([]int32, len(ids))
	for i := range targets {
		targets[i] = -1
	}
	_, got, err := e.Forward(ids, targets, at)
	if err != nil {
		return t, err
	}
	for i, a := range answer {
		if got[i] == a {
			t.ForcedHit++
		}
	}
	t.ForcedOK = t.ForcedHit == len(answer)

	// generated: greedy, the first integer of the text
	g, err := e.Generate(ctx, prompt, GenOptions{MaxNew: PasskeyNewTokens, Stop: stop}, nil)
	if err != nil {
		return t, err
	}
	t.Generated = string(tok.Decode(g.Tokens))
	if m := firstInteger.FindString(t.Generated); m != "" {
		n, err := strconv.Atoi(m)
		t.GenOK = err == nil && n == key
	}
	return t, nil
}

// ParseLengths reads --lengths: token counts separated by commas, each like 1024, 1K or 1M
// (K = 1024, M = 1024²).
func ParseLengths(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := plan.ParseTokens(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("eval: --lengths %q: want token counts separated by commas, e.g. 1K,2K,4K", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// PasskeyDocuments returns n training documents of the passkey task: each a prompt of
// PasskeyPrompt's shape followed by its answer (" K."), of a length in characters drawn
// uniformly from [minChars, maxChars], with a key and a depth drawn as the evaluation draws
// them. A model trained on them learns the retrieval the evaluation asks for; mixed into its
// other data they are how a small model can learn it at all.
func PasskeyDocuments(n, minChars, maxChars int, seed uint64) ([]string, error) {
	bare := len(PasskeyPrompt(99999, 0, 0)) + len(" 99999.")
	if minChars < bare || maxChars < minChars {
		return nil, fmt.Errorf("passkey documents of %d to %d characters: want %d <= min <= max (the prompt without filler has %d)", minChars, maxChars, bare, bare)
	}
	rng := rand.New(rand.NewPCG(seed, 0x9a55))
	docs := make([]string, n)
	for i := range docs {
		f := minChars + rng.IntN(maxChars-minChars+1) - bare
		key, prefix := 10000+rng.IntN(90000), rng.IntN(f+1)
		docs[i] = PasskeyPrompt(key, f, prefix) + " " + strconv.Itoa(key) + "."
	}
	return docs, nil
}
