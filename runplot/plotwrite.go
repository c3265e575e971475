package runplot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// WriteRun draws the run in runDir into out (.png or .svg), as `distflash plot runDir
// --out out` does, without warnings: train calls it at the end of a run.
func WriteRun(runDir string, out string) error {
	return Write([]string{runDir}, out, io.Discard)
}

// Write reads every run (a run directory or a metrics.jsonl), draws them overlaid and
// writes the picture to out, whose extension picks the format. Nothing is written unless
// every run reads and the picture draws; warnings about skipped lines go to warn.
func Write(runs []string, out string, warn io.Writer) error {
	format, err := Format(out)
	if err != nil {
		return err
	}
	var rs []*Run
	for _, arg := range runs {
		r, err := Read(arg)
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		for _, w := range r.Warnings {
			fmt.Fprintf(warn, "plot: warning: %s\n", w)
		}
		rs = append(rs, r)
	}
	Name(rs)
	var buf bytes.Buffer
	if err := Draw(&buf, rs, format); err != nil {
		return fmt.Errorf("plot: draw %s: %w", out, err)
	}
	return writeFile(out, buf.Bytes())
}

// Format returns the picture format of out, told by its extension.
func Format(out string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(out)); ext {
	case ".png", ".svg":
		return ext[1:], nil
	}
	return "", fmt.Errorf("plot: --out %q: want a file name ending in .png or .svg", out)
}

// writeFile writes data to path through a temporary file in the same directory, so a
// reader (or a failure) never sees half a picture.
func writeFile(path string, data []byte) error {
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
