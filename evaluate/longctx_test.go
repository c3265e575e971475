package evaluate

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"distflash/data"
)

// TestPasskeyPrompt: the prompt is Landmark's, the key twice at the depth asked, the filler
// cut from its start on both sides, and passkeyFillerChars gives the longest filler whose
// prompt fits the length (one character more does not).
func TestPasskeyPrompt(t *testing.T) {
	p := PasskeyPrompt(12345, 200, 50)
	for _, want := range []string{passkeyIntro, "The pass key is 12345. Remember it. 12345 is the pass key.\n", "\n" + passkeyQuestion} {
		if !strings.Contains(p, want) {
			t.Errorf("prompt lacks %q:\n%s", want, p)
		}
	}
	if !strings.HasPrefix(p, passkeyIntro+passkeyFiller[:50]+"\nThe pass key") || !strings.HasSuffix(p, "\n"+passkeyQuestion) {
		t.Errorf("prompt's shape:\n%s", p)
	}
	if n := len(p) - len(PasskeyPrompt(12345, 0, 0)); n != 200 {
		t.Errorf("%d filler characters, want 200", n)
	}
	tok, err := data.NewTokenizer("byte")
	if err != nil {
		t.Fatal(err)
	}
	sp, err := data.NewTokenizer("../data/testdata/tok/llama.model")
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range []data.Tokenizer{tok, sp} {
		for _, L := range []int{300, 1000, 4096} {
			f := passkeyFillerChars(tk, 1, L)
			n := len(passkeyTokens(tk, 1, PasskeyPrompt(99999, f, f/2)))
			more := len(passkeyTokens(tk, 1, PasskeyPrompt(99999, f+1, (f+1)/2)))
			if n > L || more <= L || f == 0 {
				t.Errorf("%s, %d tokens: filler %d gives %d tokens, one more %d", tk.Name(), L, f, n, more)
			}
		}
	}
	if f := passkeyFillerChars(tok, -1, 100); f != 0 {
		t.Errorf("a length shorter than the bare prompt: filler %d, want 0", f)
	}
}

// TestPositionBuckets: [0,64), [64,128), doubling, the last cut at n.
func TestPositionBuckets(t *testing.T) {
	for _, c := range []struct {
		n      int
		lo, hi []int
	}{
		{1, []int{0}, []int{1}},
		{64, []int{0}, []int{64}},
		{65, []int{0, 64}, []int{64, 65}},
		{1000, []int{0, 64, 128, 256, 512}, []int{64, 128, 256, 512, 1000}},
	} {
		lo, hi := PositionBuckets(c.n)
		if !slices.Equal(lo, c.lo) || !slices.Equal(hi, c.hi) {
			t.Errorf("n %d: %v %v, want %v %v", c.n, lo, hi, c.lo, c.hi)
		}
	}
}

// TestSlidingWindowScoring: windows of W every S tokens score every target once; the
// targets of the first window have the loss of one forward (the same context), those past it
// another (at most W tokens of context), and a window as long as the sample is truncate.
func TestSlidingWindowScoring(t *testing.T) {
	e := evaluatorOf(t, "../weights/testdata/hf/llama-sharded", 1, "distflash")
	n := 150
	s := Sample{IDs: make([]int32, n), Targets: make([]int32, n)}
	for i := range s.IDs {
		s.IDs[i], s.Targets[i] = int32(40+i%50), int32(40+(i+1)%50)
	}
	whole, err := e.scoreSample(s, EvalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	same, _ := e.scoreSample(s, EvalOptions{Window: n, Stride: 10})
	if !slices.Equal(same, whole) {
		t.Error("a window as long as the sample scored otherwise than one forward")
	}
	const W, S = 40, 10
	win, err := e.scoreSample(s, EvalOptions{Window: W, Stride: S})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(win[:W], whole[:W]) {
		t.Error("the first window's targets differ from one forward's")
	}
	differ := 0
	for p := W; p < n; p++ {
		if win[p] != whole[p] {
			differ++
		}
		// target p was scored by the window starting at the largest multiple of S with p in its last S tokens
		begin := (p - W + S) / S * S
		l, _, err := e.Forward(s.IDs[begin:begin+W], s.Targets[begin:begin+W], nil)
		if err != nil {
			t.Fatal(err)
		}
		if win[p] != l[p-begin] {
			t.Fatalf("target %d: %g, the window [%d, %d) gives %g", p, win[p], begin, begin+W, l[p-begin])
		}
	}
	if differ < (n-W)/2 {
		t.Errorf("only %d of %d targets past the first window changed", differ, n-W)
	}
	for _, o := range []EvalOptions{{Window: 10, Stride: 11}, {Window: 10}, {Stride: 3}, {Window: -1, Stride: 1}} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// TestPositionsAndPasskeyOnRanks: the loss by position and the passkey trials are the same on
// 4 ranks as on one (positions to 1e-6, the trials' answers exactly).
func TestPositionsAndPasskeyOnRanks(t *testing.T) {
	tok, _ := data.NewTokenizer("byte")
	docs := [][]byte{[]byte(strings.Repeat("the quick brown fox jumps over the lazy dog. ", 8)), []byte(strings.Repeat("0123456789", 20))}
	samples, err := CollectSamples(docs, tok, 1, 200, 256, 2)
	if err != nil {
		t.Fatal(err)
	}
	var pos []*PositionResult
	var pk []PasskeyResult
	for _, P := range []int{1, 4} {
		e := evaluatorOf(t, "../weights/testdata/hf/llama-sharded", P, "zigzag")
		r, p, err := e.EvaluateWith(context.Background(), samples, EvalOptions{Positions: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var tokens int64
		var sum float64
		for i := range p.Lo {
			tokens += p.Tokens[i]
			sum += p.Loss[i] * float64(p.Tokens[i])
		}
		if tokens != r.Tokens || math.Abs(sum/float64(tokens)-r.Loss) > 1e-9 {
			t.Errorf("P=%d: buckets hold %d tokens of mean %g, the result %d of %g", P, tokens, sum/float64(tokens), r.Tokens, r.Loss)
		}
		pos = append(pos, p)
		res, err := e.Passkey(context.Background(), tok, 1, nil, PasskeyOptions{Lengths: []int{300, 380}, Trials: 3, DepthBins: 2, Seed: 5}, nil)
		if err != nil {
			t.Fatal(err)
		}
		pk = append(pk, res)
	}
	for i := range pos[0].Loss {
		if d := math.Abs(pos[0].Loss[i] - pos[1].Loss[i]); d > 1e-6*math.Abs(pos[0].Loss[i]) || pos[0].Tokens[i] != pos[1].Tokens[i] {
			t.Errorf("bucket %d: P=1 %g over %d, P=4 %g over %d", i, pos[0].Loss[i], pos[0].Tokens[i], pos[1].Loss[i], pos[1].Tokens[i])
		}
	}
	if len(pk[0].Records) != 6 {
		t.Fatalf("%d passkey records, want 6", len(pk[0].Records))
	}
	for i, a := range pk[0].Records {
		b := pk[1].Records[i]
		if a != b {
			t.Errorf("trial %d: P=1 %+v, P=4 %+v", i, a, b)
		}
		if a.Tokens > a.Length-PasskeyNewTokens || a.Tokens < a.Length-PasskeyNewTokens-40 || a.Key < 10000 || a.Key > 99999 || a.Depth < 0 || a.Depth > 1 {
			t.Errorf("trial %d: %+v", i, a)
		}
	}
}
