package runplot

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg"

	"distflash/runplot/runplottest"
)

// examplePasskey is two scorings of passkey retrieval at 1K–8K tokens and 5 depths: greedy
// generation fails at 8K in the middle, teacher forcing less so; one cell has no trials.
func examplePasskey() []PasskeyGrid {
	lengths := []int{1024, 2048, 4096, 8192}
	depths := []float64{0.1, 0.3, 0.5, 0.7, 0.9}
	gen := PasskeyGrid{Title: "generated (greedy)", Lengths: lengths, Depths: depths,
		Correct: [][]int{{4, 4, 4, 4, 4}, {4, 4, 3, 4, 4}, {3, 2, 1, 2, 4}, {1, 0, 0, 0, 2}},
		Trials:  [][]int{{4, 4, 4, 4, 4}, {4, 4, 4, 4, 4}, {4, 4, 4, 4, 4}, {4, 4, 4, 4, 4}}}
	tf := PasskeyGrid{Title: "teacher-forced", Lengths: lengths, Depths: depths,
		Correct: [][]int{{4, 4, 4, 4, 4}, {4, 4, 4, 4, 4}, {4, 3, 3, 3, 4}, {2, 1, 0, 0, 3}},
		Trials:  [][]int{{4, 4, 4, 4, 4}, {4, 4, 4, 4, 4}, {4, 4, 4, 4, 4}, {4, 4, 4, 0, 4}}}
	return []PasskeyGrid{gen, tf}
}

// examplePositions is three models' loss by position in 8 log-spaced buckets up to 8K: one
// trained at 1K whose loss rises past it, one with an empty last bucket.
func examplePositions() []PositionSeries {
	lo := []int{0, 64, 128, 256, 512, 1024, 2048, 4096}
	hi := []int{64, 128, 256, 512, 1024, 2048, 4096, 8192}
	tokens := []int64{4096, 4096, 8192, 16384, 32768, 65536, 131072, 262144}
	series := []PositionSeries{
		{Name: "llama-1k (rope 10k)", TrainLen: 1024, Loss: []float64{4.1, 3.5, 3.2, 3.0, 2.9, 3.4, 4.3, 5.2}},
		{Name: "llama-8k (rope 500k)", TrainLen: 8192, Loss: []float64{4.2, 3.6, 3.3, 3.05, 2.9, 2.8, 2.75, 2.7}},
		{Name: "llama-4k-yarn", Loss: []float64{4.15, 3.55, 3.25, 3.02, 2.92, 2.85, 2.9, math.NaN()}},
	}
	for i := range series {
		series[i].Lo, series[i].Hi = lo, hi
		series[i].Tokens = append([]int64(nil), tokens...)
	}
	series[2].Tokens[7] = 0
	return series
}

// keepExample copies the picture at path into $RUNPLOT_EXAMPLES, when set, to look at.
func keepExample(t *testing.T, path string) {
	t.Helper()
	dir := os.Getenv("RUNPLOT_EXAMPLES")
	if dir == "" {
		return
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(path)), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// decodeFile decodes the PNG at path and checks its size, w × h at 100 dpi.
func decodeFile(t *testing.T, path string, w, h vg.Length) image.Image {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	wantW, wantH := int(math.Round(float64(w/vg.Inch)*plotDPI)), int(math.Round(float64(h/vg.Inch)*plotDPI))
	if b := img.Bounds(); b.Dx() != wantW || b.Dy() != wantH {
		t.Fatalf("%s: %dx%d pixels, want %dx%d", path, b.Dx(), b.Dy(), wantW, wantH)
	}
	return img
}

// svgText returns the texts of the SVG at path, one a line.
func svgText(t *testing.T, path string) string {
	t.Helper()
	_, texts := runplottest.SVGTexts(t, path)
	return strings.Join(texts, "\n")
}

// TestWritePasskey draws two scorings: the PNG has its size, cells of accuracy 0 and 1 and an
// empty cell in their colours; the SVG has the titles with overall accuracies, the axes'
// labels, cell texts and the colour bar.
func TestWritePasskey(t *testing.T) {
	dir := t.TempDir()
	grids := examplePasskey()
	out := filepath.Join(dir, "passkey.png")
	if err := WritePasskey(out, "passkey retrieval: llama-1k", grids); err != nil {
		t.Fatal(err)
	}
	keepExample(t, out)
	w, h := passkeySize(grids)
	img := decodeFile(t, out, w, h)
	// A cell is about 90 × 60 pixels: at least 2000 pixels each, less its text.
	for _, tc := range []struct {
		what string
		c    color.RGBA
		min  int
	}{{"accuracy 0", heatColor(0), 4 * 2000}, {"accuracy 1", heatColor(1), 20 * 2000}, {"no trials", noTrialsColor, 2000}} {
		if n := countColor(img, tc.c); n < tc.min {
			t.Errorf("%s: %d pixels of its colour %v, want ≥ %d", tc.what, n, tc.c, tc.min)
		}
	}

	svg := filepath.Join(dir, "passkey.svg")
	if err := WritePasskey(svg, "passkey retrieval: llama-1k", grids); err != nil {
		t.Fatal(err)
	}
	all := svgText(t, svg)
	for _, want := range []string{"passkey retrieval: llama-1k", "generated (greedy): accuracy 0.68 (54/80)",
		"teacher-forced: accuracy 0.83 (63/76)", "1K", "2K", "4K", "8K", "10%", "30%", "90%",
		"context length (tokens)", "depth of the key (0% = start of the filler)", "accuracy", "0.25", "no trials",
		"0.75", "3/4", "0.00", "0/4", "1.00", "4/4", "–"} {
		if !strings.Contains(all, want) {
			t.Errorf("SVG has no text %q; texts:\n%s", want, all)
		}
	}
}

// TestWritePasskeyShapes: a single cell, a large grid whose cells are too small for the
// fraction, and lengths that are not multiples of 1024 all draw, labelled.
func TestWritePasskeyShapes(t *testing.T) {
	dir := t.TempDir()
	var big PasskeyGrid
	for i := range 14 {
		big.Lengths = append(big.Lengths, 1000*(i+1))
		big.Correct, big.Trials = append(big.Correct, nil), append(big.Trials, nil)
		for j := range 20 {
			if i == 0 {
				big.Depths = append(big.Depths, (float64(j)+0.5)/20)
			}
			big.Correct[i] = append(big.Correct[i], (i+j)%11)
			big.Trials[i] = append(big.Trials[i], 10)
		}
	}
	one := PasskeyGrid{Lengths: []int{3 << 20}, Depths: []float64{0}, Correct: [][]int{{0}}, Trials: [][]int{{0}}}
	for _, tc := range []struct {
		name  string
		grids []PasskeyGrid
		want  []string
		not   []string
	}{
		{"one", []PasskeyGrid{one}, []string{"3M", "0%", "no trials"}, nil},
		{"big", []PasskeyGrid{big, one}, []string{"1000", "14000", "2.5%", "97.5%", "0.90"}, []string{"9/10"}},
	} {
		out := filepath.Join(dir, tc.name+".svg")
		if err := WritePasskey(out, tc.name, tc.grids); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		all := svgText(t, out)
		for _, w := range tc.want {
			if !strings.Contains(all, w) {
				t.Errorf("%s: SVG has no text %q; texts:\n%s", tc.name, w, all)
			}
		}
		for _, w := range tc.not {
			if strings.Contains(all, w) {
				t.Errorf("%s: SVG has text %q, which should not fit", tc.name, w)
			}
		}
	}
	png := filepath.Join(dir, "big.png")
	if err := WritePasskey(png, "big", []PasskeyGrid{big}); err != nil {
		t.Fatal(err)
	}
	keepExample(t, png)
	w, h := passkeySize([]PasskeyGrid{big})
	decodeFile(t, png, w, h)
}

// TestWritePositions draws three models: the PNG has its size and each model's colour; the
// SVG has the title, the names, the summaries and the axes' labels.
func TestWritePositions(t *testing.T) {
	dir := t.TempDir()
	series := examplePositions()
	out := filepath.Join(dir, "positions.png")
	if err := WritePositions(out, "loss by position: wikitext eval, 8K tokens", series); err != nil {
		t.Fatal(err)
	}
	keepExample(t, out)
	img := decodeFile(t, out, positionsW, positionsH)
	for i := range series {
		if n := countColor(img, plotColors[i]); n < 500 {
			t.Errorf("series %d: %d pixels of its colour %v, want its line (≥ 500)", i, n, plotColors[i])
		}
	}
	if n := countColor(img, plotColors[3]); n > 0 {
		t.Errorf("%d pixels of a fourth series' colour, with three series", n)
	}

	svg := filepath.Join(dir, "positions.svg")
	if err := WritePositions(svg, "loss by position: wikitext eval, 8K tokens", series); err != nil {
		t.Fatal(err)
	}
	all := svgText(t, svg)
	for _, want := range []string{"loss by position: wikitext eval, 8K tokens", "llama-1k (rope 10k)", "llama-8k (rope 500k)",
		"llama-4k-yarn", "trained at 1K,  524k tokens", "trained at 8K", "token position (log scale)", "loss (nats/token)",
		"64", "dashed vertical line: the training length", "256", "1K", "4K", "8K"} {
		if !strings.Contains(all, want) {
			t.Errorf("SVG has no text %q; texts:\n%s", want, all)
		}
	}
}

// TestWritePositionsEdges: a series of one bucket, one with every bucket empty, one with a
// gap, and many series all draw.
func TestWritePositionsEdges(t *testing.T) {
	dir := t.TempDir()
	nan := math.NaN()
	one := PositionSeries{Name: "one", Lo: []int{0}, Hi: []int{64}, Loss: []float64{3}, Tokens: []int64{64}}
	empty := PositionSeries{Name: "empty", Lo: []int{0, 64}, Hi: []int{64, 128}, Loss: []float64{nan, nan}, Tokens: []int64{0, 0}, TrainLen: 128}
	gap := PositionSeries{Name: "gap", Lo: []int{0, 64, 128}, Hi: []int{64, 128, 256}, Loss: []float64{3, nan, 2}, Tokens: []int64{1, 0, 1}}
	var many []PositionSeries
	for i := range 12 {
		s := examplePositions()[i%3]
		s.Name += strings.Repeat(" with a long name", i%2)
		many = append(many, s)
	}
	for _, tc := range []struct {
		name   string
		series []PositionSeries
	}{{"one", []PositionSeries{one}}, {"empty", []PositionSeries{empty}}, {"gap", []PositionSeries{gap, one}}, {"many", many}} {
		for _, ext := range []string{".png", ".svg"} {
			out := filepath.Join(dir, "positions-"+tc.name+ext)
			if err := WritePositions(out, tc.name, tc.series); err != nil {
				t.Errorf("%s%s: %v", tc.name, ext, err)
				continue
			}
			if ext == ".png" {
				keepExample(t, out)
			}
		}
	}
}

// TestEvalPlotErrors: inconsistent input and a bad file name are refused with an error
// naming the fault, and nothing is written, not even a temporary file.
func TestEvalPlotErrors(t *testing.T) {
	good := examplePasskey()
	grid := func(edit func(g *PasskeyGrid)) []PasskeyGrid {
		g := examplePasskey()[0]
		g.Correct = append([][]int(nil), g.Correct...)
		g.Correct[1] = append([]int(nil), g.Correct[1]...)
		edit(&g)
		return []PasskeyGrid{good[1], g}
	}
	series := func(edit func(s *PositionSeries)) []PositionSeries {
		s := examplePositions()
		s[1].Loss = append([]float64(nil), s[1].Loss...)
		edit(&s[1])
		return s
	}
	for _, tc := range []struct {
		name string
		out  string
		err  func(out string) error
		want string
	}{
		{"passkey jpg", "p.jpg", func(o string) error { return WritePasskey(o, "t", good) }, "want a file name ending in .png or .svg"},
		{"no grids", "p.png", func(o string) error { return WritePasskey(o, "t", nil) }, "no grids"},
		{"no lengths", "p.png", func(o string) error {
			return WritePasskey(o, "t", grid(func(g *PasskeyGrid) { g.Lengths = nil }))
		}, `grid 1 ("generated (greedy)"): 0 lengths and 5 depths`},
		{"lengths not ascending", "p.svg", func(o string) error {
			return WritePasskey(o, "t", grid(func(g *PasskeyGrid) { g.Lengths = []int{1024, 4096, 2048, 8192} }))
		}, "context lengths not ascending: Lengths[2] = 2048 after 4096"},
		{"length 0", "p.png", func(o string) error {
			return WritePasskey(o, "t", grid(func(g *PasskeyGrid) { g.Lengths = []int{0, 1, 2, 3} }))
		}, "context length Lengths[0] = 0, want > 0"},
		{"depth above 1", "p.png", func(o string) error {
			return WritePasskey(o, "t", grid(func(g *PasskeyGrid) { g.Depths = []float64{0.1, 0.3, 0.5, 0.7, 1.5} }))
		}, "depth Depths[4] = 1.5, want in [0, 1]"},
		{"depth NaN", "p.png", func(o string) error {
			return WritePasskey(o, "t", grid(func(g *PasskeyGrid) { g.Depths = []float64{math.NaN(), 0.3, 0.5, 0.7, 0.9} }))
		}, "depth Depths[0] = NaN"},
		{"depths not ascending", "p.png", func(o string) error {
			return WritePasskey(o, "t", grid(func(g *PasskeyGrid) { g.Depths = []float64{0.1, 0.3, 0.3, 0.7, 0.9} }))
		}, "depths not ascending: Depths[2] = 0.3 after 0.3"},
		{"rows of Trials", "p.png", func(o string) error {
			return WritePasskey(o, "t", grid(func(g *PasskeyGrid) { g.Trials = g.Trials[:3] }))
		}, "4 rows of Correct and 3 of Trials, want one per length (4)"},
		{"cells of Correct", "p.png", func(o string) error {
			return WritePasskey(o, "t", grid(func(g *PasskeyGrid) { g.Correct[1] = g.Correct[1][:4] }))
		}, "length 2048: 4 cells of Correct and 5 of Trials, want one per depth (5)"},
		{"correct above trials", "p.png", func(o string) error {
			return WritePasskey(o, "t", grid(func(g *PasskeyGrid) { g.Correct[1][2] = 5 }))
		}, "length 2048, depth 0.5: 5 correct of 4 trials"},
		{"negative correct", "p.png", func(o string) error {
			return WritePasskey(o, "t", grid(func(g *PasskeyGrid) { g.Correct[1][0] = -1 }))
		}, "length 2048, depth 0.1: -1 correct of 4 trials"},

		{"positions jpg", "q.jpg", func(o string) error { return WritePositions(o, "t", examplePositions()) }, "want a file name ending in .png or .svg"},
		{"no series", "q.png", func(o string) error { return WritePositions(o, "t", nil) }, "no series"},
		{"bucket counts", "q.png", func(o string) error {
			return WritePositions(o, "t", series(func(s *PositionSeries) { s.Loss = s.Loss[:7] }))
		}, `series 1 ("llama-8k (rope 500k)"): 8 Lo, 8 Hi, 7 Loss and 8 Tokens`},
		{"empty bucket", "q.png", func(o string) error {
			return WritePositions(o, "t", series(func(s *PositionSeries) { s.Hi = []int{64, 128, 256, 512, 1024, 2048, 4096, 4096} }))
		}, "bucket 7 is [4096, 4096), want 0 ≤ lo < hi"},
		{"overlapping buckets", "q.svg", func(o string) error {
			return WritePositions(o, "t", series(func(s *PositionSeries) { s.Lo = []int{0, 64, 100, 256, 512, 1024, 2048, 4096} }))
		}, "bucket 2 [100, 256) starts before bucket 1 ends (128)"},
		{"infinite loss", "q.png", func(o string) error {
			return WritePositions(o, "t", series(func(s *PositionSeries) { s.Loss[3] = math.Inf(1) }))
		}, "bucket 3 [256, 512): loss +Inf, want finite"},
		{"loss of no tokens", "q.png", func(o string) error {
			return WritePositions(o, "t", series(func(s *PositionSeries) { s.Tokens = make([]int64, 8) }))
		}, "bucket 0 [0, 64): loss 4.2 of no tokens, want NaN"},
		{"negative tokens", "q.png", func(o string) error {
			return WritePositions(o, "t", series(func(s *PositionSeries) { s.Tokens = []int64{1, 1, -1, 1, 1, 1, 1, 1} }))
		}, "bucket 2 [128, 256): -1 tokens"},
		{"negative train length", "q.png", func(o string) error {
			return WritePositions(o, "t", series(func(s *PositionSeries) { s.TrainLen = -1 }))
		}, "TrainLen = -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, tc.out)
			err := tc.err(out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
			if err != nil && !strings.Contains(err.Error(), tc.out) {
				t.Errorf("error %q does not name the file %s", err, tc.out)
			}
			if ents, _ := os.ReadDir(dir); len(ents) > 0 {
				t.Errorf("a failed draw left %s in the directory", ents[0].Name())
			}
		})
	}
}

// TestHeatColor: the colour map runs from viridis's dark purple at 0 to its yellow at 1,
// clamped outside, growing lighter all the way; cell text contrasts with it.
func TestHeatColor(t *testing.T) {
	if c := heatColor(0); c != viridis[0] || heatColor(-1) != c || heatColor(math.NaN()) != c {
		t.Errorf("heatColor(0) = %v, want %v (and the same below 0 and for NaN)", c, viridis[0])
	}
	if c := heatColor(1); c != viridis[8] || heatColor(2) != c {
		t.Errorf("heatColor(1) = %v, want %v", c, viridis[8])
	}
	prev := -1.0
	for i := 0; i <= 200; i++ {
		l := luminance(heatColor(float64(i) / 200))
		if l <= prev {
			t.Fatalf("luminance %g at %g after %g: not increasing", l, float64(i)/200, prev)
		}
		prev = l
	}
	if inkOn(heatColor(0)) != color.White || inkOn(heatColor(1)) != color.Black {
		t.Errorf("text on 0 is %v and on 1 %v, want white and black", inkOn(heatColor(0)), inkOn(heatColor(1)))
	}
}

// TestLabels: lengths as 1K/3M or the number, depths as percentages, the log2 axis's
// ticks at powers of two.
func TestLabels(t *testing.T) {
	for n, want := range map[int]string{1000: "1000", 1024: "1K", 1536: "1536", 8192: "8K", 1 << 20: "1M", 3 << 20: "3M", 1025 << 10: "1025K"} {
		if got := lengthName(n); got != want {
			t.Errorf("lengthName(%d) = %q, want %q", n, got, want)
		}
	}
	for d, want := range map[float64]string{0: "0%", 0.1: "10%", 0.125: "12.5%", 1.0 / 3: "33.3%", 1: "100%", 0.025: "2.5%"} {
		if got := depthName(d); got != want {
			t.Errorf("depthName(%g) = %q, want %q", d, got, want)
		}
	}
	for _, tc := range []struct {
		min, max float64
		want     string // labels, "." for a minor tick
	}{
		{5, 12.6, "32 64 128 256 512 1K 2K 4K"},
		{-1, 3, "1 2 4 8"},
		{4.5, 20, ". 64 . 256 . 1K . 4K . 16K . 64K . 256K . 1M"},
	} {
		var got []string
		for _, tk := range (log2Ticks{}).Ticks(tc.min, tc.max) {
			l := tk.Label
			if l == "" {
				l = "."
			}
			got = append(got, l)
		}
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("log2Ticks [%g, %g]: %q, want %q", tc.min, tc.max, s, tc.want)
		}
	}
}
