package e2e

import (
	"errors"
	"image"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"distflash/runplot"
	"distflash/runplot/runplottest"
)

// The tests of this file run plot through the binary: two runs overlaid (PNG and SVG), a damaged
// or diverged run, a trained run, and the bad command lines, refused naming what is wrong.

// decodePNG reads a PNG file and checks its size.
func decodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return runplottest.DecodePNG(t, path, data)
}

// TestPlotTwoRuns draws two runs as PNG and SVG: the PNG decodes at 1200×1050 with both
// runs' colours drawn, the SVG is XML naming both runs, panels and axes.
func TestPlotTwoRuns(t *testing.T) {
	dir := t.TempDir()
	a, b := runplottest.TwoRuns(t, dir)
	for _, ext := range []string{".png", ".svg"} {
		out := filepath.Join(dir, "runs"+ext)
		// Flags may come after the runs; the second run is given by its metrics.jsonl.
		stdout, stderr, err := cli(t, "plot", a, filepath.Join(b, "metrics.jsonl"), "--out", out)
		if err != nil {
			t.Fatalf("plot %s: %v\n%s", ext, err, stderr)
		}
		if stderr != "" {
			t.Errorf("plot %s: unexpected warnings: %s", ext, stderr)
		}
		if !strings.Contains(stdout, out) {
			t.Errorf("stdout %q does not name %s", stdout, out)
		}
		if ext == ".png" {
			decodePNG(t, out)
			continue
		}
		runplottest.CheckTwoRunsSVG(t, out)
	}
}

// TestPlotDamagedRun: a run with null values and a torn last line plots; the warning names
// file and line; the picture says which run diverged and where, and that a run with an fp16
// skip did not. (runplot's tests check the reading in detail.)
func TestPlotDamagedRun(t *testing.T) {
	dir := t.TempDir()
	lines := runplottest.SynthMetrics(30, 3e-3, 2.5, 0)
	lines[24] = `{"step":25,"loss":null,"lr":0.003,"grad_norm":null,"tokens_per_s":5000,"tokens":25600}`
	diverged := runplottest.WriteRun(t, dir, "diverged", lines, `{"step":31,"loss":2.`)
	fp16 := runplottest.SynthMetrics(12, 3e-3, 2.5, 0)
	fp16[3] = `{"step":4,"loss":4.9,"lr":0.003,"grad_norm":null,"tokens_per_s":5000,"tokens":4096,"skipped":true,"loss_scale":65536}`
	runplottest.WriteRun(t, dir, "fp16", fp16, "")
	out := filepath.Join(dir, "damaged.svg")
	_, stderr, err := cli(t, "plot", "--out", out, diverged, filepath.Join(dir, "fp16"))
	if err != nil {
		t.Fatalf("plot: %v\n%s", err, stderr)
	}
	wantWarn := "plot: warning: " + filepath.Join(diverged, "metrics.jsonl") + ":31: skipped a truncated last line"
	if !strings.Contains(stderr, wantWarn) {
		t.Errorf("stderr %q does not contain %q", stderr, wantWarn)
	}
	_, texts := runplottest.SVGTexts(t, out)
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
	good := runplottest.WriteRun(t, dir, "good", runplottest.SynthMetrics(5, 1e-3, 2, 0), "")
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	garbage := runplottest.WriteRun(t, dir, "garbage", []string{"not json", `{"loss": 2}`}, "")
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
			_, _, err := cli(t, append([]string{"plot"}, tc.args...)...)
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
	// --help is not a failure: the command returns flag.ErrHelp, which exits 0.
	_, stderr, err := distflash(t, "plot", "--help")
	if err != nil {
		t.Errorf("plot --help: %v, want exit status 0", err)
	}
	if !strings.Contains(stderr, "distflash plot RUN") || !strings.Contains(stderr, "-out") {
		t.Errorf("plot --help printed %q", stderr)
	}
}

// TestPlotTrainedRun plots a real run of train: its directory, and through runplot.WriteRun (what
// train calls at its end).
func TestPlotTrainedRun(t *testing.T) {
	dir := t.TempDir()
	_, stderr, err := cli(t, "train", "--config", "configs/tiny.toml", "--progress=false", "--set", "run.output_dir="+dir,
		"--set", "training.steps=3", "--set", "data.batch_size=2", "--set", "data.max_bytes=1048576")
	if err != nil {
		t.Fatalf("train: %v\n%s", err, stderr)
	}
	runDir := filepath.Join(dir, "tiny")
	out := filepath.Join(dir, "tiny.png")
	if _, stderr, err := cli(t, "plot", runDir, "--out", out); err != nil {
		t.Fatalf("plot: %v\n%s", err, stderr)
	}
	decodePNG(t, out)
	r, err := runplot.Read(runDir)
	if err != nil {
		t.Fatal(err)
	}
	if p := r.Points[len(r.Points)-1]; len(r.Points) != 3 || p.Step != 3 || !(p.Loss > 0) || p.Tokens != 3*2*128 || r.DivergedAt != 0 || len(r.Warnings) > 0 {
		t.Errorf("read %d steps, last %+v, warnings %q; want 3 finite steps of 256 tokens", len(r.Points), p, r.Warnings)
	}
	svg := filepath.Join(runDir, "metrics.svg")
	if err := runplot.WriteRun(runDir, svg); err != nil {
		t.Fatal(err)
	}
	if root, texts := runplottest.SVGTexts(t, svg); !strings.HasPrefix(root, "svg ") || !strings.Contains(strings.Join(texts, " "), "distflash training: tiny") {
		t.Errorf("writeRunPlot: root %q, texts %q", root, texts)
	}
}

// TestPlotBinary runs the real program: a damaged run plots with exit 0 and the warning on
// stderr; a bad --out exits non-zero with the value named and writes nothing.
func TestPlotBinary(t *testing.T) {
	dir := t.TempDir()
	a := runplottest.WriteRun(t, dir, "a", runplottest.SynthMetrics(20, 3e-3, 2.5, 10), `{"step":21,"lo`)
	out := filepath.Join(dir, "a.png")
	_, stderr, err := distflash(t, "plot", a, "--out", out)
	if err != nil {
		t.Fatalf("distflash plot: %v\n%s", err, stderr)
	}
	if want := filepath.Join(a, "metrics.jsonl") + ":21: skipped a truncated last line"; !strings.Contains(stderr, want) {
		t.Errorf("stderr %q does not contain %q", stderr, want)
	}
	decodePNG(t, out)

	bad := filepath.Join(dir, "a.jpg")
	msg, err := command("plot", a, "--out", bad).CombinedOutput()
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
