package data

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// ramp returns the stream 0, 1, ..., n-1, in which a window's first token names it.
func ramp(n int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(i)
	}
	return s
}

func mustLoader(t *testing.T, tokens []int32, seqLen, batchSize int, seed uint64) *Loader {
	t.Helper()
	l, err := NewLoader(tokens, seqLen, batchSize, seed)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// windowsOf returns the window index of each row of a batch over an iota stream.
func windowsOf(t *testing.T, b Batch) []int {
	t.Helper()
	var w []int
	for r := range b.B {
		first := int(b.Inputs[r*b.T])
		if first%b.T != 0 {
			t.Fatalf("row %d starts at token %d, not at a multiple of T = %d", r, first, b.T)
		}
		w = append(w, first/b.T)
	}
	return w
}

func TestNewLoaderErrors(t *testing.T) {
	tests := []struct {
		name          string
		n, seqLen, bs int
		want          []string
	}{
		{"zero seq_len", 100, 0, 2, []string{"seq_len = 0"}},
		{"negative seq_len", 100, -3, 2, []string{"seq_len = -3"}},
		{"zero batch", 100, 4, 0, []string{"batch_size = 0"}},
		{"negative batch", 100, 4, -1, []string{"batch_size = -1"}},
		{"too few", 10, 4, 3, []string{"10 tokens", "needs 13 tokens"}},
		{"one short", 12, 4, 3, []string{"12 tokens", "needs 13 tokens"}},
		{"empty", 0, 1, 1, []string{"0 tokens", "needs 2 tokens"}},
		{"overflow", 100, math.MaxInt / 2, 3, []string{"overflows"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewLoader(ramp(tt.n), tt.seqLen, tt.bs, 1)
			if err == nil {
				t.Fatal("no error")
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestLoaderWindows(t *testing.T) {
	tests := []struct{ n, seqLen, bs, want int }{
		{13, 4, 3, 3}, // exactly one batch
		{16, 4, 1, 3}, // 16 tokens: windows need T+1, so the 4th would need token 16
		{17, 4, 1, 4},
		{1001, 10, 7, 100},
		{2, 1, 1, 1},
	}
	for _, tt := range tests {
		l := mustLoader(t, ramp(tt.n), tt.seqLen, tt.bs, 1)
		if got := l.Windows(); got != tt.want {
			t.Errorf("%d tokens, seq_len %d: %d windows, want %d", tt.n, tt.seqLen, got, tt.want)
		}
	}
}

func TestLoaderTargetsShifted(t *testing.T) {
	// A random stream: every row must be a window tokens[w*T : w*T+T] with the targets
	// tokens[w*T+1 : w*T+T+1].
	r := rand.New(rand.NewPCG(3, 4))
	tokens := make([]int32, 5000)
	for i := range tokens {
		tokens[i] = r.Int32N(1 << 30) // distinct enough that a row locates its window
	}
	const T, B = 16, 5
	l := mustLoader(t, tokens, T, B, 9)
	for range 200 {
		b := l.Next()
		if b.B != B || b.T != T || len(b.Inputs) != B*T || len(b.Targets) != B*T {
			t.Fatalf("batch shape B %d T %d, %d inputs, %d targets", b.B, b.T, len(b.Inputs), len(b.Targets))
		}
		for row := range B {
			in, tg := b.Inputs[row*T:(row+1)*T], b.Targets[row*T:(row+1)*T]
			w := -1
			for s := 0; s+T < len(tokens); s += T {
				if slices.Equal(tokens[s:s+T], in) {
					w = s / T
					break
				}
			}
			if w < 0 {
				t.Fatalf("row %d is not a window of the stream", row)
			}
			if !slices.Equal(tg, tokens[w*T+1:w*T+T+1]) {
				t.Fatalf("window %d: targets are not the inputs shifted by one", w)
			}
		}
	}
}

func TestLoaderEpochs(t *testing.T) {
	tests := []struct{ n, seqLen, bs int }{
		{1001, 10, 5},  // 100 windows, batches align with epochs
		{1001, 10, 7},  // 100 windows, batches span epoch boundaries
		{1001, 10, 1},  // one window per batch
		{301, 10, 30},  // one batch per epoch
		{1005, 10, 64}, // batch larger than half an epoch
		{7, 3, 2},      // 2 windows, tokens left over
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("n%d_T%d_B%d", tt.n, tt.seqLen, tt.bs), func(t *testing.T) {
			l := mustLoader(t, ramp(tt.n), tt.seqLen, tt.bs, 5)
			W := l.Windows()
			const epochs = 4
			var stream []int
			for len(stream) < epochs*W {
				b := l.Next()
				for i := range b.Inputs {
					if b.Targets[i] != b.Inputs[i]+1 {
						t.Fatalf("target %d = %d after input %d", i, b.Targets[i], b.Inputs[i])
					}
				}
				stream = append(stream, windowsOf(t, b)...)
				st := l.State()
				if k := int64(len(stream)); st.Epoch != k/int64(W) || st.Index != k%int64(W) {
					t.Fatalf("after %d windows the state is %+v, want epoch %d index %d", k, st, k/int64(W), k%int64(W))
				}
			}
			var orders [][]int
			for e := range epochs {
				order := stream[e*W : (e+1)*W]
				if got := slices.Sorted(slices.Values(order)); !slices.Equal(got, seq(W)) {
					t.Fatalf("epoch %d did not visit each of the %d windows once: %v", e, W, order)
				}
				orders = append(orders, order)
			}
			if W >= 10 && (slices.Equal(orders[0], orders[1]) || slices.Equal(orders[0], seq(W))) {
				t.Errorf("epoch orders are not shuffled afresh each epoch: %v, %v", orders[0], orders[1])
			}
		})
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func TestLoaderDeterminism(t *testing.T) {
	tokens := ramp(2001)
	run := func(seed uint64) []int {
		l := mustLoader(t, tokens, 8, 4, seed)
		var w []int
		for range 150 { // 2.4 epochs of 250 windows
			w = append(w, windowsOf(t, l.Next())...)
		}
		return w
	}
	a, b, c := run(11), run(11), run(12)
	if !slices.Equal(a, b) {
		t.Error("two loaders with the same seed yield different batches")
	}
	if slices.Equal(a[:250], c[:250]) {
		t.Error("seeds 11 and 12 give the same first epoch")
	}
}

func TestLoaderRestore(t *testing.T) {
	const n, T, B, seed = 201, 10, 3, 77 // 20 windows: batches span epoch boundaries
	tokens := ramp(n)
	tests := []struct {
		name  string
		after int // batches taken before the state is saved
	}{
		{"start", 0},
		{"mid epoch", 2},
		{"last batch spans the boundary", 6}, // 18 windows taken: the next batch takes 2 + 1
		{"just after a spanning batch", 7},   // epoch 1, index 1
		{"at an epoch boundary", 20},         // 60 windows: epoch 3, index 0
		{"later epoch", 33},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := mustLoader(t, tokens, T, B, seed)
			for range tt.after {
				orig.Next()
			}
			st := orig.State()
			js, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			var back LoaderState
			if err := json.Unmarshal(js, &back); err != nil {
				t.Fatal(err)
			}
			if back != st {
				t.Fatalf("JSON round trip %s gave %+v, want %+v", js, back, st)
			}
			var want []Batch
			for range 25 {
				want = append(want, orig.Next())
			}
			fresh := mustLoader(t, tokens, T, B, seed)
			ahead := mustLoader(t, tokens, T, B, seed) // restored backwards from further on
			for range 41 {
				ahead.Next()
			}
			for _, l := range []*Loader{fresh, ahead} {
				if err := l.Restore(back); err != nil {
					t.Fatal(err)
				}
				if got := l.State(); got != st {
					t.Errorf("State after Restore = %+v, want %+v", got, st)
				}
				for i, w := range want {
					g := l.Next()
					if !slices.Equal(g.Inputs, w.Inputs) || !slices.Equal(g.Targets, w.Targets) {
						t.Fatalf("batch %d after restoring %+v: windows %v, want %v", i, st, windowsOf(t, g), windowsOf(t, w))
					}
				}
			}
		})
	}
}

func TestLoaderRestoreEndOfEpoch(t *testing.T) {
	// Index == Windows means the start of the next epoch.
	a := mustLoader(t, ramp(101), 10, 2, 3)
	b := mustLoader(t, ramp(101), 10, 2, 3)
	if err := a.Restore(LoaderState{Epoch: 4, Index: 10, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(LoaderState{Epoch: 5, Index: 0, Seed: 3, Windows: 10}); err != nil {
		t.Fatal(err)
	}
	if a.State() != b.State() {
		t.Fatalf("states %+v and %+v differ", a.State(), b.State())
	}
	if x, y := a.Next(), b.Next(); !slices.Equal(x.Inputs, y.Inputs) {
		t.Error("index == windows does not continue as the next epoch's start")
	}
}

func TestLoaderRestoreErrors(t *testing.T) {
	tests := []struct {
		name string
		s    LoaderState
		want []string
	}{
		{"other seed", LoaderState{Seed: 2}, []string{"seed 2", "seed is 1"}},
		{"other data", LoaderState{Seed: 1, Windows: 99}, []string{"99 windows", "has 10"}},
		{"negative epoch", LoaderState{Seed: 1, Epoch: -1}, []string{"epoch -1"}},
		{"negative index", LoaderState{Seed: 1, Index: -1}, []string{"index -1"}},
		{"index past the end", LoaderState{Seed: 1, Index: 11}, []string{"index 11", "<= 10"}},
		{"epoch overflow", LoaderState{Seed: 1, Epoch: math.MaxInt64, Index: 10}, []string{"overflows"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustLoader(t, ramp(101), 10, 2, 1)
			l.Next()
			before := l.State()
			err := l.Restore(tt.s)
			if err == nil {
				t.Fatal("no error")
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if l.State() != before {
				t.Errorf("a failed Restore moved the loader from %+v to %+v", before, l.State())
			}
		})
	}
}

func TestSplit(t *testing.T) {
	tests := []struct {
		n         int
		frac      float64
		wantEval  int
		wantTrain int
	}{
		{100, 0, 0, 100},
		{100, 0.1, 10, 90},
		{100, 0.5, 50, 50},
		{100, 0.999, 99, 1},
		{100, 1, 100, 0},
		{100, 2, 100, 0},
		{100, -0.5, 0, 100},
		{100, math.NaN(), 0, 100},
		{7, 0.3, 2, 5}, // floor(2.1)
		{0, 0.5, 0, 0},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d_%g", tt.n, tt.frac), func(t *testing.T) {
			tokens := ramp(tt.n)
			train, eval := Split(tokens, tt.frac)
			if len(train) != tt.wantTrain || len(eval) != tt.wantEval {
				t.Fatalf("got %d train and %d eval tokens, want %d and %d", len(train), len(eval), tt.wantTrain, tt.wantEval)
			}
			if !slices.Equal(slices.Concat(train, eval), tokens) {
				t.Fatal("train followed by eval is not the stream")
			}
			if len(eval) > 0 {
				first := eval[0]
				_ = append(train, -1)
				if eval[0] != first {
					t.Error("appending to train overwrote eval")
				}
			}
		})
	}
}
