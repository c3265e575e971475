package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// leaves are the commands of the table that run, by path ("train", "data tokenize").
func leaves() map[string]*command {
	out := map[string]*command{}
	var walk func(c *command, path string)
	walk = func(c *command, path string) {
		for i := range c.subs {
			s := &c.subs[i]
			if s.run != nil {
				out[strings.TrimSpace(path+" "+s.name)] = s
			}
			walk(s, path+" "+s.name)
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
	for _, c := range root.subs {
		if !strings.Contains(top, "\n  "+c.name+" ") || !strings.Contains(top, c.summary) {
			t.Errorf("the usage does not list %s (%s):\n%s", c.name, c.summary, top)
		}
	}
	for _, s := range find(t, "data").subs {
		if !strings.Contains(data.String(), "\n  "+s.name+" ") || !strings.Contains(data.String(), s.summary) {
			t.Errorf("data -h does not list %s:\n%s", s.name, data.String())
		}
	}
	for path, c := range leaves() {
		lines := invocations("distflash "+path, *c)
		if !strings.Contains(top, lines) || (strings.HasPrefix(path, "data ") && !strings.Contains(data.String(), lines)) {
			t.Errorf("%s: the usage lacks\n%s", path, lines)
		}
		help := helpOf(t, strings.Fields(path))
		if !strings.Contains(help, lines) {
			t.Errorf("%s -h does not show its usage:\n%s", path, help)
		}
		for _, m := range usageFlagRE.FindAllStringSubmatch(strings.Join(c.usage, " "), -1) {
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
func find(t *testing.T, path string) *command {
	t.Helper()
	c := &root
	for _, name := range strings.Fields(path) {
		found := false
		for i := range c.subs {
			if c.subs[i].name == name {
				c, found = &c.subs[i], true
				break
			}
		}
		if !found {
			t.Fatalf("no command %q", path)
		}
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
		about := c.detail
		if about == "" {
			about = strings.ToUpper(c.summary[:1]) + c.summary[1:] + "."
		}
		if !strings.Contains(help, about) {
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

// signals drives interrupt.watch with a signal channel and an exit of its own: what the
// hooks did, in order, and the exit status.
type signals struct {
	sigs   chan os.Signal
	events chan string
	ctx    context.Context
	stop   func()
}

func watch(stop, exit bool) *signals {
	s := &signals{sigs: make(chan os.Signal), events: make(chan string, 8)}
	var h interrupt
	if stop {
		h.stop = func() { s.events <- "stop" }
	}
	if exit {
		h.exit = func() { s.events <- "exit hook" }
	}
	s.ctx, s.stop = h.watch(s.sigs, func(code int) { s.events <- "exit " + strconv.Itoa(code) })
	return s
}

// next is the next thing the hooks did ("" when nothing happens for a while).
func (s *signals) next() string {
	select {
	case e := <-s.events:
		return e
	case <-time.After(200 * time.Millisecond):
		return ""
	}
}

// TestSignal: the first signal runs the stop hook and then cancels the context; a second
// runs the exit hook and exits with status 130. Without a stop hook the first signal exits
// (export). After stop, signals do nothing and the context is cancelled.
func TestSignal(t *testing.T) {
	s := watch(true, true)
	if s.ctx.Err() != nil {
		t.Fatal("cancelled before a signal")
	}
	s.sigs <- syscall.SIGINT
	if e := s.next(); e != "stop" {
		t.Fatalf("first signal: %q, want the stop hook", e)
	}
	select {
	case <-s.ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("the first signal did not cancel the context")
	}
	if e := s.next(); e != "" {
		t.Fatalf("after the first signal: %q", e)
	}
	s.sigs <- syscall.SIGTERM
	if a, b := s.next(), s.next(); a != "exit hook" || b != "exit 130" {
		t.Fatalf("second signal: %q, %q; want the exit hook, then exit 130", a, b)
	}
	s.stop()

	s = watch(false, true)
	s.sigs <- syscall.SIGTERM
	if a, b := s.next(), s.next(); a != "exit hook" || b != "exit 130" {
		t.Fatalf("first signal without a stop hook: %q, %q; want the exit hook, then exit 130", a, b)
	}
	s.stop()

	s = watch(true, true)
	s.stop()
	s.stop() // twice is harmless
	select {
	case s.sigs <- syscall.SIGINT:
	case <-time.After(50 * time.Millisecond):
	}
	if e := s.next(); e != "" {
		t.Errorf("a signal after stop: %q", e)
	}
	if s.ctx.Err() == nil {
		t.Error("stop did not cancel the context")
	}
}

// TestSignalMessages: a command that stops says so on the first signal and that it stopped
// at once on the second, with what it leaves; say speaks only for the process that speaks.
func TestSignalMessages(t *testing.T) {
	var buf bytes.Buffer
	h := stopping(&buf, "data fetch", "; the next data fetch resumes it")
	h.stop()
	h.exit()
	want := "\ndata fetch: stopping (Ctrl-C again to stop at once)\n\ndata fetch: stopped at once; the next data fetch resumes it\n"
	if buf.String() != want {
		t.Errorf("got %q, want %q", buf.String(), want)
	}
	buf.Reset()
	say(&buf, false, func() string { return "rank 1" })()
	if buf.Len() != 0 {
		t.Errorf("a rank that does not speak said %q", buf.String())
	}
}
