package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	var rs []*runplot.Run
	for _, arg := range runs {
		r, err := runplot.Read(arg)
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		for _, w := range r.Warnings {
			fmt.Fprintf(warn, "plot: warning: %s\n", w)
		}
		rs = append(rs, r)
	}
	runplot.Name(rs)
	var buf bytes.Buffer
	if err := runplot.Draw(&buf, rs, format); err != nil {
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
