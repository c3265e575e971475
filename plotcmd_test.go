package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"
)

// synthMetrics is n steps of a run as train writes them: the loss falls from ln 256 towards
// floor, the learning rate is lr, eval loss every evalEvery steps (0 = none).
func synthMetrics(n int, lr, floor float64, evalEvery int) []string {
	var lines []string
	for s := 1; s <= n; s++ {
		loss := floor + (math.Log(256)-floor)*math.Exp(-float64(s)/10)
		line := fmt.Sprintf(`{"step":%d,"loss":%g,"lr":%g,"grad_norm":%g,"tokens_per_s":%g,"tokens":%d,"elapsed_s":%g,"attn_forwards":%d,"memory":[{"params":1,"grads":1,"optimizer":2,"compute":0,"activations":3}]`,
			s, loss, lr, 2/math.Sqrt(float64(s)), 5000+100*float64(s%7), 1024*s, 0.2*float64(s), 4*s)
		if evalEvery > 0 && s%evalEvery == 0 {
			line += fmt.Sprintf(`,"eval_loss":%g,"eval_perplexity":%g`, loss+0.1, math.Exp(loss+0.1))
		}
		lines = append(lines, line+"}")
	}
	return lines
}

// writeRun writes lines as dir/name/metrics.jsonl (each with a newline, then tail as it is)
// and returns the run directory.
func writeRun(t *testing.T, dir, name string, lines []string, tail string) string {
	t.Helper()
	run := filepath.Join(dir, name)
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	data := strings.Join(lines, "\n") + "\n" + tail
	if err := os.WriteFile(filepath.Join(run, "metrics.jsonl"), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return run
}

// decodePNG reads a PNG file and checks its size.
func decodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() != 1200 || b.Dy() != 1050 {
		t.Fatalf("%s: %dx%d pixels, want 1200x1050", path, b.Dx(), b.Dy())
	}
	return img
}

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

// svgTexts parses an SVG file as XML and returns its root element (name and size) and its
// texts.
func svgTexts(t *testing.T, path string) (string, []string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	var root string
	var texts []string
	inText := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s is not XML: %v", path, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
				for _, a := range tok.Attr {
					if a.Name.Local == "width" || a.Name.Local == "height" {
						root += " " + a.Name.Local + "=" + a.Value
					}
				}
			}
			inText = tok.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, string(tok))
			}
		case xml.EndElement:
			inText = false
		}
	}
	return root, texts
}

// TestPlotTwoRuns draws two runs as PNG and SVG: the PNG decodes at 1200×1050 with both
// runs' colours drawn, the SVG is XML naming both runs, panels and axes.
func TestPlotTwoRuns(t *testing.T) {
	dir := t.TempDir()
	a := writeRun(t, dir, "alpha", synthMetrics(60, 3e-3, 2.5, 20), "")
	b := writeRun(t, dir, "beta", synthMetrics(45, 1e-2, 3.0, 0), "")
	for _, ext := range []string{".png", ".svg"} {
		out := filepath.Join(dir, "runs"+ext)
		var stdout, stderr bytes.Buffer
		// Flags may come after the runs; the second run is given by its metrics.jsonl.
		if err := run([]string{"plot", a, filepath.Join(b, "metrics.jsonl"), "--out", out}, &stdout, &stderr); err != nil {
			t.Fatalf("plot %s: %v\n%s", ext, err, stderr.String())
		}
		if stderr.Len() != 0 {
			t.Errorf("plot %s: unexpected warnings: %s", ext, stderr.String())
		}
		if !strings.Contains(stdout.String(), out) {
			t.Errorf("stdout %q does not name %s", stdout.String(), out)
		}
		if ext == ".png" {
			img := decodePNG(t, out)
			// Each run's colour covers its lines in five panels and its legend entry.
			for i, name := range []string{"alpha", "beta"} {
				if n := countColor(img, plotColors[i]); n < 2000 {
					t.Errorf("run %s: %d pixels of its colour %v, want its lines (≥ 2000)", name, n, plotColors[i])
				}
			}
			if n := countColor(img, plotColors[2]); n > 0 {
				t.Errorf("%d pixels of a third run's colour, with two runs", n)
			}
			continue
		}
		root, texts := svgTexts(t, out)
		if want := "svg width=864pt height=756pt"; root != want { // 12 × 10.5 inches
			t.Errorf("root element %q, want %q", root, want)
		}
		all := strings.Join(texts, "\n")
		for _, want := range []string{"alpha", "beta", "Training loss", "Learning rate", "Gradient norm", "Throughput",
			"loss (nats/token)", "tokens/s", "eval 2.608 at step 60", "eval loss"} {
			if !strings.Contains(all, want) {
				t.Errorf("SVG has no text %q; texts:\n%s", want, all)
			}
		}
		if strings.Contains(all, "DIVERGED") {
			t.Errorf("SVG says a healthy run diverged:\n%s", all)
		}
	}
}

// TestPlotReadsDamagedRuns: null values are left out and mark the run diverged, a torn last
// line is skipped with a warning naming file and line, a rewritten step counts with its last
// line, an fp16 skip is not a divergence.
func TestPlotReadsDamagedRuns(t *testing.T) {
	dir := t.TempDir()
	lines := synthMetrics(30, 3e-3, 2.5, 0)
	lines[24] = `{"step":25,"loss":null,"lr":0.003,"grad_norm":null,"tokens_per_s":5000,"tokens":25600,"elapsed_s":5,"attn_forwards":100,"memory":[]}`
	lines[26] = strings.Replace(lines[26], `"grad_norm":`, `"grad_norm":null,"x":`, 1)
	// A resumed run wrote steps 9 and 10 again.
	lines = append(lines[:10], append([]string{
		`{"step":9,"loss":4.25,"lr":0.003,"grad_norm":1,"tokens_per_s":5000,"tokens":9216}`,
		`{"step":10,"loss":4.5,"lr":0.003,"grad_norm":1,"tokens_per_s":5000,"tokens":10240}`,
	}, lines[10:]...)...)
	diverged := writeRun(t, dir, "diverged", lines, `{"step":31,"loss":2.`) // 32 lines, the last torn
	path := filepath.Join(diverged, "metrics.jsonl")

	var warn bytes.Buffer
	r, err := readPlotRun(diverged, &warn)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.points) != 30 {
		t.Errorf("%d steps read, want 30 (steps 1..30, each once)", len(r.points))
	}
	if p := r.points[8]; p.step != 9 || p.loss != 4.25 {
		t.Errorf("step 9 read as %+v, want its rewritten line (loss 4.25)", p)
	}
	if p := r.points[24]; p.step != 25 || !math.IsNaN(p.loss) || !math.IsNaN(p.gradNorm) || p.lr != 0.003 {
		t.Errorf("step 25 (null loss and grad_norm) read as %+v", p)
	}
	if r.divergedAt != 25 || r.divergedWhat != "loss, grad_norm" {
		t.Errorf("diverged at %d (%s), want step 25 (loss, grad_norm)", r.divergedAt, r.divergedWhat)
	}
	wantWarn := path + ":33: skipped a truncated last line"
	if !strings.Contains(warn.String(), wantWarn) {
		t.Errorf("warning %q does not contain %q", warn.String(), wantWarn)
	}

	// fp16: an overflowed step has a null gradient norm and is skipped, not diverged.
	fp16 := synthMetrics(12, 3e-3, 2.5, 0)
	fp16[3] = `{"step":4,"loss":4.9,"lr":0.003,"grad_norm":null,"tokens_per_s":5000,"tokens":4096,"skipped":true,"loss_scale":65536}`
	r, err = readPlotRun(writeRun(t, dir, "fp16", fp16, ""), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if r.divergedAt != 0 || r.skipped != 1 || !math.IsNaN(r.points[3].gradNorm) {
		t.Errorf("fp16 run: diverged at %d, %d skipped, step 4 grad norm %g; want not diverged, 1 skipped, NaN",
			r.divergedAt, r.skipped, r.points[3].gradNorm)
	}

	// Through the command: the picture is drawn and says which run diverged, and where.
	out := filepath.Join(dir, "damaged.svg")
	var stdout, stderr bytes.Buffer
	if err := run([]string{"plot", "--out", out, diverged, filepath.Join(dir, "fp16")}, &stdout, &stderr); err != nil {
		t.Fatalf("plot: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), wantWarn) {
		t.Errorf("stderr %q does not contain %q", stderr.String(), wantWarn)
	}
	_, texts := svgTexts(t, out)
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

// TestPlotErrors: each bad command line is refused with the flag, value or path named, and
// writes nothing.
func TestPlotErrors(t *testing.T) {
	dir := t.TempDir()
	good := writeRun(t, dir, "good", synthMetrics(5, 1e-3, 2, 0), "")
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	garbage := writeRun(t, dir, "garbage", []string{"not json", `{"loss": 2}`}, "")
	png := filepath.Join(dir, "out.png")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"pdf", []string{good, "--out", filepath.Join(dir, "out.pdf")}, []string{"--out", "out.pdf", ".png or .svg"}},
		{"no extension", []string{good, "--out", filepath.Join(dir, "out")}, []string{"--out", "out", ".png or .svg"}},
		{"no out", []string{good}, []string{"--out", "required"}},
		{"no run", []string{"--out", png}, []string{"no run given"}},
		{"missing run", []string{good, filepath.Join(dir, "nope"), "--out", png}, []string{filepath.Join(dir, "nope"), "no such file"}},
		{"no metrics", []string{good, empty, "--out", png}, []string{empty, "has no metrics.jsonl"}},
		{"no steps", []string{garbage, "--out", png}, []string{filepath.Join(garbage, "metrics.jsonl"), "no steps", "2 lines"}},
		{"missing out dir", []string{good, "--out", filepath.Join(dir, "nodir", "x.png")}, []string{filepath.Join(dir, "nodir", "x.png")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(append([]string{"plot"}, tc.args...), &stdout, &stderr)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			entries, _ := filepath.Glob(filepath.Join(dir, "out*"))
			if len(entries) > 0 {
				t.Errorf("wrote %v", entries)
			}
		})
	}
	var stdout, stderr bytes.Buffer
	if err := run([]string{"plot", "--help"}, &stdout, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("plot --help: %v, want flag.ErrHelp", err)
	}
	if !strings.Contains(stderr.String(), "distflash plot RUN") || !strings.Contains(stderr.String(), "-out") {
		t.Errorf("plot --help printed %q", stderr.String())
	}
}

// TestPlotTrainedRun plots a real run of train: its directory, and through writeRunPlot (what
// train calls at its end).
func TestPlotTrainedRun(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := run([]string{"train", "--config", "configs/tiny.toml", "--progress=false", "--set", "run.output_dir=" + dir,
		"--set", "training.steps=3", "--set", "data.batch_size=2", "--set", "data.max_bytes=1048576"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("train: %v\n%s", err, stderr.String())
	}
	runDir := filepath.Join(dir, "tiny")
	out := filepath.Join(dir, "tiny.png")
	stdout.Reset()
	stderr.Reset()
	if err := run([]string{"plot", runDir, "--out", out}, &stdout, &stderr); err != nil {
		t.Fatalf("plot: %v\n%s", err, stderr.String())
	}
	img := decodePNG(t, out)
	if n := countColor(img, plotColors[0]); n < 500 {
		t.Errorf("%d pixels of the run's colour, want its lines (≥ 500)", n)
	}
	r, err := readPlotRun(runDir, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.points) != 3 || r.points[2].step != 3 || !(r.points[2].loss > 0) || !(r.points[2].tokens == 3*2*128) || r.divergedAt != 0 {
		t.Errorf("read %d steps, last %+v; want 3 finite steps of 256 tokens", len(r.points), r.points[len(r.points)-1])
	}
	svg := filepath.Join(runDir, "metrics.svg")
	if err := writeRunPlot(runDir, svg); err != nil {
		t.Fatal(err)
	}
	if root, texts := svgTexts(t, svg); !strings.HasPrefix(root, "svg ") || !strings.Contains(strings.Join(texts, " "), "distflash training: tiny") {
		t.Errorf("writeRunPlot: root %q, texts %q", root, texts)
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

// TestPlotEdgeRuns: runs that leave panels with one point or none still draw: a single step,
// a constant learning rate, a run whose every loss and gradient norm is null.
func TestPlotEdgeRuns(t *testing.T) {
	dir := t.TempDir()
	one := writeRun(t, dir, "one", synthMetrics(1, 1e-3, 2, 1), "")
	flat := writeRun(t, dir, "flat", synthMetrics(50, 1e-3, 2, 0), "")
	var nulls []string
	for s := 1; s <= 4; s++ {
		nulls = append(nulls, fmt.Sprintf(`{"step":%d,"loss":null,"lr":0.001,"grad_norm":null,"tokens_per_s":900,"tokens":%d}`, s, 1024*s))
	}
	dead := writeRun(t, dir, "dead", nulls, "")
	for _, runs := range [][]string{{one}, {dead}, {one, flat, dead}} {
		out := filepath.Join(dir, "edge.png")
		var stdout, stderr bytes.Buffer
		if err := run(append([]string{"plot", "--out", out}, runs...), &stdout, &stderr); err != nil {
			t.Fatalf("plot %v: %v\n%s", runs, err, stderr.String())
		}
		decodePNG(t, out)
	}
	r, err := readPlotRun(dead, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if r.divergedAt != 1 || len(r.points) != 4 {
		t.Errorf("all-null run: diverged at %d with %d steps, want 1 with 4", r.divergedAt, len(r.points))
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

// TestPlotBinary runs the real program: a damaged run plots with exit 0 and the warning on
// stderr; a bad --out exits non-zero with the value named and writes nothing.
func TestPlotBinary(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	a := writeRun(t, dir, "a", synthMetrics(20, 3e-3, 2.5, 10), `{"step":21,"lo`)
	out := filepath.Join(dir, "a.png")
	cmd := exec.Command(bin, "plot", a, "--out", out)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("distflash plot: %v\n%s", err, stderr.String())
	}
	if want := filepath.Join(a, "metrics.jsonl") + ":21: skipped a truncated last line"; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr %q does not contain %q", stderr.String(), want)
	}
	decodePNG(t, out)

	bad := filepath.Join(dir, "a.jpg")
	msg, err := exec.Command(bin, "plot", a, "--out", bad).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("distflash plot --out %s: %v, want a non-zero exit", bad, err)
	}
	if !strings.Contains(string(msg), `--out "`+bad+`"`) {
		t.Errorf("output %q does not name --out %q", msg, bad)
	}
	if _, err := os.Stat(bad); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: %v, want not written", bad, err)
	}
}

// TestPlotManyRuns: ten runs with long names still name every run: the title counts them
// instead of listing them, the legend gives each one line.
func TestPlotManyRuns(t *testing.T) {
	dir := t.TempDir()
	var runs, names []string
	for i := range 10 {
		name := fmt.Sprintf("sweep-lr%d-with-a-rather-long-run-name", i)
		lines := synthMetrics(30, 1e-3*float64(i+1), 2+0.1*float64(i), 10)
		if i == 7 {
			lines[19] = `{"step":20,"loss":null,"lr":0.008,"grad_norm":null,"tokens_per_s":5000,"tokens":20480}`
		}
		runs = append(runs, writeRun(t, dir, name, lines, ""))
		names = append(names, name)
	}
	out := filepath.Join(dir, "many.svg")
	var stdout, stderr bytes.Buffer
	if err := run(append([]string{"plot", "--out", out}, runs...), &stdout, &stderr); err != nil {
		t.Fatalf("plot: %v\n%s", err, stderr.String())
	}
	_, texts := svgTexts(t, out)
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
