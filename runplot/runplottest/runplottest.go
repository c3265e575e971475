// Package runplottest holds what the tests of runplot and of the plot command share: runs'
// metrics as train writes them, and readers of the pictures drawn from them.
package runplottest

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"image"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// SynthMetrics is n steps of a run as train writes them: the loss falls from ln 256 towards
// floor, the learning rate is lr, eval loss every evalEvery steps (0 = none).
func SynthMetrics(n int, lr, floor float64, evalEvery int) []string {
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

// WriteRun writes lines as dir/name/metrics.jsonl (each with a newline, then tail as it is)
// and returns the run directory.
func WriteRun(t testing.TB, dir, name string, lines []string, tail string) string {
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

// DecodePNG decodes a PNG (what names it in a failure) and checks its size, 1200×1050.
func DecodePNG(t testing.TB, what string, data []byte) image.Image {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if b := img.Bounds(); b.Dx() != 1200 || b.Dy() != 1050 {
		t.Fatalf("%s: %dx%d pixels, want 1200x1050", what, b.Dx(), b.Dy())
	}
	return img
}

// SVGTexts parses an SVG file as XML and returns its root element (name and size) and its
// texts.
func SVGTexts(t testing.TB, path string) (string, []string) {
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

// TwoRuns writes the two runs the two-run pictures are drawn from under dir: alpha, 60 steps
// at lr 3e-3 with an eval every 20, and beta, 45 steps at lr 1e-2; it returns their
// directories.
func TwoRuns(t testing.TB, dir string) (alpha, beta string) {
	t.Helper()
	return WriteRun(t, dir, "alpha", SynthMetrics(60, 3e-3, 2.5, 20), ""),
		WriteRun(t, dir, "beta", SynthMetrics(45, 1e-2, 3.0, 0), "")
}

// CheckTwoRunsSVG checks the SVG at path drawn from TwoRuns: 12 × 10.5 inches, naming both
// runs, the panels, the axes and the last eval loss, and not saying that a run diverged.
func CheckTwoRunsSVG(t testing.TB, path string) {
	t.Helper()
	root, texts := SVGTexts(t, path)
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
