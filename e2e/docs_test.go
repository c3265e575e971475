package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"distflash/ckpt"
	"distflash/config"
)

// The tests of this file keep the README and the guides in docs/ true to the repository and
// to the binary: every relative link names a file (and heading) that exists, none leaves the
// repository, and every flag of a distflash command shown in a code block is one the command
// accepts; and the command line's basics hold: every command's --help, version, the default
// run from any directory.

// docFiles are the markdown files the doc tests read: README.md and docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("docs/ holds no .md file")
	}
	return append([]string{"README.md"}, files...)
}

// mdLine is one line of a markdown file: its 1-based number, its text and whether it lies
// inside a fenced code block (the fence lines themselves count as fenced).
type mdLine struct {
	n      int
	text   string
	fenced bool
}

// readMarkdown splits a markdown file into lines, marking those of fenced code blocks (``` or
// ~~~, closed by a fence of the same character at least as long).
func readMarkdown(t *testing.T, path string) []mdLine {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []mdLine
	var fence string // the open fence, "" outside a block
	for i, text := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimLeft(text, " ")
		isFence := false
		for _, c := range []string{"`", "~"} {
			if n := len(trimmed) - len(strings.TrimLeft(trimmed, c)); n >= 3 {
				f := strings.Repeat(c, n)
				switch {
				case fence == "":
					fence, isFence = f, true
				case strings.HasPrefix(f, fence) && strings.TrimSpace(trimmed[n:]) == "":
					fence, isFence = "", true
				}
			}
		}
		out = append(out, mdLine{n: i + 1, text: text, fenced: fence != "" || isFence})
	}
	return out
}

var (
	headingRE = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
	// a link or image: [text](target) or [text](target "title")
	linkRE     = regexp.MustCompile(`!?\[([^\[\]]*)\]\(\s*([^()\s]*)(?:\s+"[^"]*")?\s*\)`)
	codeSpanRE = regexp.MustCompile("(`+)[^`]*?(`+)")
	schemeRE   = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

// slug is the anchor GitHub gives a heading: lower case, each space a '-', every other
// character dropped unless it is a letter, a digit, '-' or '_'. Links inside the heading count
// by their text.
func slug(heading string) string {
	heading = linkRE.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of the headings of a markdown file, a repeated heading getting
// GitHub's suffixes -1, -2, ...
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range readMarkdown(t, path) {
		if l.fenced {
			continue
		}
		m := headingRE.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if k := seen[s]; k > 0 {
			out[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// TestDocsLinks: every relative link of README.md and docs/*.md, [text](path) or
// [text](path#anchor), names a file or directory of the repository, and an anchor names a
// heading of the markdown file it points to. A path starting with / is from the repository's
// root (as GitHub reads it), any other from the file's own directory.
func TestDocsLinks(t *testing.T) {
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	heads := map[string]map[string]bool{} // markdown file → its anchors
	links := 0
	for _, f := range docFiles(t) {
		for _, l := range readMarkdown(t, f) {
			if l.fenced {
				continue
			}
			text := codeSpanRE.ReplaceAllStringFunc(l.text, func(s string) string { return strings.Repeat(" ", len(s)) })
			for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
				target := m[2]
				if target == "" || schemeRE.MatchString(target) {
					continue // a URL: not a file of the repository
				}
				links++
				where := fmt.Sprintf("%s:%d: link %q", f, l.n, m[0])
				path, anchor, _ := strings.Cut(target, "#")
				if p, err := url.PathUnescape(path); err == nil {
					path = p
				}
				var file string
				switch {
				case path == "":
					file = f // #anchor: a heading of this file
				case strings.HasPrefix(path, "/"):
					file = filepath.Clean(strings.TrimPrefix(path, "/"))
				default:
					file = filepath.Join(filepath.Dir(f), path)
				}
				if file == ".." || strings.HasPrefix(file, "../") || filepath.IsAbs(file) {
					t.Errorf("%s: %s leaves the repository", where, file)
					continue
				}
				fi, err := os.Stat(filepath.Join(root, file))
				if err != nil {
					t.Errorf("%s: %s does not exist in the repository", where, file)
					continue
				}
				if anchor == "" {
					continue
				}
				if fi.IsDir() || !strings.HasSuffix(file, ".md") {
					t.Errorf("%s: an anchor #%s on %s, which is not a markdown file", where, anchor, file)
					continue
				}
				if heads[file] == nil {
					heads[file] = anchors(t, file)
				}
				if !heads[file][anchor] {
					var have []string
					for a := range heads[file] {
						have = append(have, "#"+a)
					}
					slices.Sort(have)
					t.Errorf("%s: %s has no heading #%s (it has %s)", where, file, anchor, strings.Join(have, " "))
				}
			}
		}
	}
	t.Logf("%d relative links checked", links)
	if links < 10 {
		t.Errorf("found only %d relative links in README.md and docs/: is the link pattern broken?", links)
	}
}

// shellWords splits a command line as a shell would, roughly: words separated by blanks,
// quotes kept together (and removed), a word starting with # ending the line, and ; | &
// standing alone as separators.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	flush := func() {
		if inWord {
			words = append(words, cur.String())
		}
		cur.Reset()
		inWord = false
	}
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			flush()
		case r == '#' && !inWord:
			flush()
			return words
		case r == ';' || r == '|' || r == '&':
			flush()
			words = append(words, string(r))
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	flush()
	return words
}

// docCommands are the commands whose flags the docs are held to.
var docCommands = []string{"train", "plan", "eval", "generate", "export", "data", "plot"}

// docCommand is one invocation of distflash in a code block.
type docCommand struct {
	where string   // file:line
	help  []string // the arguments that print the command's flags, ending in -h
	flags []string // the --flags given, without dashes and values
}

// commandsIn finds the invocations of `distflash CMD` (or .../distflash, as mpirun, srun or a
// loop would run it) and `go run . CMD` in the words of one command line.
func commandsIn(where string, words []string) ([]docCommand, error) {
	var out []docCommand
	for i := 0; i < len(words); i++ {
		var rest []string
		switch {
		case filepath.Base(words[i]) == "distflash" && i+1 < len(words):
			rest = words[i+1:]
		case words[i] == "go" && i+3 < len(words) && words[i+1] == "run" && words[i+2] == ".":
			rest = words[i+3:]
		default:
			continue
		}
		if !slices.Contains(docCommands, rest[0]) {
			continue
		}
		c := docCommand{where: where, help: []string{rest[0]}}
		args := rest[1:]
		if rest[0] == "data" {
			if len(args) == 0 || !slices.Contains([]string{"tokenize", "fetch", "passkey"}, args[0]) {
				return nil, fmt.Errorf("%s: `data` without its subcommand (tokenize, fetch or passkey)", where)
			}
			c.help = append(c.help, args[0])
			args = args[1:]
			if c.help[1] == "fetch" && len(args) > 0 && args[0] == "c4" {
				c.help = append(c.help, "c4")
				args = args[1:]
			}
		}
		c.help = append(c.help, "-h")
		for _, a := range args {
			if a == ";" || a == "|" || a == "&" {
				break
			}
			if name, ok := strings.CutPrefix(a, "--"); ok && name != "" {
				name, _, _ = strings.Cut(name, "=")
				c.flags = append(c.flags, name)
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// flagLineRE matches a flag in the flag package's usage: "  -name type".
var flagLineRE = regexp.MustCompile(`(?m)^\s+-([A-Za-z0-9][A-Za-z0-9_.-]*)`)

// helpFlags runs the binary with `args` (ending in -h), which must exit 0, and returns the
// flags its usage lists.
func helpFlags(t *testing.T, args []string) map[string]bool {
	t.Helper()
	stdout, stderr, err := distflash(t, args...)
	if err != nil {
		t.Fatalf("distflash %q: %v\n%s%s", args, err, stdout, stderr)
	}
	flags := map[string]bool{"h": true, "help": true}
	for _, m := range flagLineRE.FindAllStringSubmatch(stdout+stderr, -1) {
		flags[m[1]] = true
	}
	if len(flags) == 2 {
		t.Fatalf("distflash %q listed no flags:\n%s%s", args, stdout, stderr)
	}
	return flags
}

// codeLine is one command line of a fenced code block: where it starts (file:line) and its
// text, a line ending in a backslash joined with the next.
type codeLine struct{ where, text string }

// codeLines are the command lines of the fenced code blocks of README.md and docs/*.md, in the
// order of docFiles and of each file.
func codeLines(t *testing.T) []codeLine {
	t.Helper()
	var out []codeLine
	for _, f := range docFiles(t) {
		lines := readMarkdown(t, f)
		for i := 0; i < len(lines); i++ {
			if !lines[i].fenced {
				continue
			}
			start, text := lines[i].n, lines[i].text
			for strings.HasSuffix(strings.TrimRight(text, " "), `\`) && i+1 < len(lines) && lines[i+1].fenced {
				i++
				text = strings.TrimSuffix(strings.TrimRight(text, " "), `\`) + " " + lines[i].text
			}
			out = append(out, codeLine{fmt.Sprintf("%s:%d", f, start), text})
		}
	}
	return out
}

// TestDocsFlags: every --flag of a `distflash CMD` or `go run . CMD` command line in a fenced
// code block of README.md and docs/*.md (also behind mpirun, srun or a path: ./distflash) is
// one that `CMD -h` lists; `data tokenize`, `data fetch c4` and `data passkey` are held to their own flags.
// A line ending in a backslash goes on in the next.
func TestDocsFlags(t *testing.T) {
	help := map[string]map[string]bool{}
	checked := 0
	for _, l := range codeLines(t) {
		cmds, err := commandsIn(l.where, shellWords(l.text))
		if err != nil {
			t.Error(err)
			continue
		}
		for _, c := range cmds {
			key := strings.Join(c.help, " ")
			if help[key] == nil {
				help[key] = helpFlags(t, c.help)
			}
			checked++
			for _, name := range c.flags {
				if !help[key][name] {
					var have []string
					for h := range help[key] {
						if h != "h" && h != "help" {
							have = append(have, "--"+h)
						}
					}
					slices.Sort(have)
					t.Errorf("%s: --%s is not a flag of `distflash %s` (it has %s)", l.where, name, strings.TrimSuffix(key, " -h"), strings.Join(have, " "))
				}
			}
		}
	}
	t.Logf("%d command lines checked against %d commands' flags", checked, len(help))
	if checked < 10 {
		t.Errorf("found only %d distflash command lines in the docs' code blocks: is the pattern broken?", checked)
	}
}

// docStepsDivisor shortens the runs of TestDocsRunInOrder: each run's training.steps, and the
// step directories the commands name, divided by it (at least 1).
const docStepsDivisor = 50

// docRun is a `go run . train` or `go run . export` command of a fenced code block: where it
// is (file:line), the environment variables before it and its arguments from train or export
// on, up to a ; | or &.
type docRun struct {
	where     string
	env, args []string
}

// line is the command as the reader types it, without `go run .`.
func (r docRun) line() string { return strings.Join(append(slices.Clone(r.env), r.args...), " ") }

// docRuns are the `go run . train`, `go run . export` and `go run . data passkey` commands (the
// last writes an input that a later train reads) of README.md and the guides, in the order a
// reader who follows them meets them (codeLines' order).
func docRuns(t *testing.T) []docRun {
	t.Helper()
	envVar := regexp.MustCompile(`^[A-Z_]+=`)
	var out []docRun
	for _, l := range codeLines(t) {
		words := shellWords(l.text)
		var env []string
		for len(words) > 0 && envVar.MatchString(words[0]) {
			env, words = append(env, words[0]), words[1:]
		}
		passkey := len(words) >= 5 && words[3] == "data" && words[4] == "passkey"
		if len(words) < 4 || words[0] != "go" || words[1] != "run" || words[2] != "." || (words[3] != "train" && words[3] != "export" && !passkey) {
			continue
		}
		args := words[3:]
		if i := slices.IndexFunc(args, func(a string) bool { return a == ";" || a == "|" || a == "&" }); i >= 0 {
			args = args[:i]
		}
		out = append(out, docRun{where: l.where, env: env, args: args})
	}
	return out
}

// TestDocsNoRepeatedRun: no `go run . train` or `export` command of the README and the guides
// repeats an earlier one word for word. A reader who follows them in order has run the first
// already, and the second is refused: its run directory (or export's --out) holds the first's
// output. A guide that builds on an earlier guide's run names it in its text instead.
func TestDocsNoRepeatedRun(t *testing.T) {
	first := map[string]string{} // command line → where it first is
	runs := docRuns(t)
	for _, r := range runs {
		if at, ok := first[r.line()]; ok {
			t.Errorf("%s: `go run . %s` repeats the command of %s: a reader who follows the guides in order ran it there, and its run directory (export: its --out) now holds that run and refuses it; "+
				"name that run in the text instead of repeating the command, or give this one its own run.name", r.where, r.line(), at)
			continue
		}
		first[r.line()] = r.where
	}
	if len(runs) < 15 {
		t.Errorf("only %d `go run . train` or `export` commands found: is the pattern broken?", len(runs))
	}
}

// TestDocsRunInOrder: the `go run . train`, `go run . export` and `go run . data passkey`
// commands of README.md and the guides, as written, run one after another in a fresh tree (a
// temporary directory with configs/, runs/ empty), as a reader who follows them does: the
// README's, then each guide's (docs/*.md by name), in order. None is refused for a run directory an earlier one holds
// (each names its own run, and none repeats an earlier one: TestDocsNoRepeatedRun), and each
// checkpoint or export a command names exists when it runs. To keep it short, each run's
// steps (its own, its config's or the default) and the step directories named (step-000600)
// are divided by docStepsDivisor, and 64 KiB of text is read. A command whose input comes
// from outside the tree (~/models, X.toml, C4 shards from the network) is skipped; the log
// names it.
func TestDocsRunInOrder(t *testing.T) {
	slow(t, "TestDocsFlags holds every command of the docs to the flags it has, TestDocsNoRepeatedRun keeps any from repeating an earlier one, and run_directory_test's tests refuse a run directory that holds an earlier run")
	tree := t.TempDir()
	configs, _ := filepath.Glob("configs/*.toml")
	if err := os.Mkdir(filepath.Join(tree, "configs"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range configs {
		b, err := os.ReadFile(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tree, c), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	shorter := func(n int) int { return max(1, (n+docStepsDivisor-1)/docStepsDivisor) }
	stepDir := regexp.MustCompile(`step-(\d{6})`)
	ran := 0
	for _, r := range docRuns(t) {
		text, args := "go run . "+r.line(), slices.Clone(r.args)
		if skip := docSkip(tree, args); skip != "" {
			t.Logf("%s: not run: %s", r.where, skip)
			continue
		}
		for i, a := range args {
			args[i] = stepDir.ReplaceAllStringFunc(a, func(d string) string {
				n, _ := strconv.Atoi(d[len("step-"):])
				return ckpt.StepDir(shorter(n))
			})
		}
		if args[0] == "train" {
			steps, err := docSteps(tree, args)
			if err != nil {
				t.Fatalf("%s: %v", r.where, err)
			}
			args = append(args, "--progress=false", "--set", fmt.Sprintf("training.steps=%d", shorter(steps)), "--set", "data.max_bytes=65536")
		}
		cmd := command(args...)
		cmd.Dir, cmd.Env = tree, append(os.Environ(), r.env...)
		if _, stderr, err := runCmd(t, cmd); err != nil {
			t.Errorf("%s: %s: %v\n%s", r.where, text, err, tailOf(stderr, 8))
		}
		ran++
	}
	t.Logf("%d commands ran", ran)
	if ran < 15 {
		t.Errorf("only %d `go run . train` or `export` commands ran: is the pattern broken?", ran)
	}
}

// docSkip says why a command of the docs cannot run in the fresh tree ("" when it can): it
// names a file outside it (a model under ~, a placeholder X.toml) or an input that no command
// of the docs makes in it (C4's shards, which come from the network).
func docSkip(tree string, args []string) string {
	for i, a := range args {
		if strings.Contains(a, "~/") || strings.Contains(a, "X.toml") {
			return a + " is outside the tree"
		}
		input, _ := strings.CutPrefix(a, "data.train=")
		if input == a {
			input = ""
		}
		if i > 0 && slices.Contains([]string{"--init-from", "--model", "--config"}, args[i-1]) {
			input = a
		}
		if input == "" || strings.HasPrefix(input, "$") {
			continue
		}
		if _, err := os.Stat(filepath.Join(tree, input)); err != nil {
			return input + " does not exist: no command of the docs makes it in the tree"
		}
	}
	return ""
}

// docSteps is the training.steps of a train command's args: its own --set, else its config's.
func docSteps(tree string, args []string) (int, error) {
	path, steps := "", 0
	for i, a := range args {
		if i > 0 && args[i-1] == "--config" {
			path = filepath.Join(tree, a)
		}
		if v, ok := strings.CutPrefix(a, "training.steps="); ok {
			steps, _ = strconv.Atoi(v)
		}
	}
	if steps > 0 {
		return steps, nil
	}
	cfg, err := config.Read(path, nil)
	return cfg.Training.Steps, err
}

// outside matches a relative path that leaves the repository.
var outside = regexp.MustCompile(`\.\./[A-Za-z_]`)

// TestDocsStandAlone: the README and docs/ point nowhere outside the repository.
func TestDocsStandAlone(t *testing.T) {
	files, _ := filepath.Glob("docs/*.md")
	for _, f := range append(files, "README.md") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// a path that climbs out: ../shared/DESIGN.md, ../papers (a bare `../` is an attack's name)
		for _, loc := range outside.FindAllIndex(b, -1) {
			i := loc[0]
			t.Errorf("%s points outside the repository: %q", f, b[max(0, i-40):min(len(b), i+40)])
		}
	}
}

// TestCLIBasics: every command's --help exits 0; version names the build; train without
// --config uses the built-in defaults from any directory; the config.toml a run writes is
// accepted by --config and gives the same config.
func TestCLIBasics(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"train", "--help"}, {"eval", "-h"}, {"plan", "--help"},
		{"data", "--help"}, {"data", "tokenize", "--help"}, {"data", "fetch", "-h"}, {"version"}} {
		out, code := output(t, args...)
		if code != 0 {
			t.Errorf("distflash %v: exit %d\n%s", args, code, out)
		}
	}
	if out, _ := output(t, "version"); !strings.HasPrefix(out, "distflash ") || !strings.Contains(out, "go1.") {
		t.Errorf("version: %q", out)
	}
	dir := t.TempDir()
	cmd := command("train", "--progress=false", "--set", "training.steps=1", "--set", "data.max_bytes=65536")
	cmd.Dir = dir // no configs/ here
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("train without --config in an empty directory: %v\n%s", err, out)
	}
	written := filepath.Join(dir, "runs", "tiny", "config.toml")
	cfg, err := config.Load(written, nil)
	if err != nil {
		t.Fatalf("the written config.toml: %v", err)
	}
	want := config.Default()
	want.Training.Steps, want.Data.MaxBytes = 1, 65536
	cfg.Path, want.Path = "", ""
	_ = want.Model.Resolve()
	a, _ := json.Marshal(cfg)
	b, _ := json.Marshal(want)
	if !bytes.Equal(a, b) {
		t.Errorf("config.toml reads back as\n%s\nwant\n%s", a, b)
	}
}
