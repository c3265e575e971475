package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"distflash/runplot"
)

// `distflash plot`: pictures of training runs from their metrics.jsonl. The command line and
// the file are here; package runplot reads the runs and draws them.

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
	if len(runs) == 0 {
		fs.Usage()
		return errors.New("plot: no run given: distflash plot RUN [RUN...] --out FILE.png")
	}
	if *out == "" {
		fs.Usage()
		return errors.New("plot: --out FILE.png or FILE.svg is required")
	}
	if err := runplot.Write(runs, *out, stderr); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "plot: wrote %s (runs: %s)\n", *out, strings.Join(runs, ", "))
	return nil
}
