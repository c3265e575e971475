package data

import (
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// stream returns n tokens counting from base, so that a window's first token says where it
// came from.
func stream(base, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(base + i)
	}
	return out
}

// TestMixtureOfOneIsTheLoader: a mixture of one source gives the batches, windows and
// position of a Loader over its stream, whatever its weight.
func TestMixtureOfOneIsTheLoader(t *testing.T) {
	toks := stream(0, 1000)
	l, err := NewLoader(toks, 16, 3, 7)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMixture([]MixSource{{Name: "only", Weight: 0.25, Tokens: toks}}, 16, 3, 7)
	if err != nil {
		t.Fatal(err)
	}
	for step := range 50 { // 150 sequences: 2+ epochs of 62 windows
		a, b := l.Next(), m.Next()
		if !slices.Equal(a.Inputs, b.Inputs) || !slices.Equal(a.Targets, b.Targets) || !slices.Equal(a.Windows, b.Windows) {
			t.Fatalf("batch %d differs from the Loader's: windows %v, want %v", step, b.Windows, a.Windows)
		}
		if !slices.Equal(b.Sources, []int{0, 0, 0}) {
			t.Fatalf("batch %d: sources %v, want all 0", step, b.Sources)
		}
	}
	if got, want := m.State().Sources[0].Loader, l.State(); got != want {
		t.Errorf("state %+v, want the Loader's %+v", got, want)
	}
	if got := m.Epochs()[0]; got != 2 {
		t.Errorf("epochs %d after 150 of 62 windows, want 2", got)
	}
}

// newTestMixture is a mixture of three sources of different sizes and weights.
func newTestMixture(t *testing.T, seed uint64) *Mixture {
	t.Helper()
	m, err := NewMixture([]MixSource{
		{Name: "web", Weight: 6, Tokens: stream(0, 5000)},
		{Name: "code", Weight: 3, Tokens: stream(100000, 800)},
		{Name: "books", Weight: 1, Tokens: stream(200000, 3000)},
	}, 8, 4, seed)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMixtureSequencesAreTheirSourcesWindows: every sequence is the window of its source that
// Batch.Windows names (inputs and targets), and within each epoch a source gives each of its
// windows once.
func TestMixtureSequencesAreTheirSourcesWindows(t *testing.T) {
	m := newTestMixture(t, 1)
	bases := []int32{0, 100000, 200000}
	seen := make([]map[int]int, 3) // per source: window → times drawn
	for i := range seen {
		seen[i] = map[int]int{}
	}
	for range 500 {
		b := m.Next()
		for i := range b.B {
			s, w := b.Sources[i], b.Windows[i]
			for k := range b.T {
				if in, tg := b.Inputs[i*b.T+k], b.Targets[i*b.T+k]; in != bases[s]+int32(w*8+k) || tg != in+1 {
					t.Fatalf("sequence %d: source %d window %d: token %d is %d → %d, want %d → %d", i, s, w, k, in, tg, bases[s]+int32(w*8+k), bases[s]+int32(w*8+k)+1)
				}
			}
			seen[s][w]++
		}
	}
	drawn, epochs, windows := m.Drawn(), m.Epochs(), m.Windows()
	for s := range 3 {
		// Windows drawn in completed epochs appear epochs+1 times, the rest epochs times.
		inCurrent := int(drawn[s] - epochs[s]*int64(windows[s]))
		counts := map[int]int{}
		for w := range windows[s] {
			counts[seen[s][w]]++
		}
		want := map[int]int{int(epochs[s]): windows[s] - inCurrent}
		if inCurrent > 0 {
			want[int(epochs[s])+1] = inCurrent
		}
		delete(want, 0)
		delete(counts, 0)
		if !reflect.DeepEqual(counts, want) {
			t.Errorf("source %d: %d drawn of %d windows (%d epochs): times drawn → windows %v, want %v", s, drawn[s], windows[s], epochs[s], counts, want)
		}
	}
	if epochs[1] < 2 {
		t.Errorf("code (99 windows, weight 0.3 of 2000 sequences) ran through %d epochs, want several", epochs[1])
	}
}

// TestMixtureShares: the sources' shares of the sequences drawn are their weights, within 5
// standard deviations of the binomial count (a real bias of 1% in 40,000 draws is 4.6 σ for a
// weight of 0.3, and a wrong cumulative table far more).
func TestMixtureShares(t *testing.T) {
	m := newTestMixture(t, 42)
	const n = 40000
	for range n / 4 {
		m.Next()
	}
	for i, w := range m.Weights() {
		got := float64(m.Drawn()[i])
		sd := math.Sqrt(n * w * (1 - w))
		if math.Abs(got-n*w) > 5*sd {
			t.Errorf("source %s: %v of %d sequences, want %.0f ± %.0f (weight %.2f)", m.Names()[i], got, n, n*w, 5*sd, w)
		}
	}
	if got := m.Weights(); math.Abs(got[0]-0.6) > 1e-15 || math.Abs(got[2]-0.1) > 1e-15 {
		t.Errorf("normalized weights %v, want 0.6 0.3 0.1", got)
	}
}

// TestMixtureSeed: the draws are a function of the seed: the same seed gives the same batches,
// another seed others.
func TestMixtureSeed(t *testing.T) {
	a, b, c := newTestMixture(t, 5), newTestMixture(t, 5), newTestMixture(t, 6)
	differ := false
	for range 20 {
		x, y, z := a.Next(), b.Next(), c.Next()
		if !reflect.DeepEqual(x, y) {
			t.Fatal("two mixtures of one seed gave different batches")
		}
		differ = differ || !slices.Equal(x.Sources, z.Sources)
	}
	if !differ {
		t.Error("seeds 5 and 6 drew the same sources for 80 sequences")
	}
}

// TestMixtureRestore: a mixture restored from the JSON of another's state, taken at several
// points (mid-epoch, after sources ran out), yields exactly what the other yields from there.
func TestMixtureRestore(t *testing.T) {
	for _, at := range []int{0, 1, 7, 130, 411} {
		orig := newTestMixture(t, 9)
		for range at {
			orig.Next()
		}
		js, err := json.Marshal(orig.State())
		if err != nil {
			t.Fatal(err)
		}
		var st MixtureState
		if err := json.Unmarshal(js, &st); err != nil {
			t.Fatal(err)
		}
		resumed := newTestMixture(t, 9)
		if err := resumed.Restore(st); err != nil {
			t.Fatal(err)
		}
		for k := range 60 {
			if x, y := orig.Next(), resumed.Next(); !reflect.DeepEqual(x, y) {
				t.Fatalf("restored after %d batches: batch %d differs: sources %v windows %v, want %v %v", at, k, y.Sources, y.Windows, x.Sources, x.Windows)
			}
		}
		if !slices.Equal(orig.Drawn(), resumed.Drawn()) || !slices.Equal(orig.Epochs(), resumed.Epochs()) {
			t.Errorf("restored after %d: drawn %v epochs %v, want %v %v", at, resumed.Drawn(), resumed.Epochs(), orig.Drawn(), orig.Epochs())
		}
	}
}

// TestMixtureRefusals: what NewMixture and Restore refuse, each with a message that says why.
func TestMixtureRefusals(t *testing.T) {
	ok := stream(0, 100)
	for _, tc := range []struct {
		name    string
		sources []MixSource
		want    string
	}{
		{"none", nil, "at least one source"},
		{"same name", []MixSource{{"a", 1, ok}, {"a", 1, ok}}, `both named "a"`},
		{"zero weight", []MixSource{{"a", 1, ok}, {"b", 0, ok}}, `source "b": weight 0`},
		{"NaN weight", []MixSource{{"a", math.NaN(), ok}}, "weight NaN"},
		{"Inf weight", []MixSource{{"a", 1, ok}, {"b", math.Inf(1), ok}}, "weight +Inf"},
		{"short source", []MixSource{{"a", 1, ok}, {"b", 1, stream(0, 8)}}, `source "b": 8 tokens are too few for one sequence of seq_len 8 (it needs 9`},
		{"one short source", []MixSource{{"a", 1, stream(0, 20)}}, "too few for one batch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewMixture(tc.sources, 8, 4, 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	m := newTestMixture(t, 1)
	m.Next()
	st := m.State()
	renamed := st
	renamed.Sources = slices.Clone(st.Sources)
	renamed.Sources[2].Name = "novels"
	if err := newTestMixture(t, 1).Restore(renamed); err == nil || !strings.Contains(err.Error(), `saved with the sources ["web" "code" "novels"]`) {
		t.Errorf("restore of renamed sources: %v", err)
	}
	bad := st
	bad.Drawn++
	if err := newTestMixture(t, 1).Restore(bad); err == nil || !strings.Contains(err.Error(), "add up to") {
		t.Errorf("restore of inconsistent draws: %v", err)
	}
	if err := newTestMixture(t, 2).Restore(st); err == nil || !strings.Contains(err.Error(), `source "web": data: restore loader state: seed`) {
		t.Errorf("restore onto another seed: %v", err)
	}
	if err := newTestMixture(t, 1).RestoreLoader(st.Sources[0].Loader); err == nil || !strings.Contains(err.Error(), "mixes 3 sources") {
		t.Errorf("restore of one source's position: %v", err)
	}
}
