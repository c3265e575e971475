// Command distflash trains LLaMA-family models on long sequences: sequence-parallel
// distributed FlashAttention, rematerialization-aware activation checkpointing, FSDP-style
// sharding and mixed-precision AdamW, on a laptop CPU or a GPU cluster.
//
// This package is the command line: the commands as a table (cli.go), from which `distflash
// help` is written, one file of flags and printing per command, and one signal helper
// (signal.go). See README.md and docs/design.md for the configuration and the design.
package main

import (
	"distflash/parallel/transport"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
)

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp): // -h prints the command's flags: not a failure
		return
	}
	if l, _ := transport.MPIEnv(); l != nil && l.Size > 1 && l.Rank > 0 {
		// one of several ranks: rank 0 says what every rank found alike (the config, the
		// memory), and each other rank only what is its own
		var same *everyRank
		if !errors.As(err, &same) {
			fmt.Fprintf(os.Stderr, "distflash: rank %d: %v\n", l.Rank, err)
		}
		os.Exit(2)
	}
	fmt.Fprintln(os.Stderr, "distflash:", err)
	os.Exit(2)
}

// everyRank marks an error that every rank of a launched world meets alike (an invalid config,
// a model that does not fit): only rank 0 prints it.
type everyRank struct{ error }

func (e *everyRank) Unwrap() error { return e.error }

// runVersion is `distflash version`.
func runVersion(args []string, stdout, stderr io.Writer) error {
	if err := parseFlags(newFlags("version", stderr), args); err != nil {
		return err
	}
	fmt.Fprintln(stdout, version())
	return nil
}

// version describes this binary: its module version or VCS commit (with "+dirty" for a build
// from a modified tree), the Go version and the build tags that select CUDA and MPI.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "distflash (no build information)"
	}
	v, commit, dirty, tags := bi.Main.Version, "", false, ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		case "-tags":
			tags = s.Value
		}
	}
	if commit != "" {
		if len(commit) > 12 {
			commit = commit[:12]
		}
		v = "commit " + commit
		if dirty {
			v += "+dirty"
		}
	}
	out := fmt.Sprintf("distflash %s, %s %s/%s", v, bi.GoVersion, runtime.GOOS, runtime.GOARCH)
	if tags != "" {
		out += ", tags " + tags
	}
	return out
}

// setFlags collects repeated --set section.key=value overrides.
type setFlags []string

func (s *setFlags) String() string { return strings.Join(*s, ",") }

func (s *setFlags) Set(v string) error {
	*s = append(*s, v)
	return nil
}
