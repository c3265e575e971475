package runplot

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"

	"distflash/runplot/runplottest"
)

// countColor counts the pixels of img within 8 per channel of c.
func countColor(img image.Image, c color.RGBA) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if absDiff(r>>8, uint32(c.R)) <= 8 && absDiff(g>>8, uint32(c.G)) <= 8 && absDiff(bl>>8, uint32(c.B)) <= 8 {
				n++
			}
		}
	}
	return n
}

func absDiff(a, b uint32) uint32 {
	if a > b {
		return a - b
	}
	return b - a
}

// drawRuns reads the runs and draws them as format, failing the test on an error.
func drawRuns(t *testing.T, format string, dirs ...string) []byte {
	t.Helper()
	var runs []*Run
	for _, d := range dirs {
		r, err := Read(d)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	Name(runs)
	var buf bytes.Buffer
	if err := Draw(&buf, runs, format); err != nil {
		t.Fatalf("Draw %s: %v", format, err)
	}
	return buf.Bytes()
}

// TestDrawTwoRuns draws two runs: the PNG decodes at 1200×1050 with both runs' colours drawn
// and no third; the SVG is XML of 12 × 10.5 inches naming both runs, the panels, axes and
// the last eval loss.
func TestDrawTwoRuns(t *testing.T) {
	dir := t.TempDir()
	a, b := runplottest.TwoRuns(t, dir)
	img := runplottest.DecodePNG(t, "png", drawRuns(t, "png", a, b))
	// Each run's colour covers its lines in five panels and its legend entry.
	for i, name := range []string{"alpha", "beta"} {
		if n := countColor(img, plotColors[i]); n < 2000 {
			t.Errorf("run %s: %d pixels of its colour %v, want its lines (≥ 2000)", name, n, plotColors[i])
		}
	}
	if n := countColor(img, plotColors[2]); n > 0 {
		t.Errorf("%d pixels of a third run's colour, with two runs", n)
	}
	svg := filepath.Join(dir, "runs.svg")
	if err := os.WriteFile(svg, drawRuns(t, "svg", a, b), 0o644); err != nil {
		t.Fatal(err)
	}
	runplottest.CheckTwoRunsSVG(t, svg)
}

// TestReadDamagedRuns: null values are left out and mark the run diverged, a torn last
// line is skipped with a warning naming file and line, a rewritten step counts with its last
// line, an fp16 skip is not a divergence.
func TestReadDamagedRuns(t *testing.T) {
	dir := t.TempDir()
	lines := runplottest.SynthMetrics(30, 3e-3, 2.5, 0)
	lines[24] = `{"step":25,"loss":null,"lr":0.003,"grad_norm":null,"tokens_per_s":5000,"tokens":25600,"elapsed_s":5,"attn_forwards":100,"memory":[]}`
	lines[26] = strings.Replace(lines[26], `"grad_norm":`, `"grad_norm":null,"x":`, 1)
	// A resumed run wrote steps 9 and 10 again.
	lines = append(lines[:10], append([]string{
		`{"step":9,"loss":4.25,"lr":0.003,"grad_norm":1,"tokens_per_s":5000,"tokens":9216}`,
		`{"step":10,"loss":4.5,"lr":0.003,"grad_norm":1,"tokens_per_s":5000,"tokens":10240}`,
	}, lines[10:]...)...)
	diverged := runplottest.WriteRun(t, dir, "diverged", lines, `{"step":31,"loss":2.`) // 32 lines, the last torn
	path := filepath.Join(diverged, "metrics.jsonl")

	r, err := Read(diverged)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Points) != 30 {
		t.Errorf("%d steps read, want 30 (steps 1..30, each once)", len(r.Points))
	}
	if p := r.Points[8]; p.Step != 9 || p.Loss != 4.25 {
		t.Errorf("step 9 read as %+v, want its rewritten line (loss 4.25)", p)
	}
	if p := r.Points[24]; p.Step != 25 || !math.IsNaN(p.Loss) || !math.IsNaN(p.GradNorm) || p.LR != 0.003 {
		t.Errorf("step 25 (null loss and grad_norm) read as %+v", p)
	}
	if r.DivergedAt != 25 || r.DivergedWhat != "loss, grad_norm" {
		t.Errorf("diverged at %d (%s), want step 25 (loss, grad_norm)", r.DivergedAt, r.DivergedWhat)
	}
	wantWarn := path + ":33: skipped a truncated last line"
	if len(r.Warnings) != 1 || !strings.HasPrefix(r.Warnings[0], wantWarn) {
		t.Errorf("warnings %q, want one starting %q", r.Warnings, wantWarn)
	}

	// fp16: an overflowed step has a null gradient norm and is skipped, not diverged.
	fp16 := runplottest.SynthMetrics(12, 3e-3, 2.5, 0)
	fp16[3] = `{"step":4,"loss":4.9,"lr":0.003,"grad_norm":null,"tokens_per_s":5000,"tokens":4096,"skipped":true,"loss_scale":65536}`
	r, err = Read(runplottest.WriteRun(t, dir, "fp16", fp16, ""))
	if err != nil {
		t.Fatal(err)
	}
	if r.DivergedAt != 0 || r.Skipped != 1 || !math.IsNaN(r.Points[3].GradNorm) {
		t.Errorf("fp16 run: diverged at %d, %d skipped, step 4 grad norm %g; want not diverged, 1 skipped, NaN",
			r.DivergedAt, r.Skipped, r.Points[3].GradNorm)
	}

	// The picture says which run diverged, and where; the fp16 run is not called diverged.
	svg := filepath.Join(dir, "damaged.svg")
	if err := os.WriteFile(svg, drawRuns(t, "svg", diverged, filepath.Join(dir, "fp16")), 0o644); err != nil {
		t.Fatal(err)
	}
	_, texts := runplottest.SVGTexts(t, svg)
	all := strings.Join(texts, "\n")
	for _, want := range []string{"diverged DIVERGED at step 25", "DIVERGED at step 25 (non-finite loss, grad_norm)", "1 fp16 steps skipped"} {
		if !strings.Contains(all, want) {
			t.Errorf("SVG has no text %q; texts:\n%s", want, all)
		}
	}
	if strings.Contains(all, "fp16 DIVERGED") {
		t.Errorf("the fp16 run with a skipped step is called diverged:\n%s", all)
	}
}

// TestDrawEdgeRuns: runs that leave panels with one point or none still draw: a single step,
// a constant learning rate, a run whose every loss and gradient norm is null.
func TestDrawEdgeRuns(t *testing.T) {
	dir := t.TempDir()
	one := runplottest.WriteRun(t, dir, "one", runplottest.SynthMetrics(1, 1e-3, 2, 1), "")
	flat := runplottest.WriteRun(t, dir, "flat", runplottest.SynthMetrics(50, 1e-3, 2, 0), "")
	var nulls []string
	for s := 1; s <= 4; s++ {
		nulls = append(nulls, fmt.Sprintf(`{"step":%d,"loss":null,"lr":0.001,"grad_norm":null,"tokens_per_s":900,"tokens":%d}`, s, 1024*s))
	}
	dead := runplottest.WriteRun(t, dir, "dead", nulls, "")
	for _, runs := range [][]string{{one}, {dead}, {one, flat, dead}} {
		runplottest.DecodePNG(t, "png", drawRuns(t, "png", runs...))
		drawRuns(t, "svg", runs...)
	}
	r, err := Read(dead)
	if err != nil {
		t.Fatal(err)
	}
	if r.DivergedAt != 1 || len(r.Points) != 4 {
		t.Errorf("all-null run: diverged at %d with %d steps, want 1 with 4", r.DivergedAt, len(r.Points))
	}
}

// TestDrawManyRuns: ten runs with long names still name every run: the title counts them
// instead of listing them, the legend gives each one line.
func TestDrawManyRuns(t *testing.T) {
	dir := t.TempDir()
	var runs, names []string
	for i := range 10 {
		name := fmt.Sprintf("sweep-lr%d-with-a-rather-long-run-name", i)
		lines := runplottest.SynthMetrics(30, 1e-3*float64(i+1), 2+0.1*float64(i), 10)
		if i == 7 {
			lines[19] = `{"step":20,"loss":null,"lr":0.008,"grad_norm":null,"tokens_per_s":5000,"tokens":20480}`
		}
		runs = append(runs, runplottest.WriteRun(t, dir, name, lines, ""))
		names = append(names, name)
	}
	out := filepath.Join(dir, "many.svg")
	if err := os.WriteFile(out, drawRuns(t, "svg", runs...), 0o644); err != nil {
		t.Fatal(err)
	}
	_, texts := runplottest.SVGTexts(t, out)
	all := strings.Join(texts, "\n")
	want := append(names, "distflash training: 10 runs  —  sweep-lr7-with-a-rather-long-run-name DIVERGED at step 20",
		"sweep-lr7-with-a-rather-long-run-name   DIVERGED at step 20")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("SVG has no text %q; texts:\n%s", w, all)
		}
	}
	if strings.Contains(all, "steps 1–30") {
		t.Errorf("ten runs got two legend lines each:\n%s", all)
	}
}

// TestReadErrors: a missing run, a directory without metrics.jsonl and a file without a
// step are refused, naming the path; runs sharing a directory name are told apart.
func TestReadErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	garbage := runplottest.WriteRun(t, dir, "garbage", []string{"not json", `{"loss": 2}`}, "")
	for _, tc := range []struct {
		arg  string
		want []string
	}{
		{filepath.Join(dir, "nope"), []string{filepath.Join(dir, "nope"), "no such file"}},
		{empty, []string{empty, "has no metrics.jsonl"}},
		{garbage, []string{filepath.Join(garbage, "metrics.jsonl"), "no steps", "2 lines"}},
	} {
		_, err := Read(tc.arg)
		if err == nil {
			t.Errorf("Read(%s): no error", tc.arg)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Read(%s): error %q does not contain %q", tc.arg, err, w)
			}
		}
	}
	var runs []*Run
	for _, sub := range []string{"x", "y"} {
		r, err := Read(runplottest.WriteRun(t, filepath.Join(dir, sub), "tiny", runplottest.SynthMetrics(3, 1e-3, 2, 0), ""))
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	Name(runs)
	if runs[0].Name != filepath.Join(dir, "x", "tiny") || runs[1].Name != filepath.Join(dir, "y", "tiny") {
		t.Errorf("two runs named tiny labelled %q and %q, want their paths", runs[0].Name, runs[1].Name)
	}
}

// TestFormatSI: tick and summary labels with SI prefixes.
func TestFormatSI(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1k"}, {61440, "61.4k"}, {2.5e6, "2.5M"}, {1.234e9, "1.23G"}, {0.0125, "0.0125"}} {
		if got := formatSI(tc.v); got != tc.want {
			t.Errorf("formatSI(%g) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

// TestLogTicks: the gradient norm's axis (log10 values) is labelled with the values, at 1,
// 2, 5 × 10^k over a narrow range and 10^k over a wide one.
func TestLogTicks(t *testing.T) {
	for _, tc := range []struct {
		min, max float64
		want     []string // labelled ticks
	}{
		{0.4, 12, []string{"0.5", "1", "2", "5", "10"}},
		{0.01, 1000, []string{"0.01", "0.1", "1", "10", "100", "1000"}},
		{3e-5, 2e6, []string{"1e-4", "0.001", "0.01", "0.1", "1", "10", "100", "1000", "1e4", "1e5", "1e6"}},
	} {
		var got []string
		for _, tk := range (logTicks{}).Ticks(math.Log10(tc.min), math.Log10(tc.max)) {
			if v := math.Pow(10, tk.Value); v < tc.min*(1-1e-9) || v > tc.max*(1+1e-9) {
				t.Errorf("[%g, %g]: tick at %g outside", tc.min, tc.max, v)
			}
			if tk.Label != "" {
				got = append(got, tk.Label)
			}
		}
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("[%g, %g]: labels %q, want %q", tc.min, tc.max, got, tc.want)
		}
	}
}

// TestNiceTicks: linear axes are labelled every 1, 2 or 5 × 10^k.
func TestNiceTicks(t *testing.T) {
	for _, tc := range []struct {
		min, max float64
		si       bool
		want     string
	}{
		{0, 300, false, "0 50 100 150 200 250 300"},
		{0, 0.00104, false, "0 0.0002 0.0004 0.0006 0.0008 0.001"},
		{1.6, 5.5, false, "2 3 4 5"},
		{0, 0.01, false, "0 0.002 0.004 0.006 0.008 0.01"},
		{0, 307200, true, "0 100k 200k 300k"},
		{0, 6500, true, "0 2k 4k 6k"},
	} {
		var got []string
		for _, tk := range (niceTicks{si: tc.si}).Ticks(tc.min, tc.max) {
			if tk.Label != "" {
				got = append(got, tk.Label)
			}
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("[%g, %g]: labels %q, want %q", tc.min, tc.max, got, tc.want)
		}
	}
}

// TestMovingAverage: centred inside, shrinking to the first value at the start, cut at the
// end.
func TestMovingAverage(t *testing.T) {
	var xys plotter.XYs
	for i := 1; i <= 10; i++ {
		xys = append(xys, plotter.XY{X: float64(i), Y: float64(i * i)})
	}
	got := movingAverage(xys, 3)
	want := []float64{1, (1 + 4 + 9) / 3.0, (4 + 9 + 16) / 3.0, (9 + 16 + 25) / 3.0, (16 + 25 + 36) / 3.0,
		(25 + 36 + 49) / 3.0, (36 + 49 + 64) / 3.0, (49 + 64 + 81) / 3.0, (64 + 81 + 100) / 3.0, (81 + 100) / 2.0}
	for i := range want {
		if got[i].X != xys[i].X || math.Abs(got[i].Y-want[i]) > 1e-12 {
			t.Errorf("point %d: %v, want (%g, %g)", i, got[i], xys[i].X, want[i])
		}
	}
}

// TestDecimate: a long line is drawn from at most 2 points per bucket and its ends, in
// order, keeping its highest and lowest points; a short one is left alone.
func TestDecimate(t *testing.T) {
	var xys plotter.XYs
	for i := range 10000 {
		xys = append(xys, plotter.XY{X: float64(i), Y: math.Sin(float64(i) / 50)})
	}
	xys[4321].Y, xys[8765].Y = 40, -7
	got := decimate(xys, 100)
	if len(got) > 202 {
		t.Errorf("%d points, want at most 202", len(got))
	}
	if got[0] != xys[0] || got[len(got)-1] != xys[len(xys)-1] {
		t.Errorf("ends %v, %v; want the line's ends %v, %v", got[0], got[len(got)-1], xys[0], xys[len(xys)-1])
	}
	var sawHigh, sawLow bool
	for i, p := range got {
		if i > 0 && p.X <= got[i-1].X {
			t.Fatalf("x not increasing at %d: %g after %g", i, p.X, got[i-1].X)
		}
		sawHigh = sawHigh || p == xys[4321]
		sawLow = sawLow || p == xys[8765]
	}
	if !sawHigh || !sawLow {
		t.Errorf("spike kept %v, dip kept %v; want both", sawHigh, sawLow)
	}
	if short := decimate(xys[:150], 100); len(short) != 150 {
		t.Errorf("150 points decimated to %d, want all kept", len(short))
	}
}
