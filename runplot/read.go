// Package runplot reads training runs' metrics.jsonl (one JSON object per optimizer step, as
// distflash train writes it) and draws them, several runs overlaid, as a PNG or SVG picture
// with gonum.org/v1/plot: loss against step and tokens (with eval loss), learning rate,
// gradient norm and tokens/s.
//
// Reading is forgiving where a run's own history makes it so: a non-finite value is written
// as JSON null (the run diverged, or an fp16 step overflowed) and is left out of its panel; a
// line that is not a JSON object with a step (the torn last line of a crashed run) is
// skipped with a warning naming file and line; a step written twice (a resumed run rewrites
// the steps after its checkpoint) counts with its last line.
package runplot

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
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

// Run is one run's metrics, one point per step in step order.
type Run struct {
	Arg    string // as given to Read
	Dir    string // the run directory
	Path   string // its metrics.jsonl
	Name   string // legend label: the directory's name (see Name)
	Points []Point

	DivergedAt   int      // first step with a non-finite loss or gradient norm (not an fp16 skip); 0 = none
	DivergedWhat string   // what was non-finite there: "loss", "grad_norm" or "loss, grad_norm"
	Skipped      int      // fp16 steps whose update was skipped
	Warnings     []string // lines skipped, as "file:line: skipped ...: why"
}

// Point is one step. A value that is absent or non-finite (null) is NaN.
type Point struct {
	Step                                       int
	Tokens                                     float64 // cumulative
	Loss, EvalLoss, LR, GradNorm, TokensPerSec float64
	NonFinite                                  string // what was non-finite when the step diverged, as Run.DivergedWhat
	Skipped                                    bool   // fp16 overflow: the update was skipped
}

// metricsLine is what runplot reads of a metrics.jsonl line (train's Metrics).
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

// Read reads a run given as a run directory (holding metrics.jsonl) or a metrics.jsonl path.
// It fails when the file is missing or holds no step; damaged lines are skipped and listed
// in Warnings.
func Read(arg string) (*Run, error) {
	st, err := os.Stat(arg)
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", arg, err)
	}
	r := &Run{Arg: arg, Dir: arg, Path: filepath.Join(arg, "metrics.jsonl")}
	if !st.IsDir() {
		r.Dir, r.Path = filepath.Dir(arg), arg
	}
	r.Name = filepath.Base(r.Dir)
	if abs, err := filepath.Abs(r.Dir); err == nil {
		r.Name = filepath.Base(abs)
	}
	f, err := os.Open(r.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("run %s has no metrics.jsonl (%s): give a run directory of train (<run.output_dir>/<run.name>) or its metrics.jsonl", arg, r.Path)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	byStep := map[int]Point{}
	br := bufio.NewReader(f)
	lines := 0
	for {
		line, rerr := br.ReadBytes('\n')
		if rerr != nil && rerr != io.EOF {
			return nil, fmt.Errorf("read %s: %w", r.Path, rerr)
		}
		if len(line) > 0 {
			lines++
			if err := readLine(byStep, line); err != nil {
				what := "a damaged line"
				if rerr == io.EOF && line[len(line)-1] != '\n' {
					what = "a truncated last line (a crashed run?)"
				}
				r.Warnings = append(r.Warnings, fmt.Sprintf("%s:%d: skipped %s: %v", r.Path, lines, what, err))
			}
		}
		if rerr == io.EOF {
			break
		}
	}
	if len(byStep) == 0 {
		return nil, fmt.Errorf("%s has no steps (%d lines, none a step of train's metrics)", r.Path, lines)
	}
	for _, s := range slices.Sorted(maps.Keys(byStep)) {
		p := byStep[s]
		r.Points = append(r.Points, p)
		if p.NonFinite != "" && r.DivergedAt == 0 {
			r.DivergedAt, r.DivergedWhat = s, p.NonFinite
		}
		if p.Skipped {
			r.Skipped++
		}
	}
	return r, nil
}

// readLine reads one metrics.jsonl line into byStep, replacing an earlier line of its step.
// Blank lines are ignored.
func readLine(byStep map[int]Point, line []byte) error {
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
	p := Point{Step: s, Tokens: m.Tokens.value(), Loss: m.Loss.value(), EvalLoss: m.EvalLoss.value(),
		LR: m.LR.value(), GradNorm: m.GradNorm.value(), TokensPerSec: m.TokensPerSec.value(), Skipped: m.Skipped}
	// Divergence: a null loss, or a null gradient norm on a step that fp16 loss scaling did
	// not skip (an overflow there is expected and handled).
	switch {
	case m.Loss.null() && m.GradNorm.null():
		p.NonFinite = "loss, grad_norm"
	case m.Loss.null():
		p.NonFinite = "loss"
	case m.GradNorm.null() && !m.Skipped:
		p.NonFinite = "grad_norm"
	}
	byStep[s] = p
	return nil
}

// Name labels runs that share a directory name (runs/a/tiny, runs/b/tiny) by the path they
// were given as instead.
func Name(runs []*Run) {
	count := map[string]int{}
	for _, r := range runs {
		count[r.Name]++
	}
	for _, r := range runs {
		if count[r.Name] > 1 {
			r.Name = filepath.Clean(r.Arg)
		}
	}
}
