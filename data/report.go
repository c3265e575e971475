package data

import (
	"fmt"
	"path/filepath"
	"time"
)

// What the progress reports of WriteShards and FetchC4 say to a person: how far a tokenize has
// read (TokenizeProgress.Read), its log line (Line) and its last one (TokenizeStats.Summary),
// and the lines of a fetch's log (FetchLog).

// Read is how far the tokenize has read, in bytes of its total: the files' bytes, or the text's
// when a MaxBytes (maxBytes, 0 for none) ends the read before the files end.
func (p TokenizeProgress) Read(maxBytes int64) (done, total int64) {
	if maxBytes > 0 && maxBytes < p.InputTotal {
		return p.TextBytes, maxBytes
	}
	return p.InputBytes, p.InputTotal
}

// FetchLog keeps the account of a FetchC4 for the lines of its log.
type FetchLog struct {
	Downloaded int64     // bytes downloaded, those of resumed downloads that were on disk not counted
	file       int       // the file being fetched, from 1 (0: none yet)
	began      time.Time // when it began
}

// Line is what the report p adds to the log: a retry, a file complete already, or a file
// downloaded and at what speed; "" when it adds nothing (the bytes of a file arriving).
func (l *FetchLog) Line(p FetchProgress) string {
	if p.Index+1 != l.file {
		l.file, l.began = p.Index+1, time.Now()
	}
	name := fmt.Sprintf("[%d/%d] %s", p.Index+1, p.Count, filepath.Base(p.File))
	switch {
	case p.Retry > 0:
		return fmt.Sprintf("%s: %v; retry %d of %d in %s", name, p.Err, p.Retry, p.Retries, p.Wait)
	case !p.Final:
		return ""
	case p.Skipped:
		return fmt.Sprintf("%s: complete already (%.1f MB)", name, float64(p.Done)/1e6)
	}
	got := p.Done - p.Resumed
	l.Downloaded += got
	secs := time.Since(l.began).Seconds()
	resumed := ""
	if p.Resumed > 0 {
		resumed = fmt.Sprintf(", resumed after %.1f MB", float64(p.Resumed)/1e6)
	}
	return fmt.Sprintf("%s: %.1f MB in %.1fs (%.1f MB/s%s)", name, float64(p.Done)/1e6, secs, float64(got)/1e6/secs, resumed)
}

// Line is a tokenize's log line after elapsed: documents, tokens, the input read, the rate.
func (p TokenizeProgress) Line(elapsed time.Duration) string {
	return fmt.Sprintf("tokenize: %s documents, %s tokens, %.1f of %.1f MB read (%.1f MB/s of text)",
		Count(p.Documents), Count(p.Tokens), float64(p.InputBytes)/1e6, float64(p.InputTotal)/1e6,
		float64(p.TextBytes)/1e6/elapsed.Seconds())
}

// Summary is what a tokenize into out that took elapsed did: what it read (maxBytes: the
// data.max_bytes that cut it, 0 for none), the tokens and shards written with the tokenizer
// named tok, and how fast.
func (st TokenizeStats) Summary(out, tok string, maxBytes int64, elapsed time.Duration) string {
	secs := elapsed.Seconds()
	where := out
	if len(st.Shards) == 1 {
		where = st.Shards[0]
	}
	files := fmt.Sprintf("%d files", st.Files)
	if st.FilesRead < st.Files {
		files = fmt.Sprintf("%d of %d files (data.max_bytes = %d)", st.FilesRead, st.Files, maxBytes)
	}
	return fmt.Sprintf("tokenized %s documents from %s, %.1f MB of text, into %s tokens (tokenizer %s) in %d shards in %s: %.1fs, %.1f MB/s of text, %s tokens/s",
		Count(st.Documents), files, float64(st.TextBytes)/1e6, Count(st.Tokens), tok, len(st.Shards), where,
		secs, float64(st.TextBytes)/1e6/secs, Count(int64(float64(st.Tokens)/secs)))
}

// Count writes a count of tokens, documents or parameters short: 6.74B, 524.29K, 1234.
func Count(n int64) string {
	switch x := float64(n); {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", x/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", x/1e6)
	case n >= 1e4:
		return fmt.Sprintf("%.1fK", x/1e3)
	}
	return fmt.Sprint(n)
}
