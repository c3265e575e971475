package data

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
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
// It fails if opt.Out already holds shards. On any error, or when ctx is cancelled, the
// shards this call wrote are removed, so no partial set is left that could pass for a whole
// one.
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
		return st, fmt.Errorf("data: write shards: the source %s is already token shards (format \"tokens\"); tokenize the text, jsonl or c4 files they came from", src.Path)
	}
	if opt.ShardTokens < 0 {
		return st, fmt.Errorf("data: WriteShards: ShardTokens = %d: must be >= 0 (0 = %d)", opt.ShardTokens, DefaultShardTokens)
	}
	single := strings.HasSuffix(opt.Out, ".tokens")
	next, err := shardNamer(opt.Out, single, opt.ShardTokens)
	if err != nil {
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
	st.Files = len(w.files)
	for _, f := range w.files {
		if fi, err := os.Stat(f); err == nil {
			st.InputTotal += fi.Size()
		}
	}
	var mu sync.Mutex // InputBytes is counted on the walking goroutine
	w.onRead = func(n int64) {
		mu.Lock()
		st.InputBytes += n
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
	)
	fail := func(err error) (TokenizeStats, error) {
		if sw != nil {
			sw.Abort()
		}
		for _, p := range st.Shards {
			os.Remove(p)
		}
		return TokenizeStats{TokenizeProgress: st.TokenizeProgress}, err
	}
	err = encodeDocs(ctx, w, tok, opt.Workers, func(tokens []int32, textBytes int) error {
		if sw != nil && limit > 0 && sw.Header().Tokens+sepLen+int64(len(tokens)) > limit {
			if err := sw.Close(); err != nil {
				return err
			}
			st.Shards = append(st.Shards, sw.path)
			sw = nil
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
	if err := sw.Close(); err != nil {
		sw = nil
		return fail(err)
	}
	st.Shards = append(st.Shards, sw.path)
	report()
	return st, nil
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
		if dir := filepath.Dir(out); dir != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("data: write shards: %w", err)
			}
		}
		return func() string { return out }, nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("data: write shards: %w", err)
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
