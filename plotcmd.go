package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"distflash/evaluate"
	"distflash/runplot"
)

// `distflash plot`: pictures of training runs from their metrics.jsonl. The command line and
// the file are here; package runplot reads the runs and draws them.

// runPlot is `distflash plot`.
func runPlot(args []string, stdout, stderr io.Writer) error {
	fs := root.Flags("plot", stderr)
	out := fs.String("out", "", "picture to write, FILE.png or FILE.svg (required)")
	positions := fs.Bool("positions", false, "the arguments are eval reports with the loss by position (eval --positions): draw loss against position")
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
		reports, err := evaluate.ReadPositionReports(runs)
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		if err := evaluate.PlotPositions(*out, reports, nil); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "plot: wrote %s (reports: %s)\n", *out, strings.Join(runs, ", "))
		return nil
	}
	if err := runplot.Write(runs, *out, stderr); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "plot: wrote %s (runs: %s)\n", *out, strings.Join(runs, ", "))
	return nil
}
