package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// command is a command of distflash, or a subcommand of one: how it is called, what it does
// and what runs it. The usage (no command, `distflash help`), `distflash data -h` and the head
// of each command's -h are written from the table, so that no command can be missing there.
type command struct {
	name    string
	aliases []string                                            // other names that run it
	usage   []string                                            // its invocations after "distflash NAME"; "\n" goes on in a line of its own
	summary string                                              // what it does, in one line
	detail  string                                              // what its -h says instead of the summary, when that says too little
	run     func(args []string, stdout, stderr io.Writer) error // nil for a command with subcommands
	subs    []command
}

// commands are distflash's commands, in the order of the usage. They are set in init, since
// their run functions read their usage from the table.
var commands []command

func init() {
	commands = []command{
		{name: "train", run: runTrain, summary: "train a model from a TOML config (configs/tiny.toml runs on a laptop CPU)", usage: []string{
			"--config FILE [--set section.key=value ...] [--progress=false] [--init-from MODEL]",
			"--config FILE --resume auto [--time-limit 3h50m] [--stop-after STEP] [--profile DIR]"}},
		{name: "plan", run: runPlan, summary: "predict memory, communication and step time of a config on a GPU cluster", usage: []string{
			"--config FILE [--set k=v ...] [--cluster 2x8xA100-80GB] [--format text|json]\n[--sweep seq_len=8K..512K] [--attention all|NAME] [--mfu F] [--attn-mfu F]"}},
		{name: "eval", run: runEval, summary: "loss, perplexity and bits per byte of a model on text, by position; passkey retrieval", usage: []string{
			"--model PATH --data FILE [--config FILE] [--samples 100] [--seq-len 2048] [--out FILE]\n[--positions] [--sliding-window W --stride S] [--plot FILE.png]",
			"--model PATH --task passkey [--lengths 1K,2K,4K] [--trials 20] [--plot FILE.png]"}},
		{name: "generate", run: runGenerate, summary: "continue a prompt with a model (KV cache, greedy or sampled; sequence-parallel)", usage: []string{
			"--model PATH --prompt TEXT|--prompt-file FILE [--max-new-tokens 128]\n[--temperature T] [--top-k K] [--top-p P] [--seed S] [--samples N]"}},
		{name: "export", run: runExport, summary: "write a checkpoint as a Hugging Face LLaMA directory (config.json, safetensors, tokenizer)", usage: []string{
			"--model CHECKPOINT --out DIR [--dtype f32|bf16] [--max-shard-size 5GB]"}},
		{name: "data", summary: "tokenize data.train into token shards; download C4; write passkey documents", subs: []command{
			{name: "tokenize", run: runTokenize, summary: "encode data.train with data.tokenizer into token shards (train reads them: data.format = tokens)", usage: []string{
				"--config FILE [--set k=v ...] --out DIR|FILE.tokens [--shard-tokens N]"}},
			{name: "fetch", run: runFetch, summary: `download files of C4 "en" (allenai/c4 on the Hugging Face Hub), resuming interrupted ones`, usage: []string{
				"c4 [--split validation|train] [--shards N] [--first K] [--out DIR] [--base-url URL]"}},
			{name: "passkey", run: runPasskeyDocs, summary: "write passkey-retrieval documents (eval --task passkey's prompts, answered) as jsonl", usage: []string{
				"--out FILE.jsonl --docs N --chars MIN..MAX [--seed S]"}},
		}},
		{name: "plot", run: runPlot, summary: "draw loss, eval loss, learning rate, gradient norm and tokens/s of runs, overlaid", usage: []string{
			"RUN [RUN...] --out FILE.png|FILE.svg",
			"--positions EVAL.json [EVAL.json...] --out FILE.png|FILE.svg"},
			detail: `Draws training loss (and eval loss) against step and against tokens, the learning rate, the
gradient norm and tokens/s of one or several runs, overlaid with one colour per run. A RUN is
a run directory (runs/<run.name>) or its metrics.jsonl. With --positions it draws the loss by
position of eval reports (eval --positions), one line per report.`},
		{name: "version", aliases: []string{"-version", "--version"}, run: runVersion, usage: []string{""},
			summary: "the version of this binary (commit, Go version, build tags)"},
		{name: "help", aliases: []string{"-h", "-help", "--help"}, run: runHelp, usage: []string{"[COMMAND [SUBCOMMAND]]"},
			summary: "this usage, or what COMMAND -h says"},
	}
	root.subs = commands
}

// root is distflash itself, whose subcommands are the commands.
var root = command{name: "distflash", summary: "trains LLaMA-family models on long sequences"}

// run runs the command that args name.
func run(args []string, stdout, stderr io.Writer) error {
	return dispatch(&root, args, stdout, stderr)
}

// dispatch runs the subcommand of c that args name; -h (and help) of a command with
// subcommands prints its usage.
func dispatch(c *command, args []string, stdout, stderr io.Writer) error {
	what, prefix := "command", ""
	if c != &root {
		what, prefix = "subcommand", c.name+": "
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage(c))
		return fmt.Errorf("%sno %s given", prefix, what)
	}
	if c != &root && slices.Contains([]string{"-h", "-help", "--help", "help"}, args[0]) {
		fmt.Fprint(stdout, usage(c))
		return nil
	}
	var names []string
	for i, s := range c.subs {
		if args[0] == s.name || slices.Contains(s.aliases, args[0]) {
			if s.run == nil {
				return dispatch(&c.subs[i], args[1:], stdout, stderr)
			}
			return s.run(args[1:], stdout, stderr)
		}
		names = append(names, s.name)
	}
	fmt.Fprint(stderr, usage(c))
	last := len(names) - 1
	return fmt.Errorf("%sunknown %s %q: want %s or %s", prefix, what, args[0], strings.Join(names[:last], ", "), names[last])
}

// runHelp is `distflash help [COMMAND [SUBCOMMAND]]`.
func runHelp(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("help", stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stdout, usage(&root))
		return nil
	}
	return run(append(slices.Clip(fs.Args()), "-h"), stdout, stderr)
}

// usage is the usage of a command with subcommands (distflash, or data): every invocation of
// every command below it, then what each of its subcommands does.
func usage(c *command) string {
	what, path, sep := "Commands", "distflash", " "
	if c != &root {
		what, path, sep = "Subcommands", "distflash "+c.name, ": "
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s%s%s.\n\nUsage:\n", path, sep, c.summary)
	for _, s := range c.subs {
		b.WriteString(invocations(path+" "+s.name, s))
	}
	fmt.Fprintf(&b, "\n%s:\n", what)
	width := 0
	for _, s := range c.subs {
		width = max(width, len(s.name))
	}
	for _, s := range c.subs {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, s.name, s.summary)
	}
	fmt.Fprintf(&b, "\nRun '%s %s -h' for its flags.\n", path, strings.ToUpper(what[:len(what)-1]))
	return b.String()
}

// invocations are the usage lines of the command c at path, and of its subcommands.
func invocations(path string, c command) string {
	var b strings.Builder
	for _, u := range c.usage {
		lead := "  " + path + " "
		b.WriteString(strings.TrimRight(lead+strings.ReplaceAll(u, "\n", "\n"+strings.Repeat(" ", len(lead))), " ") + "\n")
	}
	for _, s := range c.subs {
		b.WriteString(invocations(path+" "+s.name, s))
	}
	return b.String()
}

// newFlags is the flag set of the command at path ("train", "data tokenize"): its errors go to
// stderr, and its -h prints the command's invocations from the table, what it does and its
// flags.
func newFlags(path string, stderr io.Writer) *flag.FlagSet {
	c := &root
	for _, name := range strings.Fields(path) {
		c = &c.subs[slices.IndexFunc(c.subs, func(s command) bool { return s.name == name })]
	}
	fs := flag.NewFlagSet(path, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		about := c.detail
		if about == "" {
			about = strings.ToUpper(c.summary[:1]) + c.summary[1:] + "."
		}
		fmt.Fprintf(stderr, "Usage:\n%s\n%s\n", invocations("distflash "+path, *c), about)
		flags := 0
		fs.VisitAll(func(*flag.Flag) { flags++ })
		if flags > 0 {
			fmt.Fprint(stderr, "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parseFlags parses args into fs: a command's flags, and no other arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %q", fs.Name(), fs.Args())
	}
	return nil
}

// flagSet reports whether flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
