// Package cli is the machinery of distflash's command line apart from its commands, which
// package main (the repository's root) holds: the command table's type (Command), from which
// the usage and the head of each command's -h are written, flag sets and the repeatable --set
// flag, one signal helper for every command (OnSignal), the progress bar, and the binary's
// version.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"distflash/parallel/transport"
)

// Command is a command, a subcommand of one, or the program itself (the root of a table): how
// it is called, what it does and what runs it. The usage (no command, help), a command's usage
// of its subcommands and the head of each command's -h are written from the table, so that no
// command can be missing there.
type Command struct {
	Name    string
	Aliases []string                                            // other names that run it
	Usage   []string                                            // its invocations after "PROGRAM NAME"; "\n" goes on in a line of its own
	Summary string                                              // what it does, in one line
	Detail  string                                              // what its -h says instead of the summary, when that says too little
	Run     func(args []string, stdout, stderr io.Writer) error // nil for one with subcommands
	Subs    []Command
	// EveryRank says that under an MPI launcher (mpirun, srun) every process runs the command:
	// it launches a world of which each process is a rank. A command without it makes its
	// output once, so rank 0 alone runs it (Rank0Only).
	EveryRank bool
}

// Rank0Only reports whether the command args name, below root, is one that a process of rank
// above 0 of an MPI launch leaves to rank 0 (not EveryRank): it is to say nothing and end well.
func (root *Command) Rank0Only(args []string, rank int) bool {
	if rank == 0 || len(args) == 0 {
		return false
	}
	c := root.Find(args[0])
	return c != nil && !c.EveryRank
}

// Execute runs the command of the table root (the program) that args name; -h (and help) of a
// command with subcommands prints its usage.
func (root *Command) Execute(args []string, stdout, stderr io.Writer) error {
	return root.dispatch(root, root.Name, args, stdout, stderr)
}

// dispatch runs the subcommand of c (at path) that args name.
func (root *Command) dispatch(c *Command, path string, args []string, stdout, stderr io.Writer) error {
	what, prefix := "command", ""
	if c != root {
		what, prefix = "subcommand", c.Name+": "
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, root.usageOf(c, path))
		return fmt.Errorf("%sno %s given", prefix, what)
	}
	if c != root && slices.Contains([]string{"-h", "-help", "--help", "help"}, args[0]) {
		fmt.Fprint(stdout, root.usageOf(c, path))
		return nil
	}
	var names []string
	for i, s := range c.Subs {
		if args[0] == s.Name || slices.Contains(s.Aliases, args[0]) {
			if s.Run == nil {
				return root.dispatch(&c.Subs[i], path+" "+s.Name, args[1:], stdout, stderr)
			}
			return s.Run(args[1:], stdout, stderr)
		}
		names = append(names, s.Name)
	}
	fmt.Fprint(stderr, root.usageOf(c, path))
	last := len(names) - 1
	return fmt.Errorf("%sunknown %s %q: want %s or %s", prefix, what, args[0], strings.Join(names[:last], ", "), names[last])
}

// Help is the run function of a `help [COMMAND [SUBCOMMAND]]` command of root: the usage, or
// what COMMAND -h says.
func (root *Command) Help(args []string, stdout, stderr io.Writer) error {
	fs := root.Flags("help", stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stdout, root.UsageText())
		return nil
	}
	return root.Execute(append(slices.Clip(fs.Args()), "-h"), stdout, stderr)
}

// UsageText is the program's usage: every invocation of every command, then what each does.
func (root *Command) UsageText() string { return root.usageOf(root, root.Name) }

// usageOf is the usage of c (the program, or a command with subcommands) at path: every
// invocation of every command below it, then what each of its subcommands does.
func (root *Command) usageOf(c *Command, path string) string {
	what, sep := "Commands", " "
	if c != root {
		what, sep = "Subcommands", ": "
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s%s%s.\n\nUsage:\n", path, sep, c.Summary)
	for _, s := range c.Subs {
		b.WriteString(Invocations(path+" "+s.Name, s))
	}
	fmt.Fprintf(&b, "\n%s:\n", what)
	width := 0
	for _, s := range c.Subs {
		width = max(width, len(s.Name))
	}
	for _, s := range c.Subs {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, s.Name, s.Summary)
	}
	fmt.Fprintf(&b, "\nRun '%s %s -h' for its flags.\n", path, strings.ToUpper(what[:len(what)-1]))
	return b.String()
}

// Invocations are the usage lines of the command c at path ("distflash data tokenize"), and
// of its subcommands.
func Invocations(path string, c Command) string {
	var b strings.Builder
	for _, u := range c.Usage {
		lead := "  " + path + " "
		b.WriteString(strings.TrimRight(lead+strings.ReplaceAll(u, "\n", "\n"+strings.Repeat(" ", len(lead))), " ") + "\n")
	}
	for _, s := range c.Subs {
		b.WriteString(Invocations(path+" "+s.Name, s))
	}
	return b.String()
}

// Find is the command at path below root ("data tokenize"), or nil.
func (root *Command) Find(path string) *Command {
	c := root
	for _, name := range strings.Fields(path) {
		i := slices.IndexFunc(c.Subs, func(s Command) bool { return s.Name == name })
		if i < 0 {
			return nil
		}
		c = &c.Subs[i]
	}
	return c
}

// About is what the command's -h says it does: Detail, else Summary as a sentence.
func (c Command) About() string {
	if c.Detail != "" {
		return c.Detail
	}
	return strings.ToUpper(c.Summary[:1]) + c.Summary[1:] + "."
}

// Flags is the flag set of the command at path below root ("train", "data tokenize"): its
// errors go to stderr, and its -h prints the command's invocations from the table, what it does
// and its flags.
func (root *Command) Flags(path string, stderr io.Writer) *flag.FlagSet {
	c := root.Find(path)
	if c == nil {
		panic("cli: no command " + path + " in the table")
	}
	fs := flag.NewFlagSet(path, flag.ContinueOnError)
	if l, _ := transport.MPIEnv(); l != nil && l.Rank > 0 {
		stderr = io.Discard // under an MPI launcher, usage and flag errors once: rank 0's
	}
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage:\n%s\n%s\n", Invocations(root.Name+" "+path, *c), c.About())
		flags := 0
		fs.VisitAll(func(*flag.Flag) { flags++ })
		if flags > 0 {
			fmt.Fprint(stderr, "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// ParseFlags parses args into fs: a command's flags, and no other arguments.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %q", fs.Name(), fs.Args())
	}
	given = nil
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "set" && f.Name != "config" && f.Name != "progress" {
			given = append(given, "--"+f.Name+"="+f.Value.String())
		}
	})
	return nil
}

// given is what Given returns.
var given []string

// Given is the flags the last ParseFlags read from its command line, as --name=value, in name
// order, without --set and --config (what they change is the config itself) and --progress
// (how a process shows progress is its own): what the processes of an MPI job must agree on
// besides the config.
func Given() []string { return given }

// FlagSet reports whether flag name was given on the command line.
func FlagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// Duration is a flag.Value of a time.Duration, as flag.Duration's, whose error for a value it
// cannot read says what is wanted (the flag package's says "parse error"): a number without a
// unit, the mistake most made, is told that it needs one.
type Duration time.Duration

// String is the duration as time.Duration writes it.
func (d *Duration) String() string { return time.Duration(*d).String() }

// Set reads a duration: 5m, 3h50m, 90s (time.ParseDuration).
func (d *Duration) Set(v string) error {
	p, err := time.ParseDuration(v)
	if err == nil {
		*d = Duration(p)
		return nil
	}
	if _, nerr := strconv.ParseFloat(v, 64); nerr == nil {
		return errors.New("a duration needs a unit: 5m, 3h50m, 90s (units ns, us, ms, s, m, h)")
	}
	return errors.New("want a duration such as 5m, 3h50m or 90s (units ns, us, ms, s, m, h)")
}

// Sets collects repeated --set section.key=value overrides (a flag.Value).
type Sets []string

// String is the overrides given, joined by commas.
func (s *Sets) String() string { return strings.Join(*s, ",") }

// Set adds an override.
func (s *Sets) Set(v string) error {
	*s = append(*s, v)
	return nil
}

// Range is what a numeric flag given must hold: above Min, and at most Max when Max is set (a
// fraction: Max 1, Min 0; a count: Min 0, an integer flag); Want says it to the user, and
// Default what leaving the flag out gives, where that is not CheckRanges' dflt.
type Range struct {
	Flag     string
	Want     string
	Min, Max float64
	Default  string
}

// CheckRanges refuses a flag of fs given outside its Range: a flag given is a value meant, so
// 0 is no memory, bandwidth, speed, samples or tokens, not the default (which leaving the
// flag out gives: dflt, or the Range's Default, names it).
func CheckRanges(fs *flag.FlagSet, dflt string, ranges []Range) error {
	for _, r := range ranges {
		if !FlagSet(fs, r.Flag) {
			continue
		}
		v, _ := strconv.ParseFloat(fs.Lookup(r.Flag).Value.String(), 64)
		if !(v > r.Min) || math.IsInf(v, 0) || (r.Max > 0 && v > r.Max) {
			above := ""
			if r.Min != 0 {
				above = fmt.Sprintf(" (above %g)", r.Min)
			}
			if r.Default != "" {
				dflt = r.Default
			}
			return fmt.Errorf("%s: --%s %s: want %s%s; leave the flag out for %s", fs.Name(), r.Flag, fs.Lookup(r.Flag).Value, r.Want, above, dflt)
		}
	}
	return nil
}
