package main

import (
	"bytes"
	"errors"
	"flag"
	"regexp"
	"strings"
	"testing"

	"distflash/internal/cli"
)

// leaves are the commands of the table that run, by path ("train", "data tokenize").
func leaves() map[string]*cli.Command {
	out := map[string]*cli.Command{}
	var walk func(c *cli.Command, path string)
	walk = func(c *cli.Command, path string) {
		for i := range c.Subs {
			s := &c.Subs[i]
			if s.Run != nil {
				out[strings.TrimSpace(path+" "+s.Name)] = s
			}
			walk(s, path+" "+s.Name)
		}
	}
	walk(&root, "")
	return out
}

// usageFlagRE finds the flags a usage line names: --name.
var usageFlagRE = regexp.MustCompile(`--([a-z][a-z0-9-]*)`)

// helpFlagRE finds the flags -h lists: "  -name".
var helpFlagRE = regexp.MustCompile(`(?m)^  -([a-z][a-z0-9-]*)`)

// TestUsageListsEveryCommand: the usage (no command, help, -h) names every command and
// subcommand of the table with its summary and prints each of its invocations, and every
// flag an invocation names is one that the command's -h lists; `data -h` does the same for
// data's subcommands. The usage is not a failure when asked for, and is one without a command.
func TestUsageListsEveryCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run([]string{"help"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	top := stdout.String()
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}} {
		stdout.Reset()
		if err := run(args, &stdout, &stderr); err != nil || stdout.String() != top {
			t.Errorf("%q: %v, a usage other than help's:\n%s", args, err, stdout.String())
		}
	}
	stderr.Reset()
	if err := run(nil, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "no command given") || stderr.String() != top {
		t.Errorf("no command: %v, usage %q", err, stderr.String())
	}
	var data bytes.Buffer
	if err := run([]string{"data", "-h"}, &data, &stderr); err != nil {
		t.Fatal(err)
	}
	for _, c := range root.Subs {
		if !strings.Contains(top, "\n  "+c.Name+" ") || !strings.Contains(top, c.Summary) {
			t.Errorf("the usage does not list %s (%s):\n%s", c.Name, c.Summary, top)
		}
	}
	for _, s := range find(t, "data").Subs {
		if !strings.Contains(data.String(), "\n  "+s.Name+" ") || !strings.Contains(data.String(), s.Summary) {
			t.Errorf("data -h does not list %s:\n%s", s.Name, data.String())
		}
	}
	for path, c := range leaves() {
		lines := cli.Invocations("distflash "+path, *c)
		if !strings.Contains(top, lines) || (strings.HasPrefix(path, "data ") && !strings.Contains(data.String(), lines)) {
			t.Errorf("%s: the usage lacks\n%s", path, lines)
		}
		help := helpOf(t, strings.Fields(path))
		if !strings.Contains(help, lines) {
			t.Errorf("%s -h does not show its usage:\n%s", path, help)
		}
		for _, m := range usageFlagRE.FindAllStringSubmatch(strings.Join(c.Usage, " "), -1) {
			if !regexp.MustCompile(`(?m)^  -` + m[1] + `\b`).MatchString(help) {
				t.Errorf("the usage of %s names --%s, which is not one of its flags:\n%s", path, m[1], help)
			}
		}
	}
	if !strings.Contains(top, "distflash data passkey --out FILE.jsonl") {
		t.Errorf("the usage lacks data passkey:\n%s", top)
	}
}

// find is the command at path in the table.
func find(t *testing.T, path string) *cli.Command {
	t.Helper()
	c := root.Find(path)
	if c == nil {
		t.Fatalf("no command %q", path)
	}
	return c
}

// helpOf is what `distflash PATH -h` says: the command's -h is not a failure (flag.ErrHelp,
// which main does not count as one) and lists flags.
func helpOf(t *testing.T, path []string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(append(path, "-h"), &stdout, &stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("%q -h: %v", path, err)
	}
	return stdout.String() + stderr.String()
}

// TestHelpOfEveryCommand: -h of every command prints its invocations, what it does and its
// flags; `help COMMAND` says the same.
func TestHelpOfEveryCommand(t *testing.T) {
	for path, c := range leaves() {
		help := helpOf(t, strings.Fields(path))
		if !strings.HasPrefix(help, "Usage:\n  distflash "+path) {
			t.Errorf("%s -h:\n%s", path, help)
		}
		if !strings.Contains(help, c.About()) {
			t.Errorf("%s -h does not say what it does:\n%s", path, help)
		}
		if flags := helpFlagRE.FindAllString(help, -1); (path != "version" && path != "help") != (len(flags) > 0 && strings.Contains(help, "\nFlags:\n")) {
			t.Errorf("%s -h lists flags %q:\n%s", path, flags, help)
		}
		var stdout, stderr bytes.Buffer
		err := run(append([]string{"help"}, strings.Fields(path)...), &stdout, &stderr)
		if !errors.Is(err, flag.ErrHelp) || stderr.String() != help {
			t.Errorf("help %s: %v\n%s", path, err, stderr.String())
		}
	}
}

// TestUnknownCommand: an unknown command or subcommand fails naming it and the ones there
// are, after the usage; a command given arguments it does not take fails naming them.
func TestUnknownCommand(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"bogus"}, []string{`unknown command "bogus"`, "train, plan, eval, generate, export, data, plot, version or help"}},
		{[]string{"data"}, []string{"data: no subcommand given"}},
		{[]string{"data", "shuffle"}, []string{`data: unknown subcommand "shuffle"`, "tokenize, fetch or passkey"}},
		{[]string{"version", "x"}, []string{`version: unexpected arguments ["x"]`}},
	} {
		var stdout, stderr bytes.Buffer
		err := run(tt.args, &stdout, &stderr)
		for _, w := range tt.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v, want %q", tt.args, err, w)
			}
		}
		if tt.args[0] != "version" && !strings.Contains(stderr.String(), "Usage:\n") {
			t.Errorf("%q: no usage:\n%s", tt.args, stderr.String())
		}
	}
}

// TestVersion: version, -version and --version name the binary and its Go.
func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "-version", "--version"} {
		var stdout, stderr bytes.Buffer
		if err := run([]string{arg}, &stdout, &stderr); err != nil || !strings.HasPrefix(stdout.String(), "distflash ") || !strings.Contains(stdout.String(), "go1.") {
			t.Errorf("%s: %v, %q", arg, err, stdout.String())
		}
	}
}
