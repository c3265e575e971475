package data

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"distflash/sysmem"
)

// encBatch is a run of consecutive documents that one worker encodes.
type encBatch struct {
	text  []byte  // the documents back to back
	ends  []int   // end of each document in text
	toks  []int32 // their tokens back to back
	tends []int   // end of each document's tokens in toks
	done  chan struct{}
}

// encBatchBytes is the text a batch collects before it goes to a worker (a variable for
// tests).
var encBatchBytes = 1 << 20

// encodeDocs walks w's documents and encodes them with tok on up to workers goroutines (0:
// GOMAXPROCS), calling emit with each document's tokens and its text length, in order, on
// the calling goroutine. emit must not keep tokens. An error from emit or from ctx ends the
// walk and is returned.
func encodeDocs(ctx context.Context, w *docWalk, tok Tokenizer, workers int, emit func(tokens []int32, textBytes int) error) error {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	enc := appendEncoder(tok)
	jobs := make(chan *encBatch, workers)
	ordered := make(chan *encBatch, 2*workers)
	stop := make(chan struct{})
	free := make(chan *encBatch, 3*workers) // batches to reuse
	newBatch := func() *encBatch {
		select {
		case b := <-free:
			b.text, b.ends, b.toks, b.tends = b.text[:0], b.ends[:0], b.toks[:0], b.tends[:0]
			b.done = make(chan struct{})
			return b
		default:
			return &encBatch{done: make(chan struct{})}
		}
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for b := range jobs {
				// Most tokenizers give at most one token per byte.
				b.toks = slices.Grow(b.toks[:0], len(b.text))
				start := 0
				for _, end := range b.ends {
					b.toks = enc(b.toks, b.text[start:end])
					b.tends = append(b.tends, len(b.toks))
					start = end
				}
				close(b.done)
			}
		})
	}
	var walkErr error
	go func() {
		defer close(ordered)
		defer close(jobs)
		b := newBatch()
		send := func() bool {
			select {
			case ordered <- b:
			case <-stop:
				return false
			}
			jobs <- b
			b = newBatch()
			return true
		}
		n := 0
		_, walkErr = w.each(func(d []byte) error {
			if n++; n%64 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			b.text = append(b.text, d...)
			b.ends = append(b.ends, len(b.text))
			if len(b.text) >= encBatchBytes && !send() {
				return errStopWalk
			}
			return nil
		})
		if walkErr == errStopWalk {
			walkErr = nil
		}
		if walkErr == nil && len(b.ends) > 0 {
			send()
		}
	}()
	var emitErr error
	defer w.flushLog()
	for b := range ordered {
		w.flushLog()
		<-b.done
		if emitErr != nil {
			continue
		}
		start, tstart := 0, 0
		for i, end := range b.ends {
			if emitErr = emit(b.toks[tstart:b.tends[i]], end-start); emitErr != nil {
				close(stop)
				break
			}
			start, tstart = end, b.tends[i]
		}
		select {
		case free <- b:
		default:
		}
	}
	wg.Wait()
	if emitErr != nil {
		return emitErr
	}
	if walkErr == nil {
		walkErr = ctx.Err()
	}
	return walkErr
}

// DefaultShardTokens is the most tokens WriteShards puts in a shard when
// ShardOptions.ShardTokens is 0: 200 MB of uint16 tokens.
const DefaultShardTokens = 100_000_000

// ShardOptions says where WriteShards writes and how it reports.
type ShardOptions struct {
	// Out is a directory, created if needed, for shards named shard-000000.tokens,
	// shard-000001.tokens, …, or a file whose name ends in .tokens for one shard. It must
	// not hold shards already (a directory) or exist (a file).
	Out string
	// ShardTokens is the most tokens a shard holds (0: DefaultShardTokens): shards end at
	// document boundaries, and a document longer than this gets a shard of its own. It must
	// be 0 when Out is a file.
	ShardTokens int64
	// Workers is the number of goroutines that encode (0: GOMAXPROCS).
	Workers int
	// Progress, when set, is called now and then during the run and once at its end.
	Progress func(TokenizeProgress)
	// Stale, when set, hears of each staging directory of Out that a killed WriteShards left
	// (on this host, by a process that no longer runs) before it is removed.
	Stale func(path string, bytes int64)
}

// TokenizeProgress is how far WriteShards has come.
type TokenizeProgress struct {
	Files      int   // files to read
	FilesRead  int   // files opened so far (fewer than Files when MaxBytes ends the read)
	InputBytes int64 // bytes read from the files (compressed bytes for compressed files)
	InputTotal int64 // the files' sizes
	TextBytes  int64 // bytes of text tokenized, DocSeparators between documents included
	Documents  int64 // documents tokenized
	Tokens     int64 // tokens written, separators included
}

// TokenizeStats is what WriteShards wrote.
type TokenizeStats struct {
	TokenizeProgress
	Shards []string // the shards' paths, in stream order
}

// WriteShards reads src as LoadTokens does (same documents, same order, same MaxBytes),
// encodes it with tok and writes token shards (see ShardHeader) to opt.Out. Reading the
// shards back with format "tokens" gives the stream LoadTokens gives for src.
//
// It fails if opt.Out already holds shards. The shards are written into a staging directory
// beside Out (.NAME.tokenize-HOST-PID) and moved to Out only when all are complete: a new or
// empty directory Out is the staging directory renamed, in one step; into a directory that
// holds other files the shards are renamed one by one. So a killed WriteShards leaves no
// shards that could pass for a whole set, only its staging directory, which the next
// WriteShards of the same Out removes (opt.Stale hears of it). On any error, or when ctx is
// cancelled, the staging directory is removed.
func WriteShards(ctx context.Context, src Source, tok Tokenizer, opt ShardOptions) (TokenizeStats, error) {
	var st TokenizeStats
	if tok == nil {
		return st, fmt.Errorf("data: WriteShards: nil Tokenizer")
	}
	format, err := checkFormat(src.Format)
	if err != nil {
		return st, err
	}
	if format == "tokens" {
		return st, fmt.Errorf("data: write shards: the source %s is already token shards (format \"tokens\"); tokenize the text, jsonl, c4 or parquet files they came from", src.Path)
	}
	if opt.ShardTokens < 0 {
		return st, fmt.Errorf("data: WriteShards: ShardTokens = %d: must be >= 0 (0 = %d)", opt.ShardTokens, DefaultShardTokens)
	}
	single := strings.HasSuffix(opt.Out, ".tokens")
	if _, err := shardNamer(opt.Out, single, opt.ShardTokens); err != nil { // checks Out
		return st, err
	}
	limit := opt.ShardTokens
	if limit == 0 {
		limit = DefaultShardTokens
	}
	if single {
		limit = -1
	}
	w, err := newDocWalk(src, true)
	if err != nil {
		return st, err
	}
	stage, err := newStage(opt.Out, opt.Stale)
	if err != nil {
		return st, err
	}
	next, _ := shardNamer(filepath.Join(stage, "shards"), false, 0)
	st.Files = len(w.files)
	for _, f := range w.files {
		if fi, err := os.Stat(f); err == nil {
			st.InputTotal += fi.Size()
		}
	}
	var mu sync.Mutex  // InputBytes is counted on the walking goroutine
	var textRead int64 // the text the walk has given, ahead of what is written
	w.onRead = func(n int64) {
		mu.Lock()
		st.InputBytes += n
		mu.Unlock()
	}
	w.onText = func(n int64) {
		mu.Lock()
		textRead += n
		mu.Unlock()
	}
	w.onFile = func() {
		mu.Lock()
		st.FilesRead++
		mu.Unlock()
	}
	report := func() {
		if opt.Progress != nil {
			mu.Lock()
			p := st.TokenizeProgress
			mu.Unlock()
			opt.Progress(p)
		}
	}
	report()

	sepLen := int64(len(tok.Encode([]byte{DocSeparator})))
	var (
		sw         *ShardWriter
		lastReport int64
		closed     int64 // the bytes of the shards closed
	)
	free, freeOK := sysmem.DiskFree(stage)
	fail := func(err error) (TokenizeStats, error) {
		if errors.Is(err, syscall.ENOSPC) {
			// the fraction of the input whose text is in the shards written: the walk reads
			// ahead of the writer, so the input read is scaled by the text written over the
			// text read (compressed input: bytes on disk per byte of text)
			mu.Lock()
			done := writtenFraction(st.TokenizeProgress, textRead, src.MaxBytes)
			mu.Unlock()
			// done is of the text given to the shards, some of it still in their buffers:
			// the estimate scales what they were given, not what reached the disk
			given := closed
			if sw != nil {
				given += sw.Size()
			}
			err = diskFull(opt.Out, sysmem.TreeBytes(stage), given, done, free, freeOK)
		}
		if sw != nil {
			sw.Abort()
		}
		os.RemoveAll(stage)
		return TokenizeStats{TokenizeProgress: st.TokenizeProgress}, err
	}
	// closeShard closes sw and adds it to the shards; a shard that fails to close is removed
	// by Close, so sw is nil after it either way
	closeShard := func() error {
		closed += sw.Size()
		err := sw.Close()
		if err == nil {
			st.Shards = append(st.Shards, sw.path)
		}
		sw = nil
		return err
	}
	err = encodeDocs(ctx, w, tok, opt.Workers, func(tokens []int32, textBytes int) error {
		if sw != nil && limit > 0 && sw.Header().Tokens+sepLen+int64(len(tokens)) > limit {
			if err := closeShard(); err != nil {
				return err
			}
		}
		if sw == nil {
			var err error
			if sw, err = CreateShard(next(), tok); err != nil {
				return err
			}
		}
		before := sw.Header().Tokens
		if err := sw.WriteDocument(tokens, textBytes); err != nil {
			return err
		}
		mu.Lock()
		if st.Documents > 0 {
			st.TextBytes++
		}
		st.Documents++
		st.TextBytes += int64(textBytes)
		st.Tokens += sw.Header().Tokens - before
		if sw.Header().Documents == 1 && len(st.Shards) > 0 {
			st.Tokens += sepLen // the separator LoadTokens puts between shards
		}
		mu.Unlock()
		if st.TextBytes-lastReport >= 1<<20 {
			lastReport = st.TextBytes
			report()
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if err := closeShard(); err != nil {
		return fail(err)
	}
	if !single {
		// the set's members, published with them (last, when the shards move one by one)
		if err := writeShardSet(filepath.Join(stage, "shards"), st.Shards, tok.Name()); err != nil {
			return fail(err)
		}
	}
	if st.Shards, err = publish(stage, st.Shards, opt.Out, single); err != nil {
		return fail(err)
	}
	report()
	return st, nil
}

// newStage makes the staging directory of out, .NAME.tokenize-HOST-PID beside it, after
// removing those that processes of this host that no longer run left (stale hears of each).
// Another process still writing out is an error.
func newStage(out string, stale func(string, int64)) (string, error) {
	out = filepath.Clean(out)
	host, _ := os.Hostname()
	host = strings.ReplaceAll(host, "-", "_")
	prefix := filepath.Join(filepath.Dir(out), "."+filepath.Base(out)+".tokenize-")
	old, _ := filepath.Glob(prefix + "*")
	for _, p := range old {
		h, pidText, _ := strings.Cut(strings.TrimPrefix(p, prefix), "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || h != host {
			continue // not one of ours, or another host's: not ours to judge
		}
		if alive(pid) {
			return "", fmt.Errorf("data: write shards: %s is being written by process %d (its staging directory %s exists); wait for it or write elsewhere", out, pid, p)
		}
		if stale != nil {
			stale(p, sysmem.TreeBytes(p))
		}
		if err := os.RemoveAll(p); err != nil {
			return "", fmt.Errorf("data: write shards: remove the partial output %s: %w", p, err)
		}
	}
	stage := fmt.Sprintf("%s%s-%d", prefix, host, os.Getpid())
	if err := os.MkdirAll(filepath.Dir(stage), 0o755); err != nil {
		return "", fmt.Errorf("data: write shards: %w", err)
	}
	if err := os.Mkdir(stage, 0o755); err != nil {
		return "", fmt.Errorf("data: write shards: %w", err)
	}
	if err := os.Mkdir(filepath.Join(stage, "shards"), 0o755); err != nil {
		os.Remove(stage)
		return "", fmt.Errorf("data: write shards: %w", err)
	}
	return stage, nil
}

// writtenFraction is the fraction of the input whose text the shards written hold, from the
// progress p and the text the walk has given (textRead, ahead of the writer by its queues):
// the input read scaled by the text written over the text read (so a compressed input counts
// its bytes on disk per byte of text), or the text written over maxBytes when that cuts the
// input.
func writtenFraction(p TokenizeProgress, textRead, maxBytes int64) float64 {
	if maxBytes > 0 && maxBytes < p.InputTotal {
		return float64(p.TextBytes) / float64(maxBytes)
	}
	if textRead == 0 || p.InputTotal == 0 {
		return 0
	}
	return float64(p.InputBytes) * float64(p.TextBytes) / float64(textRead) / float64(p.InputTotal)
}

// diskFull explains a write that filled the disk: how much was written, how much the shards
// need in all (given, the bytes the shards were given, over done, the fraction of the input
// whose text they were given), and what was free at the start.
func diskFull(out string, written, given int64, done float64, free int64, freeOK bool) error {
	had := "an unknown amount"
	if freeOK {
		had = fmt.Sprintf("%.1f MB", float64(free)/1e6)
	}
	need := "more"
	if done > 0 && done <= 1 {
		need = fmt.Sprintf("about %.1f MB in all (%.0f%% of the input is read)", float64(given)/done/1e6, 100*done)
	}
	return fmt.Errorf("disk full beside %s after %.1f MB of shards, which need %s; %s was free at the start; the partial shards are removed, nothing is at %s: free space or write elsewhere: %w",
		out, float64(written)/1e6, need, had, out, syscall.ENOSPC)
}

// alive reports whether process pid runs (on this host).
func alive(pid int) bool {
	p, err := os.FindProcess(pid)
	return err == nil && p.Signal(syscall.Signal(0)) == nil
}

// publish moves the complete shards from the staging directory to out and removes the
// staging directory; it returns the shards' new paths. A new or empty directory out is the
// staging directory's shards directory renamed (one step).
func publish(stage string, shards []string, out string, single bool) ([]string, error) {
	defer os.RemoveAll(stage)
	var moved []string
	if single {
		if err := os.Rename(shards[0], out); err != nil {
			return nil, fmt.Errorf("data: write shards: %w", err)
		}
		return []string{out}, nil
	}
	for _, p := range shards {
		moved = append(moved, filepath.Join(out, filepath.Base(p)))
	}
	if ents, err := os.ReadDir(out); err == nil && len(ents) == 0 {
		if err := os.Remove(out); err != nil {
			return nil, fmt.Errorf("data: write shards: %w", err)
		}
	}
	if err := os.Rename(filepath.Join(stage, "shards"), out); err == nil {
		return moved, nil
	}
	for i, p := range shards { // out holds other files: the shards one by one
		if err := os.Rename(p, moved[i]); err != nil {
			for _, q := range moved[:i] {
				os.Remove(q)
			}
			return nil, fmt.Errorf("data: write shards: %w", err)
		}
	}
	// the set's file last: with it in place, every shard it lists is
	if err := os.Rename(filepath.Join(stage, "shards", ShardSetFile), filepath.Join(out, ShardSetFile)); err != nil {
		return nil, fmt.Errorf("data: write shards: %w", err)
	}
	return moved, nil
}

// shardNamer checks out and returns the function that names each next shard.
func shardNamer(out string, single bool, shardTokens int64) (func() string, error) {
	if out == "" {
		return nil, fmt.Errorf("data: write shards: no output named: a directory, or a file ending in .tokens")
	}
	if single {
		if shardTokens != 0 {
			return nil, fmt.Errorf("data: write shards: %s names one shard file, so a shard size (%d tokens) does not apply; name a directory to split the tokens into shards", out, shardTokens)
		}
		if _, err := os.Lstat(out); err == nil {
			return nil, fmt.Errorf("data: write shards: %s exists; remove it or write elsewhere", out)
		}
		return func() string { return out }, nil
	}
	if fi, err := os.Stat(out); err == nil && !fi.IsDir() {
		return nil, fmt.Errorf("data: write shards: %s exists and is not a directory; name a new directory, or a file ending in .tokens", out)
	}
	old, err := filepath.Glob(filepath.Join(out, "*.tokens"))
	if err != nil {
		return nil, fmt.Errorf("data: write shards: %w", err)
	}
	if len(old) > 0 {
		return nil, fmt.Errorf("data: write shards: %s already holds %d token shards (%s, …); remove them or write elsewhere, so that old and new shards do not mix",
			out, len(old), filepath.Base(old[0]))
	}
	i := 0
	return func() string {
		p := filepath.Join(out, fmt.Sprintf("shard-%06d.tokens", i))
		i++
		return p
	}, nil
}
