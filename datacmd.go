package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"distflash/config"
	"distflash/data"
	"distflash/evaluate"
	"distflash/internal/cli"
	"distflash/plan"
)

// progressLogInterval is how often a command without a progress bar logs a line.
const progressLogInterval = 10 * time.Second

// runTokenize is `distflash data tokenize`.
func runTokenize(args []string, stdout, stderr io.Writer) error {
	fs := root.Flags("data tokenize", stderr)
	configPath := fs.String("config", "", "TOML config file (default: the built-in defaults): data.train, data.format, data.include, data.max_bytes, data.tokenizer and run.seed say what is read")
	var sets cli.Sets
	fs.Var(&sets, "set", "override a config value, e.g. --set data.train=c4-validation.*.json.gz (repeatable)")
	out := fs.String("out", "", "output: a directory for shard-NNNNNN.tokens files, or one FILE.tokens")
	shardTokens := fs.Int64("shard-tokens", 0, fmt.Sprintf("most tokens per shard, ending at a document boundary (default %d); only with a directory", data.DefaultShardTokens))
	workers := fs.Int("workers", 0, "goroutines that encode (default: GOMAXPROCS)")
	progress := fs.Bool("progress", cli.IsTerminal(stderr), "show a progress bar on stderr (default: when stderr is a terminal; otherwise a log line every 10s)")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("data tokenize: --out is required: a directory for the shards, or a file ending in .tokens")
	}
	if cli.FlagSet(fs, "shard-tokens") && *shardTokens < 1 { // a value given is meant, not the default
		return fmt.Errorf("data tokenize: --shard-tokens %d: want at least 1 token per shard; leave the flag out for %d", *shardTokens, data.DefaultShardTokens)
	}
	cfg, err := config.Load(*configPath, sets)
	if err != nil {
		return err
	}
	tok, err := data.NewTokenizer(cfg.Data.Tokenizer)
	if err != nil {
		return fmt.Errorf("%s: data.tokenizer: %w", cfg.Origin("data.tokenizer"), err)
	}
	ctx, stop := cli.OnSignal(cli.Stopping(stderr, "data tokenize", "; the next data tokenize of "+*out+" removes what it wrote"))
	defer stop()
	mixed := len(cfg.Data.Sources) > 0
	if mixed && strings.HasSuffix(*out, ".tokens") {
		return fmt.Errorf("data tokenize: --out %s: a mixture of %d sources ([[data.sources]]) is written as one directory of shards per source: give a directory", *out, len(cfg.Data.Sources))
	}
	var written []config.SourceConfig
	for i, s := range cfg.Data.TrainSources() {
		o, key, origin := *out, "data.train", cfg.Origin("data.train")
		if mixed {
			o, key, origin = filepath.Join(*out, s.Name), fmt.Sprintf("data.sources[%d] (%q).path", i+1, s.Name), cfg.Origin("data.sources")
			fmt.Fprintf(stderr, "tokenize: source %s (%s) into %s\n", s.Name, s.Path, o)
		}
		if err := tokenizeSource(ctx, cfg, s, key, origin, o, tok, *shardTokens, *workers, *progress, *configPath != "", stdout, stderr); err != nil {
			if mixed && len(written) > 0 {
				err = fmt.Errorf("%w\n  (the sources before it are written whole: %s)", err, sourceNames(written))
			}
			return err
		}
		written = append(written, s)
	}
	if mixed {
		fmt.Fprintf(stdout, "\n# The mixture, its sources tokenized: [[data.sources]] tables to train on them\n%s", shardSources(written, *out))
	}
	return nil
}

// tokenizeSource is data tokenize of one source s (key names it for errors, origin says
// where it was set) into out.
func tokenizeSource(ctx context.Context, cfg config.Config, s config.SourceConfig, key, origin, out string, tok data.Tokenizer,
	shardTokens int64, workers int, progress, fromFile bool, stdout, stderr io.Writer) error {
	path, err := data.ExpandPath(s.Path)
	if err != nil {
		return fmt.Errorf("%s: %s = %q: %w", origin, key, s.Path, err)
	}
	src := data.Source{Path: path, Format: s.Format, TextKey: s.TextKey, Include: s.Include, MaxBytes: cfg.Data.MaxBytes, Seed: cfg.Run.Seed, Log: stderr}
	var (
		bar     *progressbar.ProgressBar
		lastLog = time.Now()
		start   = time.Now()
	)
	report := func(p data.TokenizeProgress) {
		done, total := p.Read(src.MaxBytes)
		if progress {
			if bar == nil {
				bar = cli.NewBar(stderr, total, "tokenize", true, true)
			}
			bar.Set64(done)
		} else if time.Since(lastLog) >= progressLogInterval {
			lastLog = time.Now()
			fmt.Fprintln(stderr, p.Line(time.Since(start)))
		}
	}
	stale := func(p string, bytes int64) {
		fmt.Fprintf(stderr, "tokenize: removing %s (%.1f MB), the partial output of an earlier tokenize of %s that was killed\n", p, float64(bytes)/1e6, out)
	}
	st, err := data.WriteShards(ctx, src, tok, data.ShardOptions{Out: out, ShardTokens: shardTokens, Workers: workers, Progress: report, Stale: stale})
	if bar != nil {
		bar.Finish()
	}
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("data tokenize: interrupted; the shards written so far were removed, nothing is at %s: %w", out, err)
		}
		from := ""
		if fromFile {
			from = " (" + cfg.Path + ")"
		}
		return fmt.Errorf("data tokenize: %s = %q%s: %w", key, s.Path, from, err)
	}
	fmt.Fprintln(stdout, st.Summary(out, tok.Name(), src.MaxBytes, time.Since(start)))
	return nil
}

// sourceNames lists the names of sources.
func sourceNames(sources []config.SourceConfig) string {
	var names []string
	for _, s := range sources {
		names = append(names, s.Name)
	}
	return strings.Join(names, ", ")
}

// shardSources writes the [[data.sources]] tables of sources tokenized into out/<name>: each
// the shards, its weight and its hold-out, read in the format it was written in.
func shardSources(sources []config.SourceConfig, out string) string {
	var b strings.Builder
	for _, s := range sources {
		fmt.Fprintf(&b, "[[data.sources]]\nname = %q\npath = %q\nformat = \"tokens\"\nweight = %v\n", s.Name, filepath.Join(out, s.Name), s.Weight)
		if s.Eval != "" {
			fmt.Fprintf(&b, "eval = %q\neval_format = %q\n", s.Eval, s.EvalFormat)
			if s.TextKey != "" && s.TextKey != "text" {
				fmt.Fprintf(&b, "text_key = %q\n", s.TextKey)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// runFetch is `distflash data fetch`.
func runFetch(args []string, stdout, stderr io.Writer) error {
	fs := root.Flags("data fetch", stderr)
	split := fs.String("split", "validation", "C4 split: validation (8 files) or train (1024 files)")
	shards := fs.Int("shards", 1, "number of files to fetch")
	first := fs.Int("first", 0, "index of the first file")
	out := fs.String("out", ".", "directory for the files (the shipped configs read C4 from the current directory)")
	baseURL := fs.String("base-url", data.C4BaseURL, "where the dataset lives: files are at BASE/en/c4-SPLIT.NNNNN-of-TTTTT.json.gz")
	retries := fs.Int("retries", 5, "times a download is resumed after a network error or an HTTP 429/5xx before giving up")
	progress := fs.Bool("progress", cli.IsTerminal(stderr), "show a progress bar on stderr (default: when stderr is a terminal; otherwise a line per file)")
	// The dataset name comes first (distflash data fetch c4 --split ...), but may follow the flags.
	dataset := ""
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		dataset, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if dataset == "" && fs.NArg() > 0 {
		dataset = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil { // flags after the name
			return err
		}
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("data fetch: unexpected arguments %q", fs.Args())
	}
	switch dataset {
	case "c4":
	case "":
		return errors.New("data fetch: name the dataset: distflash data fetch c4 --split validation --shards 1")
	default:
		return fmt.Errorf("data fetch: unknown dataset %q: this version fetches c4", dataset)
	}

	var (
		bar   *progressbar.ProgressBar
		log   data.FetchLog
		start = time.Now()
	)
	report := func(p data.FetchProgress) {
		if *progress && bar == nil && !p.Final {
			bar = cli.NewBar(stderr, p.Total, fmt.Sprintf("[%d/%d] %s", p.Index+1, p.Count, filepath.Base(p.File)), true, true)
		}
		if bar != nil && p.Retry == 0 {
			if p.Total > 0 && bar.GetMax64() != p.Total {
				bar.ChangeMax64(p.Total)
			}
			bar.Set64(p.Done)
		}
		line := log.Line(p)
		switch {
		case line == "":
			return
		case bar != nil && p.Final:
			bar.Finish()
			bar = nil
		case bar != nil:
			_ = bar.Clear()
		}
		fmt.Fprintln(stderr, line)
	}
	ctx, stop := cli.OnSignal(cli.Stopping(stderr, "data fetch", "; the next data fetch resumes the file it was downloading"))
	defer stop()
	paths, err := data.FetchC4(ctx, data.FetchOptions{Split: *split, First: *first, Shards: *shards, Dir: *out,
		BaseURL: *baseURL, Retries: *retries, Progress: report})
	if bar != nil {
		_ = bar.Exit()
		fmt.Fprintln(stderr)
	}
	if err != nil {
		return fmt.Errorf("%w\n  to fetch by hand: download %s/en/c4-%s.NNNNN-of-NNNNN.json.gz (curl -C - -O resumes) into %s;\n"+
			"  or point --base-url at a mirror (files under BASE/en/); --retries sets the attempts", err, cmp.Or(*baseURL, data.C4BaseURL), *split, *out)
	}
	secs := time.Since(start).Seconds()
	fmt.Fprintf(stdout, "fetched %d C4 %s files into %s: %.1f MB downloaded in %.1fs (%.1f MB/s)\n",
		len(paths), *split, *out, float64(log.Downloaded)/1e6, secs, float64(log.Downloaded)/1e6/secs)
	return nil
}

// runPasskeyDocs is `distflash data passkey`.
func runPasskeyDocs(args []string, stdout, stderr io.Writer) error {
	fs := root.Flags("data passkey", stderr)
	out := fs.String("out", "", "the file to write (required; must not exist): FILE.jsonl, one {\"text\": ...} document a line, or FILE.parquet, a string column \"text\"")
	docs := fs.Int("docs", 1000, "documents to write")
	chars := fs.String("chars", "", "MIN..MAX: each document's length in characters, drawn uniformly (required; K = 1024)")
	seed := fs.Uint64("seed", 1, "seed of the lengths, keys and depths")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	lo, hi, ok := strings.Cut(*chars, "..")
	minC, err1 := plan.ParseTokens(lo)
	maxC, err2 := plan.ParseTokens(hi)
	if !ok || err1 != nil || err2 != nil {
		return fmt.Errorf("data passkey: --chars %q: want MIN..MAX, e.g. 400..2K", *chars)
	}
	if *out == "" || !strings.HasSuffix(*out, ".jsonl") && !strings.HasSuffix(*out, ".parquet") || *docs < 1 {
		return fmt.Errorf("data passkey: --out FILE.jsonl (or FILE.parquet) and --docs N >= 1 are required (got %q, %d)", *out, *docs)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return fmt.Errorf("data passkey: %w", err)
	}
	if err := evaluate.WritePasskeyDocuments(*out, *docs, minC, maxC, *seed); err != nil {
		return fmt.Errorf("data passkey: %w", err)
	}
	fmt.Fprintf(stdout, "data passkey: wrote %d documents of %d to %d characters to %s\n", *docs, minC, maxC, *out)
	return nil
}
