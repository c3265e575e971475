package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"distflash/evaluate"
	"distflash/runplot"
)

// `distflash plot`: pictures of training runs from their metrics.jsonl. The command line and
// the file are here; package runplot reads the runs and draws them.

const plotUsage = `Usage: distflash plot RUN [RUN...] --out FILE.png|FILE.svg
       distflash plot --positions EVAL.json [EVAL.json...] --out FILE.png|FILE.svg

Draws training loss (and eval loss) against step and against tokens, the learning rate, the
gradient norm and tokens/s of one or several runs, overlaid with one colour per run. A RUN is
a run directory (runs/<run.name>) or its metrics.jsonl. With --positions it draws the loss by
position of eval reports (eval --positions), one line per report.

Flags:
`

// runPlot is `distflash plot`.
func runPlot(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "picture to write, FILE.png or FILE.svg (required)")
	positions := fs.Bool("positions", false, "the arguments are eval reports with the loss by position (eval --positions): draw loss against position")
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
	if len(runs) == 0 {
		fs.Usage()
		return errors.New("plot: no run given: distflash plot RUN [RUN...] --out FILE.png")
	}
	if *out == "" {
		fs.Usage()
		return errors.New("plot: --out FILE.png or FILE.svg is required")
	}
	if *positions {
		return plotPositions(runs, *out, stdout)
	}
	if err := runplot.Write(runs, *out, stderr); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "plot: wrote %s (runs: %s)\n", *out, strings.Join(runs, ", "))
	return nil
}

// plotPositions draws the loss by position of eval reports, one line per report, named by
// the model each evaluated.
func plotPositions(reports []string, out string, stdout io.Writer) error {
	var series []runplot.PositionSeries
	title := "loss by position"
	for _, path := range reports {
		raw, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		var rep evaluate.Report
		if err := json.Unmarshal(raw, &rep); err != nil {
			return fmt.Errorf("plot: %s: %w", path, err)
		}
		if rep.Positions == nil {
			return fmt.Errorf("plot: %s has no loss by position: run eval with --positions", path)
		}
		series = append(series, positionSeries(rep.Model, rep))
		title = fmt.Sprintf("loss by position: %d samples of %s, %s", rep.Samples, rep.Data, rep.Scoring)
	}
	if err := runplot.WritePositions(out, title, series); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "plot: wrote %s (reports: %s)\n", out, strings.Join(reports, ", "))
	return nil
}
