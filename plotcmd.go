package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// `distflash plot`: pictures of training runs from their metrics.jsonl. This file reads the
// runs and writes the file; plotdraw.go draws the panels.
//
// Reading is forgiving where a run's own history makes it so: a non-finite value is written
// as JSON null (the run diverged, or an fp16 step overflowed) and is left out of its panel; a
// line that is not a JSON object with a step (the torn last line of a crashed run) is
// skipped with a warning naming file and line; a step written twice (a resumed run rewrites
// the steps after its checkpoint) counts with its last line.

const plotUsage = `Usage: distflash plot RUN [RUN...] --out FILE.png|FILE.svg

Draws training loss (and eval loss) against step and against tokens, the learning rate, the
gradient norm and tokens/s of one or several runs, overlaid with one colour per run. A RUN is
a run directory (runs/<run.name>) or its metrics.jsonl.

Flags:
`

// runPlot is `distflash plot`.
func runPlot(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "picture to write, FILE.png or FILE.svg (required)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), plotUsage)
		fs.PrintDefaults()
	}
	// Flags may come before, between or after the runs; after "--" all are runs.
	var runs []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			runs = append(runs, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		runs = append(runs, rest[0])
		args = rest[1:]
	}
	if *out == "" {
		return errors.New("plot: --out FILE.png or FILE.svg is required")
	}
	if len(runs) == 0 {
		return errors.New("plot: no run given: distflash plot RUN [RUN...] --out FILE.png")
	}
	if err := writePlot(runs, *out, stderr); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "plot: wrote %s (runs: %s)\n", *out, strings.Join(runs, ", "))
	return nil
}

// writeRunPlot draws the run in runDir into out (.png or .svg), as `distflash plot runDir
// --out out` does, without warnings: train calls it at the end of a run.
func writeRunPlot(runDir string, out string) error {
	return writePlot([]string{runDir}, out, io.Discard)
}

// writePlot reads every run (a run directory or a metrics.jsonl), draws them overlaid and
// writes the picture to out, whose extension picks the format. Nothing is written unless
// every run reads and the picture draws; warnings about skipped lines go to warn.
func writePlot(runs []string, out string, warn io.Writer) error {
	format, err := plotFormat(out)
	if err != nil {
		return err
	}
	var rs []*plotRun
	for _, arg := range runs {
		r, err := readPlotRun(arg, warn)
		if err != nil {
			return err
		}
		rs = append(rs, r)
	}
	nameRuns(rs)
	var buf bytes.Buffer
	if err := drawRuns(&buf, rs, format); err != nil {
		return fmt.Errorf("plot: draw %s: %w", out, err)
	}
	return writePlotFile(out, buf.Bytes())
}

// plotFormat returns the picture format of out, told by its extension.
func plotFormat(out string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(out)); ext {
	case ".png", ".svg":
		return ext[1:], nil
	}
	return "", fmt.Errorf("plot: --out %q: want a file name ending in .png or .svg", out)
}

// writePlotFile writes data to path through a temporary file in the same directory, so a
// reader (or a failure) never sees half a picture.
func writePlotFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("plot: write %s: %w", path, err)
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("plot: write %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("plot: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("plot: write %s: %w", path, err)
	}
	return nil
}

// plotRun is one run's metrics, one point per step in step order.
type plotRun struct {
	arg    string // as given on the command line
	dir    string // the run directory
	path   string // its metrics.jsonl
	name   string // legend label
	points []plotPoint

	divergedAt   int    // first step with a non-finite loss or gradient norm (not an fp16 skip); 0 = none
	divergedWhat string // what was non-finite there, e.g. "loss"
	skipped      int    // fp16 steps whose update was skipped
}

// plotPoint is one step. A value that is absent or non-finite (null) is NaN.
type plotPoint struct {
	step                                       int
	tokens                                     float64
	loss, evalLoss, lr, gradNorm, tokensPerSec float64
	nonFinite                                  string // "loss", "grad_norm" or "loss, grad_norm" when the step diverged
	skipped                                    bool   // fp16 overflow: the update was skipped
}

// metricsLine is what plot reads of a metrics.jsonl line (train's Metrics).
type metricsLine struct {
	Step         *int       `json:"step"`
	Loss         jsonNumber `json:"loss"`
	LR           jsonNumber `json:"lr"`
	GradNorm     jsonNumber `json:"grad_norm"`
	TokensPerSec jsonNumber `json:"tokens_per_s"`
	Tokens       jsonNumber `json:"tokens"`
	EvalLoss     jsonNumber `json:"eval_loss"`
	Skipped      bool       `json:"skipped"`
}

// jsonNumber is a number of metrics.jsonl that may be null (train writes non-finite values
// so) or absent. Strings naming a non-finite value ("NaN", "Inf", "-Inf") read as null too.
type jsonNumber struct {
	v       float64
	present bool // the key was there
	finite  bool // ... with a finite number
}

// UnmarshalJSON implements json.Unmarshaler.
func (n *jsonNumber) UnmarshalJSON(b []byte) error {
	n.present = true
	s := string(bytes.TrimSpace(b))
	switch strings.Trim(strings.ToLower(s), `"`) {
	case "null", "nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity":
		return nil
	}
	if err := json.Unmarshal(b, &n.v); err != nil {
		return err
	}
	n.finite = !math.IsNaN(n.v) && !math.IsInf(n.v, 0)
	return nil
}

// value is the number, or NaN when absent or non-finite.
func (n jsonNumber) value() float64 {
	if !n.finite {
		return math.NaN()
	}
	return n.v
}

// null reports a key that is there with a non-finite value.
func (n jsonNumber) null() bool { return n.present && !n.finite }

// readPlotRun reads a run given as a run directory or a metrics.jsonl path.
func readPlotRun(arg string, warn io.Writer) (*plotRun, error) {
	st, err := os.Stat(arg)
	if err != nil {
		return nil, fmt.Errorf("plot: run %s: %w", arg, err)
	}
	r := &plotRun{arg: arg, dir: arg, path: filepath.Join(arg, "metrics.jsonl")}
	if !st.IsDir() {
		r.dir, r.path = filepath.Dir(arg), arg
	}
	f, err := os.Open(r.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("plot: run %s has no metrics.jsonl (%s): give a run directory of train (<run.output_dir>/<run.name>) or its metrics.jsonl", arg, r.path)
	}
	if err != nil {
		return nil, fmt.Errorf("plot: %w", err)
	}
	defer f.Close()
	byStep := map[int]plotPoint{}
	br := bufio.NewReader(f)
	lines := 0
	for {
		line, rerr := br.ReadBytes('\n')
		if rerr != nil && rerr != io.EOF {
			return nil, fmt.Errorf("plot: read %s: %w", r.path, rerr)
		}
		if len(line) > 0 {
			lines++
			torn := rerr == io.EOF && line[len(line)-1] != '\n'
			if err := r.addLine(byStep, line); err != nil {
				what := "a damaged line"
				if torn {
					what = "a truncated last line (a crashed run?)"
				}
				fmt.Fprintf(warn, "plot: warning: %s:%d: skipped %s: %v\n", r.path, lines, what, err)
			}
		}
		if rerr == io.EOF {
			break
		}
	}
	if len(byStep) == 0 {
		return nil, fmt.Errorf("plot: %s has no steps (%d lines, none a step of train's metrics)", r.path, lines)
	}
	for _, s := range slices.Sorted(maps.Keys(byStep)) {
		p := byStep[s]
		r.points = append(r.points, p)
		if p.nonFinite != "" && r.divergedAt == 0 {
			r.divergedAt, r.divergedWhat = s, p.nonFinite
		}
		if p.skipped {
			r.skipped++
		}
	}
	return r, nil
}

// addLine reads one metrics.jsonl line into byStep, replacing an earlier line of its step.
// Blank lines are ignored.
func (r *plotRun) addLine(byStep map[int]plotPoint, line []byte) error {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return nil
	}
	var m metricsLine
	if err := json.Unmarshal(line, &m); err != nil {
		return err
	}
	if m.Step == nil || *m.Step < 1 {
		return errors.New(`no "step" of 1 or more`)
	}
	s := *m.Step
	p := plotPoint{step: s, tokens: m.Tokens.value(), loss: m.Loss.value(), evalLoss: m.EvalLoss.value(),
		lr: m.LR.value(), gradNorm: m.GradNorm.value(), tokensPerSec: m.TokensPerSec.value(), skipped: m.Skipped}
	// Divergence: a null loss, or a null gradient norm on a step that fp16 loss scaling did
	// not skip (an overflow there is expected and handled).
	switch {
	case m.Loss.null() && m.GradNorm.null():
		p.nonFinite = "loss, grad_norm"
	case m.Loss.null():
		p.nonFinite = "loss"
	case m.GradNorm.null() && !m.Skipped:
		p.nonFinite = "grad_norm"
	}
	byStep[s] = p
	return nil
}

// nameRuns labels each run by its directory's name, or by the path given when two runs
// share a name.
func nameRuns(rs []*plotRun) {
	count := map[string]int{}
	for _, r := range rs {
		abs, err := filepath.Abs(r.dir)
		if err != nil {
			abs = r.dir
		}
		r.name = filepath.Base(abs)
		count[r.name]++
	}
	for _, r := range rs {
		if count[r.name] > 1 {
			r.name = filepath.Clean(r.arg)
		}
	}
}
